"""Durable collection reconciliations (spec section 6).

EmDash's `MediaUsageReconciliationRepository`: one method per guarded statement, with the
seed's guards composed from two named predicates, `live_claim_exists` (this lease still owns
the coordinator row) and `predicates.status_owns_run` (the coverage status is running for this
run at this epoch). Reconciliation leases are live while `lease_expires_at` is after
*statement* time, as in the seed.

Beyond the seed (each says so in its docstring):
- `renew_lease`: a Dagster step keeps its claim across several pages.
- `find_stuck_failed`, `pin_stuck_failed_epoch`, `reset_stuck_failed`: healing of the seed's
  stuck state (spec 6.4), where a terminal failure recorded while nobody owned coverage leaves
  `target_epoch` NULL, so `reset_failed_for_new_epoch` can never match and seeding skips the
  collection for ever.
- `retry_failed_by_operator`: an operator retry, which EmDash does not offer for reconciliations.
- `resume_retry_now`: an operator's re-execution from the failed step resumes a retrying run.
- `find_by_collection`, `find_coverage`, `seed_collection`, `request_full_reconciliation`,
  `delete_one_obsolete_collection`, `holds_live_claim`: reconciling one named collection (a
  partitioned run or an operator's forced run) step by step, and reporting which collection a
  tick touched.

How the stuck state heals automatically: the seed's reset waits until the status epoch moves
past the epoch the failure was judged at, so a deterministic failure does not loop. A NULL
target has no such epoch, so `pin_stuck_failed_epoch` records the status epoch observed while
nobody owns coverage as the row's `target_epoch`. From then on the row is an ordinary seed
failure: `find_failed` lists it once `change_epoch` moves past the pin and
`reset_failed_for_new_epoch` reopens it (EmDash itself would heal it the same way). Intended
use: pin right after a terminal failure that `finish_failed_coverage` could not publish, and
let the maintenance tick pin whatever `find_stuck_failed` still lists (a crash in between).
`find_failed` itself stays exactly the seed's: listing target-less rows at once would reopen a
deterministic failure on every tick.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Self

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Select,
    Text,
    and_,
    bindparam,
    case,
    column,
    delete,
    exists,
    false,
    func,
    literal,
    or_,
    select,
    table,
    tuple_,
    update,
)
from sqlalchemy.sql.elements import ColumnElement
from ulid import ULID

from media_usage_orchestration.store.core.clock import (
    lease_live_at_statement,
    now,
    timestamp_offset,
    validate_duration,
)
from media_usage_orchestration.store.core.engine import (
    guarded_writes_together,
    is_postgres,
    read_transaction,
    single_statement,
)
from media_usage_orchestration.store.core.id_lists import in_text_list
from media_usage_orchestration.store.core.leases import (
    LeaseState,
    bounded_limit,
    due_candidates_statement,
    is_claimable,
    is_reopenable_by_operator,
    non_negative_whole,
    positive_whole,
)
from media_usage_orchestration.store.core.predicates import (
    activation_is_active,
    is_content_collection_status,
    no_deletion_tombstone,
    registry_identity_is_current,
    status_owns_run,
)
from media_usage_orchestration.store.core.schema import (
    dialect_insert,
    index_status,
    narrow,
    reconciliations,
    sources,
    work,
)
from media_usage_orchestration.store.work import enqueue_page_parameters, enqueue_page_statement
from media_usage_orchestration.values.identifiers import (
    content_table_name,
    require_text,
    validate_error_code,
)
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome
from media_usage_orchestration.values.records import optional, record_from_row
from media_usage_orchestration.values.source_records import (
    CANONICAL_IDENTITY_VERSION,
    SOURCE_TYPE_CONTENT,
)

MAX_CANDIDATES = 100
MAX_PAGE_SIZE = 50
# EmDash's reconciliation lease (spec 6.1).
DEFAULT_LEASE_SECONDS = 60
ENTRY_FAILED_CODE = "MEDIA_USAGE_RECONCILIATION_ENTRY_FAILED"
PROCESSING_FAILED_CODE = "MEDIA_USAGE_PROCESSING_FAILED"
NON_TERMINAL_ATTEMPT_CEILING = 4

IDENTITY_MESSAGE = "Reconciliation requires an exact collection and run token"
LIFECYCLE_MESSAGE = "Invalid media usage reconciliation lifecycle"


class ReconciliationPhase(StrEnum):
    SCAN = "scan"
    SOURCES = "sources"


class WorkBarrierState(StrEnum):
    EMPTY = "empty"
    PENDING = "pending"
    FAILED = "failed"


@dataclass(frozen=True)
class ReconciliationRecord:
    collection_id: str
    collection_slug: str
    run_token: str
    target_epoch: int | None
    field_fingerprint: str | None
    state: LeaseState
    phase: ReconciliationPhase
    scan_cursor: str | None
    scan_upper_id: str | None
    source_cursor: str | None
    source_upper_key: str | None
    attempt_count: int
    next_attempt_at: str
    lease_token: str | None
    lease_expires_at: str | None
    last_error_code: str | None
    created_at: str
    updated_at: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        return record_from_row(cls, row, **_ROW_CONVERTERS)


@dataclass(frozen=True)
class ReconciliationClaim(ReconciliationRecord):
    """A record returned by `claim`: its lease token is the caller's proof of ownership."""

    lease_token: str


@dataclass(frozen=True)
class SourceCandidate:
    source_key: str
    content_id: str | None
    source_variant: str


@dataclass(frozen=True)
class PageCheckpoint:
    """What a page written in one go left on the coordinator (its cursor and lease expiry)
    and how many work rows it inserted or reopened."""

    cursor: str
    lease_expires_at: str
    enqueued: int = 0


@dataclass(frozen=True)
class WorkBarrier:
    state: WorkBarrierState
    error_code: str | None = None


@dataclass(frozen=True)
class Coverage:
    """The parts of a collection's status row that decide whether it can be reconciled."""

    status: str
    capture_state: str | None
    reconciliation_required: int
    cursor: str | None
    change_epoch: int


@dataclass(frozen=True)
class OperatorRetryResult:
    outcome: OperatorRetryOutcome
    record: ReconciliationRecord | None = None
    lease_expires_at: str | None = None

    @property
    def changed(self) -> bool:
        return self.outcome is OperatorRetryOutcome.PENDING


# --- rows and input ----------------------------------------------------------------------------


def _lifecycle(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        try:
            return parse(value)
        except ValueError:
            raise ValueError(LIFECYCLE_MESSAGE) from None

    return convert


def _attempt_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(LIFECYCLE_MESSAGE)
    return value


# A row in a state, phase or attempt count the lifecycle does not know is refused.
_ROW_CONVERTERS = {
    "state": _lifecycle(LeaseState),
    "phase": _lifecycle(ReconciliationPhase),
    "attempt_count": _attempt_count,
    "target_epoch": optional(int),
}


def _require_identity(collection_id: object, run_token: object) -> None:
    require_text(collection_id, IDENTITY_MESSAGE)
    require_text(run_token, IDENTITY_MESSAGE)


def _require_claim(claim: ReconciliationRecord) -> None:
    """A claim names its exact coordinator row, collection slug and lease."""
    if not isinstance(claim, ReconciliationRecord):
        raise ValueError("Reconciliation requires a claimed reconciliation record")
    _require_identity(claim.collection_id, claim.run_token)
    require_text(claim.collection_slug, "Reconciliation requires an exact collection slug")
    require_text(claim.lease_token, "Reconciliation requires a lease token")


def _epoch(value: int | str, label: str = "Reconciliation target epoch") -> int:
    return non_negative_whole(value, label)


def _candidate_limit(limit: int) -> int:
    return bounded_limit(
        limit, 1, MAX_CANDIDATES, "Reconciliation candidate limit must be from 1 to 100"
    )


def _page_limit(limit: int, kind: str) -> int:
    return bounded_limit(
        limit, 1, MAX_PAGE_SIZE, f"Reconciliation {kind} page limit must be from 1 to 50"
    )


def _cursor(value: object, label: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"Reconciliation {label} must be text or None")
    return value or None


# --- named predicates ----------------------------------------------------------------------------


_CLAIMED_ROW = narrow(
    reconciliations,
    "collection_id",
    "collection_slug",
    "run_token",
    "state",
    "lease_token",
    "lease_expires_at",
)


def live_claim_exists(claim: ReconciliationRecord) -> ColumnElement[bool]:
    """The claim's lease still holds the coordinator row of a current, active, undeleted
    collection. Reads and writes outside the row itself carry it, so a fenced owner sees
    nothing and changes nothing."""
    reconciliation = _CLAIMED_ROW.alias("reconciliation")
    return exists(
        select(literal(1))
        .select_from(reconciliation)
        .where(
            registry_identity_is_current(
                reconciliation.c.collection_id, reconciliation.c.collection_slug
            ),
            reconciliation.c.collection_id == claim.collection_id,
            reconciliation.c.collection_slug == claim.collection_slug,
            reconciliation.c.run_token == claim.run_token,
            reconciliation.c.state == LeaseState.LEASED.value,
            reconciliation.c.lease_token == claim.lease_token,
            lease_live_at_statement(reconciliation.c.lease_expires_at),
            activation_is_active(),
            no_deletion_tombstone(reconciliation.c.collection_id),
        )
    )


def _status_owns_claimed_run(claim, target_epoch) -> ColumnElement[bool]:
    return status_owns_run(
        claim.collection_id, claim.collection_slug, claim.run_token, target_epoch
    )


def _holds_lease(collection_id: str, run_token: str, lease_token: str) -> ColumnElement[bool]:
    """The row-level lease guard of every transition of the coordinator row itself."""
    return and_(
        reconciliations.c.collection_id == collection_id,
        reconciliations.c.run_token == run_token,
        reconciliations.c.state == LeaseState.LEASED.value,
        reconciliations.c.lease_token == lease_token,
        lease_live_at_statement(reconciliations.c.lease_expires_at),
    )


def _claim_holds_lease(claim: ReconciliationRecord) -> ColumnElement[bool]:
    return _holds_lease(claim.collection_id, claim.run_token, claim.lease_token)


def _status_is_claim_target(claim: ReconciliationRecord) -> ColumnElement[bool]:
    """begin/restart may only take an active, untrusted status that nobody else is running."""
    return and_(
        is_content_collection_status(),
        index_status.c.collection_id == claim.collection_id,
        index_status.c.scope_key == claim.collection_slug,
        index_status.c.capture_state == "active",
        index_status.c.reconciliation_required == 1,
        or_(index_status.c.status != "running", index_status.c.cursor == claim.run_token),
        live_claim_exists(claim),
    )


def _no_work_rows(collection_id: str) -> ColumnElement[bool]:
    """Coverage cannot advance while any work (enqueued or captured) is outstanding."""
    pending = work.alias("work")
    return ~exists(
        select(pending.c.content_id).where(pending.c.collection_id == collection_id).correlate(None)
    )


def _canonical_sources(collection_id: str, source=sources):
    return and_(
        source.c.source_type == SOURCE_TYPE_CONTENT,
        source.c.collection_id == collection_id,
        source.c.identity_version == CANONICAL_IDENTITY_VERSION,
    )


def _unowned_status_for_row() -> Any:
    """Active status rows with untrusted coverage and no owner, matched to the row's identity."""
    status = index_status.alias("status")
    return status, and_(
        status.c.collection_id == reconciliations.c.collection_id,
        status.c.scope_key == reconciliations.c.collection_slug,
        is_content_collection_status(status),
        status.c.capture_state == "active",
        status.c.reconciliation_required == 1,
        status.c.cursor.is_(None),
    )


def needs_reconciliation_row(status) -> ColumnElement[bool]:
    """The status row (an alias of the status table) is a current, active, undeleted
    collection's untrusted coverage, and the collection has no coordinator row yet: seeding
    inserts one for it."""
    existing = reconciliations.alias("existing")
    return and_(
        is_content_collection_status(status),
        status.c.capture_state == "active",
        status.c.reconciliation_required == 1,
        status.c.collection_id.is_not(None),
        registry_identity_is_current(status.c.collection_id, status.c.scope_key),
        activation_is_active(),
        ~exists(
            select(literal(1))
            .select_from(existing)
            .where(existing.c.collection_id == status.c.collection_id)
        ),
        no_deletion_tombstone(status.c.collection_id),
    )


_RESET_VALUES: dict[str, Any] = {
    "state": LeaseState.PENDING.value,
    "phase": ReconciliationPhase.SCAN.value,
    "target_epoch": None,
    "field_fingerprint": None,
    "scan_cursor": None,
    "scan_upper_id": None,
    "source_cursor": None,
    "source_upper_key": None,
    "attempt_count": 0,
    "lease_token": None,
    "lease_expires_at": None,
    "last_error_code": None,
}


def _reset_values() -> dict[str, Any]:
    """A fresh scan under the same run token (the seed's `resetFailedForNewEpoch` columns)."""
    return {**_RESET_VALUES, "next_attempt_at": now(), "updated_at": now()}


# --- statements exposed for plans and tests ----------------------------------------------------


def find_due_statement(limit: int) -> Select:
    """One statement: due pending, due retry and lease-expired rows, each bounded, then merged
    (the seed's three CTEs, so each branch walks its own index)."""
    return due_candidates_statement(reconciliations, _candidate_limit(limit))


def find_failed_statement(limit: int) -> Select:
    """`find_failed`'s rows, oldest first (the maintenance probe asks for one)."""
    reconciliation = reconciliations.alias("reconciliation")
    status = index_status.alias("status")
    return (
        select(reconciliation)
        .join(
            status,
            and_(
                status.c.collection_id == reconciliation.c.collection_id,
                status.c.scope_key == reconciliation.c.collection_slug,
            ),
        )
        .where(
            reconciliation.c.state == LeaseState.FAILED.value,
            is_content_collection_status(status),
            or_(
                status.c.reconciliation_required == 0,
                and_(
                    status.c.status == "running",
                    status.c.cursor == reconciliation.c.run_token,
                ),
                and_(
                    status.c.cursor.is_(None),
                    status.c.change_epoch > reconciliation.c.target_epoch,
                ),
            ),
        )
        .order_by(reconciliation.c.updated_at, reconciliation.c.collection_id)
        .limit(limit)
    )


def find_stuck_failed_statement(limit: int) -> Select:
    """`find_stuck_failed`'s rows, oldest first (the maintenance probe asks for one)."""
    status, unowned = _unowned_status_for_row()
    return (
        select(reconciliations)
        .where(
            reconciliations.c.state == LeaseState.FAILED.value,
            reconciliations.c.target_epoch.is_(None),
            exists(select(status.c.collection_id).where(unowned)),
        )
        .order_by(reconciliations.c.updated_at, reconciliations.c.collection_id)
        .limit(limit)
    )


def seed_next_candidate_statement(
    connection: Connection, run_token: str, collection_id: str | None = None
):
    """INSERT ... SELECT the lowest eligible collection id, ON CONFLICT DO NOTHING; with
    `collection_id`, the same guarded insert for that collection only."""
    status = index_status.alias("status")
    candidate = (
        select(status.c.collection_id, status.c.scope_key, literal(run_token), now(), now())
        .where(needs_reconciliation_row(status))
        .order_by(status.c.collection_id)
        .limit(1)
    )
    if collection_id is not None:
        candidate = candidate.where(status.c.collection_id == collection_id)
    columns = ["collection_id", "collection_slug", "run_token", "next_attempt_at", "updated_at"]
    return (
        dialect_insert(connection, reconciliations)
        .from_select(columns, candidate)
        .on_conflict_do_nothing(index_elements=[reconciliations.c.collection_id])
        .returning(reconciliations.c.collection_id)
    )


# --- statements built once ----------------------------------------------------------------------


@dataclass(frozen=True)
class _BoundClaim:
    """A claim whose identity is bound parameters: the per-page statements below are built
    from the same named predicates once, then executed with `_claim_parameters(claim)`."""

    collection_id: Any
    collection_slug: Any
    run_token: Any
    lease_token: Any


_BOUND_CLAIM = _BoundClaim(
    bindparam("claim_collection_id", type_=Text),
    bindparam("claim_collection_slug", type_=Text),
    bindparam("claim_run_token", type_=Text),
    bindparam("claim_lease_token", type_=Text),
)
_BOUND_EPOCH = bindparam("claim_target_epoch", type_=BigInteger)
_BOUND_CURSOR = bindparam("page_cursor", type_=Text)
_BOUND_UPPER = bindparam("page_upper", type_=Text)


@dataclass(frozen=True)
class _PageWrite:
    """A page to read and checkpoint in one go: its validated size, whether the walk has a
    cursor yet, and the statement's claim, epoch and bound parameters."""

    limit: int
    has_previous: bool
    parameters: dict[str, Any]

    @classmethod
    def of(
        cls,
        claim: ReconciliationRecord,
        reconciliation: ReconciliationRecord,
        phase: ReconciliationPhase,
        limit: int,
        lease_seconds: int,
    ) -> Self | None:
        """None when the walk has no upper bound: nothing to walk."""
        scan = phase is ReconciliationPhase.SCAN
        limit = _page_limit(limit, "scan" if scan else "source")
        _require_claim(claim)
        epoch = _epoch(reconciliation.target_epoch)
        validate_duration(lease_seconds, "Reconciliation lease duration", allow_zero=False)
        if scan:
            previous, upper = reconciliation.scan_cursor, reconciliation.scan_upper_id
        else:
            previous, upper = reconciliation.source_cursor, reconciliation.source_upper_key
        previous = _cursor(previous, "previous cursor")
        upper = _cursor(upper, "page upper bound")
        if upper is None:
            return None
        bounds = {"previous_cursor": previous, _BOUND_CURSOR.key: previous, _BOUND_UPPER.key: upper}
        parameters = _claim_parameters(claim, **{_BOUND_EPOCH.key: epoch}, **bounds)
        return cls(limit, previous is not None, parameters)


def _claim_parameters(claim: ReconciliationRecord, **extra: Any) -> dict[str, Any]:
    bound = {
        _BOUND_CLAIM.collection_id.key: claim.collection_id,
        _BOUND_CLAIM.collection_slug.key: claim.collection_slug,
        _BOUND_CLAIM.run_token.key: claim.run_token,
        _BOUND_CLAIM.lease_token.key: claim.lease_token,
    }
    return {**bound, **extra}


@functools.lru_cache(maxsize=4)
def _owns_run_statement():
    return select(_status_owns_claimed_run(_BOUND_CLAIM, _BOUND_EPOCH))


def _renewed_expiry(lease_seconds: int) -> ColumnElement:
    """The lease expiry after a guarded write that renews: `lease_seconds` from now once more
    than half of it has elapsed (database time), otherwise as it is. A lease of a minute
    renewed on every page of a few milliseconds would cost a write of its own each time."""
    half = (lease_seconds + 1) // 2
    return case(
        (
            reconciliations.c.lease_expires_at < timestamp_offset(half),
            timestamp_offset(lease_seconds),
        ),
        else_=reconciliations.c.lease_expires_at,
    )


@functools.lru_cache(maxsize=16)
def _renew_statement(lease_seconds: int):
    return (
        update(reconciliations)
        .where(_claim_holds_lease(_BOUND_CLAIM))
        .values(lease_expires_at=_renewed_expiry(lease_seconds), updated_at=now())
        .returning(reconciliations.c.lease_expires_at)
    )


def _page_cursor(phase: ReconciliationPhase) -> Any:
    if phase is ReconciliationPhase.SCAN:
        return reconciliations.c.scan_cursor
    return reconciliations.c.source_cursor


def _checkpoint_guards(phase: ReconciliationPhase, has_previous: bool) -> tuple:
    """A page checkpoint's guards: the claim's lease, its run's epoch and phase, the status
    it owns, and a compare-and-set on the cursor (`previous_cursor`), so that a replayed or
    concurrent page cannot move it twice."""
    cursor = _page_cursor(phase)
    observed = (
        cursor == bindparam("previous_cursor", type_=Text) if has_previous else cursor.is_(None)
    )
    return (
        _claim_holds_lease(_BOUND_CLAIM),
        reconciliations.c.target_epoch == _BOUND_EPOCH,
        reconciliations.c.phase == phase.value,
        _status_owns_claimed_run(_BOUND_CLAIM, _BOUND_EPOCH),
        observed,
    )


def _checkpoint_update(
    phase: ReconciliationPhase, has_previous: bool, lease_seconds: int, next_cursor: Any, *also
):
    """The page checkpoint: the cursor moves to `next_cursor`, attempts reset, the lease
    renewed past its half (one write per page for the row), under `_checkpoint_guards` and
    `also`; returns the cursor and the lease's expiry."""
    cursor = _page_cursor(phase)
    return (
        update(reconciliations)
        .where(*_checkpoint_guards(phase, has_previous), *also)
        .values(
            {
                cursor.key: next_cursor,
                "attempt_count": 0,
                "last_error_code": None,
                "lease_expires_at": _renewed_expiry(lease_seconds),
                "updated_at": now(),
            }
        )
        .returning(cursor, reconciliations.c.lease_expires_at)
    )


@functools.lru_cache(maxsize=16)
def _checkpoint_statement(phase: ReconciliationPhase, has_previous: bool, lease_seconds: int):
    next_cursor = bindparam("next_cursor", type_=Text)
    return _checkpoint_update(phase, has_previous, lease_seconds, next_cursor)


def _page_relation(dialect_name: str, page: Select, name: str):
    """A page read inside the statement that writes it: a CTE on PostgreSQL, where the page
    feeds data-modifying CTEs and is read once; a subquery on SQLite."""
    return page.cte(name) if dialect_name == "postgresql" else page.subquery(name)


@functools.lru_cache(maxsize=64)
def _write_scan_page_statements(
    dialect_name: str, collection_slug: str, has_cursor: bool, limit: int, lease_seconds: int
) -> tuple:
    """The next scan page enqueued and checkpointed together: on PostgreSQL one statement
    (the checkpoint a data-modifying CTE, the enqueue another that writes only if the
    checkpoint did); on SQLite the checkpoint, then the enqueue, in one transaction."""
    content = _content(collection_slug)
    bounds = [content.c.id <= _BOUND_UPPER]
    if has_cursor:
        bounds.append(content.c.id > _BOUND_CURSOR)
    read = select(content.c.id.label("content_id")).where(*bounds).order_by(content.c.id)
    page = _page_relation(dialect_name, read.limit(limit), "scan_page")
    last = select(func.max(page.c.content_id)).scalar_subquery()
    not_empty = exists(select(literal(1)).select_from(page))
    checkpoint = _checkpoint_update(
        ReconciliationPhase.SCAN,
        has_cursor,
        lease_seconds,
        last,
        live_claim_exists(_BOUND_CLAIM),
        not_empty,
    )
    if dialect_name != "postgresql":
        enqueue = enqueue_page_statement(dialect_name, page.c.content_id)
        return checkpoint, enqueue.returning(work.c.content_id)
    written = checkpoint.cte("scan_checkpoint")
    checkpointed = exists(select(literal(1)).select_from(written))
    enqueue = enqueue_page_statement(dialect_name, page.c.content_id, checkpointed)
    enqueued = enqueue.returning(work.c.content_id).cte("scan_enqueue")
    count_enqueued = select(func.count()).select_from(enqueued).scalar_subquery()
    return (select(written.c.scan_cursor, written.c.lease_expires_at, count_enqueued),)


@functools.lru_cache(maxsize=16)
def _clean_source_page_statement(
    dialect_name: str,
    collection_slug: str,
    has_cursor: bool,
    limit: int,
    lease_seconds: int,
    variants: tuple[str, ...],
):
    """The source page checkpointed, only if each of its sources is valid and its entry's
    content row exists: a page with nothing to enqueue, the usual one when fields extract."""
    bounds = [_canonical_sources(_BOUND_CLAIM.collection_id), sources.c.source_key <= _BOUND_UPPER]
    if has_cursor:
        bounds.append(sources.c.source_key > _BOUND_CURSOR)
    read = (
        select(sources.c.source_key, sources.c.content_id, sources.c.source_variant)
        .where(*bounds)
        .order_by(sources.c.source_key)
    )
    page = _page_relation(dialect_name, read.limit(limit), "source_page")
    content = _content(collection_slug)
    needs_more = or_(
        page.c.content_id.is_(None),
        page.c.content_id == "",
        page.c.source_variant.is_(None),
        page.c.source_variant.not_in(variants),
        ~exists(select(literal(1)).where(content.c.id == page.c.content_id)),
    )
    return _checkpoint_update(
        ReconciliationPhase.SOURCES,
        has_cursor,
        lease_seconds,
        select(func.max(page.c.source_key)).scalar_subquery(),
        live_claim_exists(_BOUND_CLAIM),
        exists(select(literal(1)).select_from(page)),
        ~exists(select(literal(1)).select_from(page).where(needs_more)),
    )


@functools.lru_cache(maxsize=64)
def _scan_page_statement(
    collection_slug: str, has_cursor: bool, has_upper: bool, limit: int, guarded: bool
):
    content = _content(collection_slug)
    bounds = [live_claim_exists(_BOUND_CLAIM)] if guarded else []
    if has_cursor:
        bounds.append(content.c.id > _BOUND_CURSOR)
    # No upper id means the collection had no media fields: nothing to scan.
    bounds.append(content.c.id <= _BOUND_UPPER if has_upper else false())
    return select(content.c.id).where(*bounds).order_by(content.c.id).limit(limit)


@functools.lru_cache(maxsize=16)
def _source_page_statement(has_cursor: bool, has_upper: bool, limit: int):
    bounds = [
        _canonical_sources(_BOUND_CLAIM.collection_id),
        live_claim_exists(_BOUND_CLAIM),
        _status_owns_claimed_run(_BOUND_CLAIM, _BOUND_EPOCH),
    ]
    if has_cursor:
        bounds.append(sources.c.source_key > _BOUND_CURSOR)
    bounds.append(sources.c.source_key <= _BOUND_UPPER if has_upper else false())
    return (
        select(sources.c.source_key, sources.c.content_id, sources.c.source_variant)
        .where(*bounds)
        .order_by(sources.c.source_key)
        .limit(limit)
    )


# --- repository ---------------------------------------------------------------------------------


class ReconciliationRepository:
    """EmDash's `MediaUsageReconciliationRepository`; each method is one transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _write(self, statement) -> bool:
        with single_statement(self.engine) as connection:
            return connection.execute(statement).rowcount == 1

    def _returning(self, statement) -> Any:
        with single_statement(self.engine) as connection:
            return connection.execute(statement).first()

    # -- reads -----------------------------------------------------------------------------------

    def find_by_identity(self, collection_id: str, run_token: str) -> ReconciliationRecord | None:
        _require_identity(collection_id, run_token)
        with read_transaction(self.engine) as connection:
            row = connection.execute(
                select(reconciliations).where(
                    reconciliations.c.collection_id == collection_id,
                    reconciliations.c.run_token == run_token,
                )
            ).first()
        return ReconciliationRecord.from_row(row._mapping) if row is not None else None

    def find_by_collection(self, collection_id: str) -> ReconciliationRecord | None:
        """Beyond the seed: the coordinator of a collection, whatever its run token (a
        collection has at most one)."""
        require_text(collection_id, "Reconciliation lookup requires a collection ID")
        with read_transaction(self.engine) as connection:
            row = connection.execute(
                select(reconciliations).where(reconciliations.c.collection_id == collection_id)
            ).first()
        return ReconciliationRecord.from_row(row._mapping) if row is not None else None

    def find_all(self) -> list[ReconciliationRecord]:
        """Beyond the seed: every collection's coordinator (at most one each), by slug, for
        operators."""
        statement = select(reconciliations).order_by(
            reconciliations.c.collection_slug, reconciliations.c.collection_id
        )
        with read_transaction(self.engine) as connection:
            return [
                ReconciliationRecord.from_row(row._mapping) for row in connection.execute(statement)
            ]

    def find_coverage(self, collection_id: str) -> Coverage | None:
        """Beyond the seed: the content-media status row of a collection, to explain why a
        collection cannot be claimed."""
        require_text(collection_id, "Reconciliation lookup requires a collection ID")
        statement = select(
            index_status.c.status,
            index_status.c.capture_state,
            index_status.c.reconciliation_required,
            index_status.c.cursor,
            index_status.c.change_epoch,
        ).where(is_content_collection_status(), index_status.c.collection_id == collection_id)
        with read_transaction(self.engine) as connection:
            row = connection.execute(statement).first()
        if row is None:
            return None
        return record_from_row(
            Coverage, row._mapping, reconciliation_required=int, change_epoch=int
        )

    def find_due(self, limit: int) -> list[ReconciliationRecord]:
        statement = find_due_statement(limit)
        with read_transaction(self.engine) as connection:
            return [
                ReconciliationRecord.from_row(row._mapping) for row in connection.execute(statement)
            ]

    def find_failed(self, limit: int) -> list[ReconciliationRecord]:
        """Failed rows whose outcome can now be published or reset: coverage was completed by
        someone else, this run still owns a running status, or the epoch moved past the one the
        row failed at (never a row without one: see `find_stuck_failed`)."""
        statement = find_failed_statement(_candidate_limit(limit))
        with read_transaction(self.engine) as connection:
            return [
                ReconciliationRecord.from_row(row._mapping) for row in connection.execute(statement)
            ]

    def owns_run(self, claim: ReconciliationRecord, target_epoch: int | str) -> bool:
        _require_identity(claim.collection_id, claim.run_token)
        epoch = _epoch(target_epoch)
        parameters = _claim_parameters(claim, **{_BOUND_EPOCH.key: epoch})
        with read_transaction(self.engine) as connection:
            owned = connection.execute(_owns_run_statement(), parameters).scalar()
        return bool(owned)

    def holds_live_claim(self, claim: ReconciliationRecord) -> bool:
        """Beyond the seed: `live_claim_exists` as a read, so a step can tell "nothing left
        to page" from "the guarded page read saw nothing because the lease is gone"."""
        _require_claim(claim)
        with read_transaction(self.engine) as connection:
            return bool(connection.execute(select(live_claim_exists(claim))).scalar())

    def find_work_barrier(self, collection_id: str) -> WorkBarrier:
        """Counts every work row of the collection, captured ones included."""
        require_text(collection_id, "Reconciliation work barrier requires a collection ID")
        with read_transaction(self.engine) as connection:
            failed = connection.execute(
                select(work.c.last_error_code)
                .where(work.c.collection_id == collection_id, work.c.state == "failed")
                # The same order as by `content_id`, but one no index provides: ordered by the
                # primary key, SQLite would walk every work row of the collection to find a
                # failed one (once per drained batch); this way it reads only failed rows.
                .order_by(work.c.content_id.concat(""))
                .limit(1)
            ).first()
            if failed is not None:
                code = failed.last_error_code or PROCESSING_FAILED_CODE
                return WorkBarrier(WorkBarrierState.FAILED, code)
            pending = connection.execute(
                select(work.c.content_id).where(work.c.collection_id == collection_id).limit(1)
            ).first()
        return WorkBarrier(WorkBarrierState.PENDING if pending else WorkBarrierState.EMPTY)

    # -- scan ------------------------------------------------------------------------------------

    def find_scan_upper_id(self, claim: ReconciliationRecord) -> str | None:
        """The highest content id at run start: entries created later are captured by triggers."""
        content = _content(claim.collection_slug)
        _require_claim(claim)
        statement = (
            select(content.c.id)
            .where(live_claim_exists(claim))
            .order_by(content.c.id.desc())
            .limit(1)
        )
        with read_transaction(self.engine) as connection:
            return connection.execute(statement).scalar()

    def find_scan_page(
        self, reconciliation: ReconciliationRecord, limit: int, *, guarded: bool = True
    ) -> list[str]:
        """The next page of content ids after the scan cursor, seen only while the claim's
        lease holds the row. Unguarded (`guarded=False`) only inside the page's transaction,
        whose enqueue and checkpoint carry the lease's guards and refuse when it is lost."""
        limit = _page_limit(limit, "scan")
        content_table_name(reconciliation.collection_slug)  # a bad slug fails before any SQL
        if not reconciliation.lease_token or reconciliation.target_epoch is None:
            return []
        _require_claim(reconciliation)
        cursor, upper = reconciliation.scan_cursor, reconciliation.scan_upper_id
        statement = _scan_page_statement(
            reconciliation.collection_slug, bool(cursor), bool(upper), limit, guarded
        )
        parameters = _claim_parameters(
            reconciliation, **{_BOUND_CURSOR.key: cursor, _BOUND_UPPER.key: upper}
        )
        with read_transaction(self.engine) as connection:
            return list(connection.execute(statement, parameters).scalars())

    def begin_run(self, claim: ReconciliationRecord) -> int | None:
        """Take the coverage status for this run; the epoch moves unless this run already
        holds it (a resumed first step keeps its epoch and start time)."""
        _require_claim(claim)
        same_run = and_(
            index_status.c.status == "running", index_status.c.cursor == claim.run_token
        )
        return self._take_status(claim, same_run, indexed_source_count=0, failed_source_count=0)

    def _take_status(
        self, claim: ReconciliationRecord, keeps_epoch: ColumnElement[bool], **extra: Any
    ) -> int | None:
        """Make the claim's run the running owner of its status; where `keeps_epoch` holds,
        the epoch and start time stay as they are, otherwise the epoch moves."""
        statement = (
            update(index_status)
            .where(_status_is_claim_target(claim))
            .values(
                status="running",
                started_at=case((keeps_epoch, index_status.c.started_at), else_=now()),
                completed_at=None,
                cursor=claim.run_token,
                last_error_code=None,
                change_epoch=case(
                    (keeps_epoch, index_status.c.change_epoch),
                    else_=index_status.c.change_epoch + 1,
                ),
                reconciliation_required=1,
                updated_at=now(),
                **extra,
            )
            .returning(index_status.c.change_epoch)
        )
        row = self._returning(statement)
        return int(row.change_epoch) if row is not None else None

    def initialize_scan(
        self,
        claim: ReconciliationRecord,
        target_epoch: int | str,
        field_fingerprint: str,
        scan_upper_id: str | None,
    ) -> bool:
        _require_claim(claim)
        return self._start_scan(
            claim,
            reconciliations.c.target_epoch.is_(None),
            target_epoch,
            field_fingerprint,
            scan_upper_id,
        )

    def _start_scan(
        self,
        claim: ReconciliationRecord,
        pinned_epoch: ColumnElement[bool],
        target_epoch: int | str,
        field_fingerprint: str,
        scan_upper_id: str | None,
        **extra: Any,
    ) -> bool:
        """Pin the run's epoch, fields and scan bound on the coordinator and start its scan,
        while the row's current pin matches `pinned_epoch` and the run owns its status."""
        epoch = _epoch(target_epoch)
        require_text(field_fingerprint, "Reconciliation requires a field fingerprint")
        scan_upper_id = _cursor(scan_upper_id, "scan upper id")
        statement = (
            update(reconciliations)
            .where(_claim_holds_lease(claim), pinned_epoch, _status_owns_claimed_run(claim, epoch))
            .values(
                target_epoch=epoch,
                field_fingerprint=field_fingerprint,
                phase=ReconciliationPhase.SCAN.value,
                scan_cursor=None,
                scan_upper_id=scan_upper_id,
                source_cursor=None,
                source_upper_key=None,
                attempt_count=0,
                last_error_code=None,
                updated_at=now(),
                **extra,
            )
        )
        return self._write(statement)

    def checkpoint_scan(
        self,
        claim: ReconciliationRecord,
        target_epoch: int | str,
        previous_cursor: str | None,
        next_cursor: str,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ) -> str | None:
        return self._checkpoint(
            claim,
            target_epoch,
            previous_cursor,
            next_cursor,
            ReconciliationPhase.SCAN,
            lease_seconds,
        )

    def _checkpoint(
        self,
        claim: ReconciliationRecord,
        target_epoch: int | str,
        previous_cursor: str | None,
        next_cursor: str,
        phase: ReconciliationPhase,
        lease_seconds: int,
    ) -> str | None:
        """Move the page cursor (compare-and-set) and renew the lease past its half, in one
        guarded statement; the lease's expiry afterwards, or None when the write was refused
        (lease, run token, epoch, phase or cursor moved)."""
        _require_claim(claim)
        epoch = _epoch(target_epoch)
        previous_cursor = _cursor(previous_cursor, "previous cursor")
        require_text(next_cursor, "Reconciliation checkpoint requires a next cursor")
        validate_duration(lease_seconds, "Reconciliation lease duration", allow_zero=False)
        statement = _checkpoint_statement(phase, previous_cursor is not None, lease_seconds)
        parameters = _claim_parameters(
            claim,
            **{_BOUND_EPOCH.key: epoch, "previous_cursor": previous_cursor},
            next_cursor=next_cursor,
        )
        with single_statement(self.engine) as connection:
            row = connection.execute(statement, parameters).first()
        return row.lease_expires_at if row is not None else None

    def write_scan_page(
        self,
        claim: ReconciliationRecord,
        reconciliation: ReconciliationRecord,
        limit: int,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ) -> PageCheckpoint | None:
        """Beyond the seed: `find_scan_page`, `enqueue_reconciliation_page` and
        `checkpoint_scan` for the page after `reconciliation.scan_cursor`, written together
        (one statement on PostgreSQL, one transaction on SQLite) with every guard of the
        three. None when nothing was written: the page was empty, or a guard refused."""
        page = _PageWrite.of(claim, reconciliation, ReconciliationPhase.SCAN, limit, lease_seconds)
        if page is None:
            return None  # nothing to scan: the collection had no media fields
        parameters = {
            **page.parameters,
            **enqueue_page_parameters(
                collection_id=claim.collection_id,
                collection_slug=claim.collection_slug,
                run_token=claim.run_token,
                lease_token=claim.lease_token,
                change_epoch=page.parameters[_BOUND_EPOCH.key],
                phase=ReconciliationPhase.SCAN.value,
            ),
        }
        # One statement on PostgreSQL; on SQLite the checkpoint first, and the enqueue only
        # if it was written, both in one transaction.
        together = single_statement if is_postgres(self.engine) else guarded_writes_together
        with together(self.engine) as connection:
            statements = _write_scan_page_statements(
                connection.dialect.name,
                claim.collection_slug,
                page.has_previous,
                page.limit,
                lease_seconds,
            )
            row = connection.execute(statements[0], parameters).first()
            if row is None:
                return None
            if len(statements) == 1:
                return PageCheckpoint(*row)
            enqueued = connection.execute(statements[1], parameters).all()
        return PageCheckpoint(row[0], row[1], len(enqueued))

    def checkpoint_clean_source_page(
        self,
        claim: ReconciliationRecord,
        reconciliation: ReconciliationRecord,
        limit: int,
        variants: Sequence[str],
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ) -> PageCheckpoint | None:
        """Beyond the seed: `find_source_page`, `find_missing_content_ids` and
        `checkpoint_sources` in one guarded statement, for a page with nothing to enqueue:
        each source's variant is one of `variants`, its content id set, and its entry's
        content row exists. None when nothing was written: the page was empty, one of its
        sources needs more than a checkpoint, or a guard refused."""
        phase = ReconciliationPhase.SOURCES
        page = _PageWrite.of(claim, reconciliation, phase, limit, lease_seconds)
        if page is None:
            return None  # no canonical source existed when the walk began
        with single_statement(self.engine) as connection:
            statement = _clean_source_page_statement(
                connection.dialect.name,
                claim.collection_slug,
                page.has_previous,
                page.limit,
                lease_seconds,
                tuple(variants),
            )
            row = connection.execute(statement, page.parameters).first()
        return PageCheckpoint(row[0], row[1]) if row is not None else None

    def restart_run(self, claim: ReconciliationRecord, previous_epoch: int | str) -> int | None:
        """Like `begin_run`, but an "interrupted restart" (this run already moved the epoch past
        `previous_epoch`) keeps that epoch, so a crash between restart steps does not bump it
        again. Source counts are left alone."""
        _require_claim(claim)
        previous = _epoch(previous_epoch, "Reconciliation previous epoch")
        interrupted = and_(
            index_status.c.status == "running",
            index_status.c.cursor == claim.run_token,
            index_status.c.change_epoch > previous,
        )
        return self._take_status(claim, interrupted)

    def restart_scan(
        self,
        claim: ReconciliationRecord,
        previous_epoch: int | str,
        target_epoch: int | str,
        field_fingerprint: str,
        scan_upper_id: str | None,
    ) -> bool:
        _require_claim(claim)
        previous = _epoch(previous_epoch, "Reconciliation previous epoch")
        return self._start_scan(
            claim,
            reconciliations.c.target_epoch == previous,
            target_epoch,
            field_fingerprint,
            scan_upper_id,
            next_attempt_at=now(),
        )

    # -- sources ---------------------------------------------------------------------------------

    def find_source_upper_key(
        self, claim: ReconciliationRecord, target_epoch: int | str
    ) -> str | None:
        """The highest canonical source key when the scan ends; legacy sources are never
        enumerated (they have no collection identity)."""
        _require_claim(claim)
        epoch = _epoch(target_epoch)
        statement = (
            select(sources.c.source_key)
            .where(
                _canonical_sources(claim.collection_id),
                live_claim_exists(claim),
                _status_owns_claimed_run(claim, epoch),
            )
            .order_by(sources.c.source_key.desc())
            .limit(1)
        )
        with read_transaction(self.engine) as connection:
            return connection.execute(statement).scalar()

    def transition_to_sources(
        self,
        claim: ReconciliationRecord,
        target_epoch: int | str,
        field_fingerprint: str,
        source_upper_key: str | None,
    ) -> bool:
        _require_claim(claim)
        epoch = _epoch(target_epoch)
        require_text(field_fingerprint, "Reconciliation requires a field fingerprint")
        source_upper_key = _cursor(source_upper_key, "source upper key")
        statement = (
            update(reconciliations)
            .where(
                _claim_holds_lease(claim),
                reconciliations.c.target_epoch == epoch,
                reconciliations.c.field_fingerprint == field_fingerprint,
                reconciliations.c.phase == ReconciliationPhase.SCAN.value,
                _status_owns_claimed_run(claim, epoch),
                _no_work_rows(claim.collection_id),
            )
            .values(
                phase=ReconciliationPhase.SOURCES.value,
                source_cursor=None,
                source_upper_key=source_upper_key,
                attempt_count=0,
                last_error_code=None,
                updated_at=now(),
            )
        )
        return self._write(statement)

    def find_source_page(
        self, reconciliation: ReconciliationRecord, limit: int
    ) -> list[SourceCandidate]:
        limit = _page_limit(limit, "source")
        if not reconciliation.lease_token or reconciliation.target_epoch is None:
            return []
        _require_claim(reconciliation)
        cursor, upper = reconciliation.source_cursor, reconciliation.source_upper_key
        statement = _source_page_statement(bool(cursor), bool(upper), limit)
        parameters = _claim_parameters(
            reconciliation,
            **{
                _BOUND_EPOCH.key: reconciliation.target_epoch,
                _BOUND_CURSOR.key: cursor,
                _BOUND_UPPER.key: upper,
            },
        )
        with read_transaction(self.engine) as connection:
            return [
                record_from_row(SourceCandidate, row._mapping)
                for row in connection.execute(statement, parameters)
            ]

    def find_missing_content_ids(
        self, collection_slug: str, content_ids: Iterable[str]
    ) -> list[str]:
        content = _content(collection_slug)
        unique = _unique_content_ids(content_ids)
        if not unique:
            return []
        with read_transaction(self.engine) as connection:
            present = set(
                connection.execute(
                    select(content.c.id).where(in_text_list(content.c.id, "content_ids")),
                    {"content_ids": unique},
                ).scalars()
            )
        return [content_id for content_id in unique if content_id not in present]

    def checkpoint_sources(
        self,
        claim: ReconciliationRecord,
        target_epoch: int | str,
        previous_cursor: str | None,
        next_cursor: str,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ) -> str | None:
        return self._checkpoint(
            claim,
            target_epoch,
            previous_cursor,
            next_cursor,
            ReconciliationPhase.SOURCES,
            lease_seconds,
        )

    # -- coverage outcomes -----------------------------------------------------------------------

    def finish_failed_coverage(self, collection_id: str, run_token: str) -> bool:
        """Publish a failed run on the status it still owns: `partial` when a canonical index
        exists, `failed` otherwise; an entry failure reports the first failed work's code."""
        _require_identity(collection_id, run_token)
        reconciliation = reconciliations.alias("reconciliation")
        recorded_code = (
            select(reconciliation.c.last_error_code)
            .where(
                reconciliation.c.collection_id == collection_id,
                reconciliation.c.run_token == run_token,
            )
            .scalar_subquery()
        )
        failed_work = work.alias("work")
        first_work_code = (
            select(failed_work.c.last_error_code)
            .where(failed_work.c.collection_id == collection_id, failed_work.c.state == "failed")
            .order_by(failed_work.c.content_id)
            .limit(1)
            .scalar_subquery()
        )
        source = sources.alias("source")
        has_index = exists(
            select(literal(1))
            .select_from(source)
            .where(_canonical_sources(collection_id, source))
            .limit(1)
        )
        statement = (
            update(index_status)
            .where(
                is_content_collection_status(),
                index_status.c.collection_id == collection_id,
                index_status.c.status == "running",
                index_status.c.cursor == run_token,
                exists(
                    select(reconciliation.c.collection_id).where(
                        reconciliation.c.collection_id == collection_id,
                        reconciliation.c.run_token == run_token,
                        reconciliation.c.state == LeaseState.FAILED.value,
                    )
                ),
            )
            .values(
                status=case((has_index, "partial"), else_="failed"),
                completed_at=None,
                cursor=None,
                last_error_code=case(
                    (
                        recorded_code == ENTRY_FAILED_CODE,
                        func.coalesce(first_work_code, ENTRY_FAILED_CODE),
                    ),
                    else_=recorded_code,
                ),
                reconciliation_required=1,
                updated_at=now(),
            )
        )
        return self._write(statement)

    def finalize_coverage(
        self,
        claim: ReconciliationRecord,
        target_epoch: int | str,
        field_fingerprint: str,
        schema_version: int = 1,
    ) -> bool:
        """Coverage becomes trusted only for the exact run, epoch, fields and live lease, with no
        outstanding work, a current registry identity and no deletion under way."""
        _require_claim(claim)
        epoch = _epoch(target_epoch)
        require_text(field_fingerprint, "Reconciliation requires a field fingerprint")
        schema_version = positive_whole(schema_version, "Reconciliation schema version")
        statement = (
            update(index_status)
            .where(
                is_content_collection_status(),
                index_status.c.collection_id == claim.collection_id,
                index_status.c.scope_key == claim.collection_slug,
                index_status.c.capture_state == "active",
                index_status.c.reconciliation_required == 1,
                index_status.c.status == "running",
                index_status.c.cursor == claim.run_token,
                index_status.c.change_epoch == epoch,
                _no_work_rows(claim.collection_id),
                self._finalizing_claim(claim, epoch, field_fingerprint),
                activation_is_active(),
            )
            .values(
                status="complete",
                schema_version=schema_version,
                completed_at=now(),
                cursor=None,
                last_error_code=None,
                reconciliation_required=0,
                updated_at=now(),
            )
        )
        return self._write(statement)

    @staticmethod
    def _finalizing_claim(
        claim: ReconciliationRecord, epoch: int, field_fingerprint: str
    ) -> ColumnElement[bool]:
        reconciliation = reconciliations.alias("reconciliation")
        return exists(
            select(reconciliation.c.collection_id).where(
                registry_identity_is_current(
                    reconciliation.c.collection_id, reconciliation.c.collection_slug
                ),
                reconciliation.c.collection_id == claim.collection_id,
                reconciliation.c.run_token == claim.run_token,
                reconciliation.c.target_epoch == epoch,
                reconciliation.c.field_fingerprint == field_fingerprint,
                reconciliation.c.state == LeaseState.LEASED.value,
                reconciliation.c.phase == ReconciliationPhase.SOURCES.value,
                reconciliation.c.lease_token == claim.lease_token,
                lease_live_at_statement(reconciliation.c.lease_expires_at),
                no_deletion_tombstone(claim.collection_id),
            )
        )

    def delete_finalized(self, claim: ReconciliationRecord) -> bool:
        """Drop the coordinator once its own finalize made coverage complete."""
        _require_claim(claim)
        status = index_status.alias("status")
        statement = delete(reconciliations).where(
            reconciliations.c.collection_id == claim.collection_id,
            reconciliations.c.run_token == claim.run_token,
            reconciliations.c.state == LeaseState.LEASED.value,
            reconciliations.c.lease_token == claim.lease_token,
            exists(
                select(status.c.collection_id).where(
                    status.c.collection_id == claim.collection_id,
                    status.c.scope_key == claim.collection_slug,
                    status.c.status == "complete",
                    status.c.reconciliation_required == 0,
                )
            ),
        )
        return self._write(statement)

    def delete_one_obsolete(self) -> bool:
        """Delete one coordinator whose coverage is already trusted (e.g. a manual repair
        finished), in any state."""
        return self.delete_one_obsolete_collection() is not None

    def delete_one_obsolete_collection(self) -> str | None:
        """`delete_one_obsolete`, returning the collection id of the deleted coordinator."""
        with self.engine.begin() as connection:
            row = connection.execute(delete_one_obsolete_statement()).first()
        return row.collection_id if row is not None else None

    # -- seeding and leases ----------------------------------------------------------------------

    def seed_next_candidate(self) -> bool:
        """Insert at most one coordinator: the lowest eligible collection id."""
        with self.engine.begin() as connection:
            statement = seed_next_candidate_statement(connection, str(ULID()))
            # RETURNING, not rowcount: psycopg reports -1 for an INSERT.
            return connection.execute(statement).first() is not None

    def seed_collection(self, collection_id: str) -> bool:
        """Beyond the seed: `seed_next_candidate` for one named collection (an operator or a
        partitioned run reconciles that collection, not the lowest eligible one)."""
        require_text(collection_id, "Reconciliation seeding requires a collection ID")
        with self.engine.begin() as connection:
            statement = seed_next_candidate_statement(connection, str(ULID()), collection_id)
            return connection.execute(statement).first() is not None

    def request_full_reconciliation(self, collection_id: str) -> bool:
        """Beyond the seed: make trusted coverage untrusted again so a full reconciliation
        runs (an operator's forced run). Only an active, current, undeleted collection whose
        coverage nobody is running; the epoch moves, so work and runs of the old epoch are
        fenced exactly as after a schema change."""
        require_text(collection_id, "Reconciliation request requires a collection ID")
        statement = (
            update(index_status)
            .where(
                is_content_collection_status(),
                index_status.c.collection_id == collection_id,
                index_status.c.capture_state == "active",
                index_status.c.reconciliation_required == 0,
                index_status.c.status != "running",
                index_status.c.cursor.is_(None),
                registry_identity_is_current(
                    index_status.c.collection_id, index_status.c.scope_key
                ),
                activation_is_active(),
                no_deletion_tombstone(index_status.c.collection_id),
            )
            .values(
                change_epoch=index_status.c.change_epoch + 1,
                status="stale",
                reconciliation_required=1,
                cursor=None,
                completed_at=None,
                updated_at=now(),
            )
        )
        return self._write(statement)

    def claim(
        self, collection_id: str, run_token: str, lease_duration_seconds: int
    ) -> ReconciliationClaim | None:
        _require_identity(collection_id, run_token)
        validate_duration(lease_duration_seconds, "Reconciliation lease duration", allow_zero=False)
        lease_token = str(ULID())
        statement = (
            update(reconciliations)
            .where(
                reconciliations.c.collection_id == collection_id,
                reconciliations.c.run_token == run_token,
                is_claimable(reconciliations),
                activation_is_active(),
                _claimable_status(),
                no_deletion_tombstone(reconciliations.c.collection_id),
            )
            .values(
                state=LeaseState.LEASED.value,
                lease_token=lease_token,
                lease_expires_at=timestamp_offset(lease_duration_seconds),
                updated_at=now(),
            )
            .returning(*reconciliations.c)
        )
        row = self._returning(statement)
        return ReconciliationClaim.from_row(row._mapping) if row is not None else None

    def renew_lease(self, claim: ReconciliationRecord, lease_seconds: int) -> str | None:
        """Beyond the seed: extend a still-live lease held by this token once more than half
        of it has elapsed, and return its expiry, or None once it expired or moved on. EmDash
        releases after every page; a Dagster step keeps its claim across pages and renews it
        between them."""
        _require_claim(claim)
        validate_duration(lease_seconds, "Reconciliation lease duration", allow_zero=False)
        with single_statement(self.engine) as connection:
            row = connection.execute(
                _renew_statement(lease_seconds), _claim_parameters(claim)
            ).first()
        return row.lease_expires_at if row is not None else None

    def release(
        self, collection_id: str, run_token: str, lease_token: str, delay_seconds: int
    ) -> bool:
        """Back to pending after `delay_seconds`; the attempt count is kept."""
        _require_lease_identity(collection_id, run_token, lease_token)
        validate_duration(delay_seconds, "Reconciliation release delay", allow_zero=True)
        statement = (
            update(reconciliations)
            .where(_holds_lease(collection_id, run_token, lease_token))
            .values(
                state=LeaseState.PENDING.value,
                next_attempt_at=timestamp_offset(delay_seconds),
                lease_token=None,
                lease_expires_at=None,
                updated_at=now(),
            )
        )
        return self._write(statement)

    def record_failure(
        self,
        collection_id: str,
        run_token: str,
        lease_token: str,
        error_code: str,
        retry_delay_seconds: int,
        terminal: bool,
    ) -> bool:
        """Retry with backoff, failing after the fifth attempt; a terminal failure keeps the
        epoch it was judged at (or the running epoch of this run), so it is reopened only
        after that epoch moves."""
        _require_lease_identity(collection_id, run_token, lease_token)
        validate_error_code(error_code, "Reconciliation failure error code")
        validate_duration(retry_delay_seconds, "Reconciliation retry delay", allow_zero=True)
        if not isinstance(terminal, bool):
            raise ValueError("Reconciliation failure requires an explicit terminal flag")
        values: dict[str, Any] = {
            "state": case(
                (
                    reconciliations.c.attempt_count >= NON_TERMINAL_ATTEMPT_CEILING,
                    LeaseState.FAILED.value,
                ),
                else_=LeaseState.RETRY.value,
            ),
            "attempt_count": reconciliations.c.attempt_count + 1,
            "next_attempt_at": timestamp_offset(retry_delay_seconds),
            "lease_token": None,
            "lease_expires_at": None,
            "last_error_code": error_code,
            "updated_at": now(),
        }
        if terminal:
            values["state"] = LeaseState.FAILED.value
            values["target_epoch"] = func.coalesce(
                reconciliations.c.target_epoch, _running_epoch(collection_id, run_token)
            )
        statement = (
            update(reconciliations)
            .where(_holds_lease(collection_id, run_token, lease_token))
            .values(values)
        )
        return self._write(statement)

    def record_entry_failure(self, claim: ReconciliationRecord) -> bool:
        """Fail the run because an entry's work failed; refused unless failed work exists."""
        _require_claim(claim)
        failed_work = work.alias("work")
        statement = (
            update(reconciliations)
            .where(
                _claim_holds_lease(claim),
                exists(
                    select(failed_work.c.content_id).where(
                        failed_work.c.collection_id == claim.collection_id,
                        failed_work.c.state == "failed",
                    )
                ),
            )
            .values(
                state=LeaseState.FAILED.value,
                attempt_count=reconciliations.c.attempt_count + 1,
                next_attempt_at=now(),
                lease_token=None,
                lease_expires_at=None,
                last_error_code=ENTRY_FAILED_CODE,
                updated_at=now(),
            )
        )
        return self._write(statement)

    def reset_failed_for_new_epoch(self, observed: ReconciliationRecord) -> bool:
        """Reopen a failed run as a fresh scan once nobody owns coverage and the epoch moved
        past the one it failed at."""
        _require_identity(observed.collection_id, observed.run_token)
        if observed.target_epoch is None:
            return False
        target_epoch = _epoch(observed.target_epoch)
        status, unowned = _unowned_status_for_row()
        statement = (
            update(reconciliations)
            .where(
                reconciliations.c.collection_id == observed.collection_id,
                reconciliations.c.run_token == observed.run_token,
                reconciliations.c.state == LeaseState.FAILED.value,
                reconciliations.c.target_epoch == target_epoch,
                exists(
                    select(status.c.collection_id).where(
                        unowned, status.c.change_epoch > target_epoch
                    )
                ),
            )
            .values(_reset_values())
        )
        return self._write(statement)

    # -- healing the stuck state (beyond the seed) -----------------------------------------------

    def find_stuck_failed(self, limit: int) -> list[ReconciliationRecord]:
        """Beyond the seed: failed rows without a target epoch on a status nobody owns. The
        seed's `find_failed` never lists them and `reset_failed_for_new_epoch` never matches
        them; `pin_stuck_failed_epoch` turns each into an ordinary seed failure."""
        statement = find_stuck_failed_statement(_candidate_limit(limit))
        with read_transaction(self.engine) as connection:
            return [
                ReconciliationRecord.from_row(row._mapping) for row in connection.execute(statement)
            ]

    def pin_stuck_failed_epoch(self, collection_id: str, run_token: str) -> int | None:
        """Beyond the seed: record the status epoch as the target of a failed row that has
        none, while nobody owns coverage; returns the pinned epoch. The seed's own reset then
        reopens the row as soon as the epoch moves past it, exactly like any other terminal
        failure (and EmDash, sharing the database, heals it the same way)."""
        _require_identity(collection_id, run_token)
        status, unowned = _unowned_status_for_row()
        observed_epoch = select(status.c.change_epoch).where(unowned).scalar_subquery()
        statement = (
            update(reconciliations)
            .where(
                reconciliations.c.collection_id == collection_id,
                reconciliations.c.run_token == run_token,
                reconciliations.c.state == LeaseState.FAILED.value,
                reconciliations.c.target_epoch.is_(None),
                exists(select(status.c.collection_id).where(unowned)),
            )
            .values(target_epoch=observed_epoch, updated_at=now())
            .returning(reconciliations.c.target_epoch)
        )
        row = self._returning(statement)
        return int(row.target_epoch) if row is not None else None

    def reset_stuck_failed(self, collection_id: str) -> bool:
        """Beyond the seed: reopen, now, a failed row without a target epoch when its status is
        active, untrusted and unowned (same reset as `reset_failed_for_new_epoch`). For explicit
        healing; the automatic path waits for the epoch to move (see the module docstring)."""
        require_text(collection_id, "Reconciliation reset requires a collection ID")
        status, unowned = _unowned_status_for_row()
        statement = (
            update(reconciliations)
            .where(
                reconciliations.c.collection_id == collection_id,
                reconciliations.c.state == LeaseState.FAILED.value,
                reconciliations.c.target_epoch.is_(None),
                exists(select(status.c.collection_id).where(unowned)),
            )
            .values(_reset_values())
        )
        return self._write(statement)

    def resume_retry_now(self, collection_id: str, run_token: str) -> bool:
        """Beyond the seed: make a retrying run due now, its checkpoints kept, for an operator
        who re-executes a failed Dagster run from the failed step (the steps before it do not
        run again, so a fresh scan could not be resumed there). The backoff only paces the
        automatic lane; every later write still asserts the lease, the epoch and the cursors."""
        _require_identity(collection_id, run_token)
        statement = (
            update(reconciliations)
            .where(
                reconciliations.c.collection_id == collection_id,
                reconciliations.c.run_token == run_token,
                reconciliations.c.state == LeaseState.RETRY.value,
            )
            .values(next_attempt_at=now(), updated_at=now())
        )
        return self._write(statement)

    def retry_failed_by_operator(self, collection_id: str) -> OperatorRetryResult:
        """Beyond the seed (EmDash has no reconciliation retry): reopen a failed, retrying or
        lease-expired coordinator as a fresh scan. A live lease is never stolen; a pending row
        is already queued (conflict)."""
        require_text(collection_id, "Reconciliation retry requires a collection ID")
        with self.engine.begin() as connection:
            reopened = connection.execute(
                update(reconciliations)
                .where(
                    reconciliations.c.collection_id == collection_id,
                    is_reopenable_by_operator(reconciliations),
                )
                .values(_reset_values())
                .returning(*reconciliations.c)
            ).first()
            if reopened is not None:
                return OperatorRetryResult(
                    OperatorRetryOutcome.PENDING, ReconciliationRecord.from_row(reopened._mapping)
                )
            return self._retry_refusal(connection, collection_id)

    @staticmethod
    def _retry_refusal(connection: Connection, collection_id: str) -> OperatorRetryResult:
        observed = connection.execute(
            select(
                reconciliations,
                lease_live_at_statement(reconciliations.c.lease_expires_at).label("lease_live"),
            ).where(reconciliations.c.collection_id == collection_id)
        ).first()
        if observed is None:
            return OperatorRetryResult(OperatorRetryOutcome.NOT_FOUND)
        record = ReconciliationRecord.from_row(observed._mapping)
        if record.state is LeaseState.LEASED and observed.lease_live:
            return OperatorRetryResult(
                OperatorRetryOutcome.LEASE_ACTIVE, record, record.lease_expires_at
            )
        return OperatorRetryResult(OperatorRetryOutcome.CONFLICT, record)


# --- statement pieces used by several methods ---------------------------------------------------


def _claimable_status() -> ColumnElement[bool]:
    """Only a collection whose coverage is untrusted, active and current may be reconciled."""
    status = index_status.alias("status")
    return exists(
        select(status.c.collection_id).where(
            registry_identity_is_current(status.c.collection_id, status.c.scope_key),
            status.c.collection_id == reconciliations.c.collection_id,
            status.c.scope_key == reconciliations.c.collection_slug,
            is_content_collection_status(status),
            status.c.capture_state == "active",
            status.c.reconciliation_required == 1,
        )
    )


def _running_epoch(collection_id: str, run_token: str):
    """The epoch of a status this run is running, if any: a terminal failure before
    `initialize_scan` still records the epoch it must wait out."""
    status = index_status.alias("status")
    return (
        select(status.c.change_epoch)
        .where(
            is_content_collection_status(status),
            status.c.collection_id == collection_id,
            status.c.status == "running",
            status.c.cursor == run_token,
        )
        .scalar_subquery()
    )


def oldest_obsolete_statement() -> Select:
    """The oldest coordinator whose coverage is already trusted (what
    `delete_one_obsolete` deletes)."""
    reconciliation = reconciliations.alias("reconciliation")
    status = index_status.alias("status")
    return (
        select(reconciliation.c.collection_id, reconciliation.c.run_token)
        .join(
            status,
            and_(
                status.c.collection_id == reconciliation.c.collection_id,
                status.c.scope_key == reconciliation.c.collection_slug,
            ),
        )
        .where(is_content_collection_status(status), status.c.reconciliation_required == 0)
        .order_by(reconciliation.c.updated_at, reconciliation.c.collection_id)
        .limit(1)
    )


def delete_one_obsolete_statement():
    oldest_obsolete = oldest_obsolete_statement()
    return (
        delete(reconciliations)
        .where(
            tuple_(reconciliations.c.collection_id, reconciliations.c.run_token).in_(
                oldest_obsolete
            )
        )
        .returning(reconciliations.c.collection_id)
    )


def _content(collection_slug: str):
    """`ec_<slug> AS content` (only its id is read); the slug is validated here, before any
    SQL is built. A lightweight table clause: statements on it are cached by name, where a
    new `Table` object per call would be compiled again on every page."""
    return table(content_table_name(collection_slug), column("id", Text)).alias("content")


def _require_lease_identity(collection_id: str, run_token: str, lease_token: str) -> None:
    _require_identity(collection_id, run_token)
    require_text(lease_token, "Reconciliation requires a lease token")


def _unique_content_ids(content_ids: Iterable[str]) -> list[str]:
    message = "Reconciliation source page has invalid content identity"
    if isinstance(content_ids, str) or not isinstance(content_ids, Iterable):
        raise ValueError(message)
    content_ids = list(content_ids)
    if any(not isinstance(content_id, str) or not content_id for content_id in content_ids):
        raise ValueError(message)
    unique = list(dict.fromkeys(content_ids))
    if len(unique) > MAX_PAGE_SIZE:
        raise ValueError(message)
    return unique


__all__: Sequence[str] = (
    "ENTRY_FAILED_CODE",
    "Coverage",
    "OperatorRetryResult",
    "PageCheckpoint",
    "ReconciliationClaim",
    "ReconciliationPhase",
    "ReconciliationRecord",
    "ReconciliationRepository",
    "SourceCandidate",
    "WorkBarrier",
    "WorkBarrierState",
    "delete_one_obsolete_statement",
    "find_due_statement",
    "live_claim_exists",
    "needs_reconciliation_row",
    "seed_next_candidate_statement",
)
