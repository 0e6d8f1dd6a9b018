"""The reconciliation's statements: those plans and tests read, and those built once and bound per call (page writes, checkpoints, renewals)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Self

from sqlalchemy import (
    BigInteger,
    Connection,
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

from media_usage_orchestration.store.core.clock import (
    lease_live_at_statement,
    now,
    timestamp_offset,
    validate_duration,
)
from media_usage_orchestration.store.core.leases import (
    LeaseState,
    due_candidates_statement,
)
from media_usage_orchestration.store.core.predicates import (
    activation_is_active,
    is_content_collection_status,
    no_deletion_tombstone,
    registry_identity_is_current,
)
from media_usage_orchestration.store.core.schema import (
    dialect_insert,
    index_status,
    reconciliations,
    sources,
    work,
)
from media_usage_orchestration.store.reconciliation.guards import (
    canonical_sources,
    claim_holds_lease,
    live_claim_exists,
    needs_reconciliation_row,
    no_work_rows,
    status_owns_claimed_run,
    unowned_status_for_row,
)
from media_usage_orchestration.store.reconciliation.records import (
    ENTRY_FAILED_CODE,
    ReconciliationPhase,
    ReconciliationRecord,
    candidate_limit,
    page_limit,
    require_claim,
    validated_cursor,
    validated_epoch,
)
from media_usage_orchestration.store.work.statements import enqueue_page_statement
from media_usage_orchestration.values.identifiers import (
    content_table_name,
)

# --- statements exposed for plans and tests ----------------------------------------------------


def find_due_statement(limit: int) -> Select:
    """One statement: due pending, due retry and lease-expired rows, each bounded, then merged
    (the seed's three CTEs, so each branch walks its own index)."""
    return due_candidates_statement(reconciliations, candidate_limit(limit))


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
    status, unowned = unowned_status_for_row()
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
    from the same named predicates once, then executed with `claim_parameters(claim)`."""

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
BOUND_EPOCH = bindparam("claim_target_epoch", type_=BigInteger)
BOUND_CURSOR = bindparam("page_cursor", type_=Text)
BOUND_UPPER = bindparam("page_upper", type_=Text)


@dataclass(frozen=True)
class PageWrite:
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
        limit = page_limit(limit, "scan" if scan else "source")
        require_claim(claim)
        epoch = validated_epoch(reconciliation.target_epoch)
        validate_duration(lease_seconds, "Reconciliation lease duration", allow_zero=False)
        if scan:
            previous, upper = reconciliation.scan_cursor, reconciliation.scan_upper_id
        else:
            previous, upper = reconciliation.source_cursor, reconciliation.source_upper_key
        previous = validated_cursor(previous, "previous cursor")
        upper = validated_cursor(upper, "page upper bound")
        if upper is None:
            return None
        bounds = {"previous_cursor": previous, BOUND_CURSOR.key: previous, BOUND_UPPER.key: upper}
        parameters = claim_parameters(claim, **{BOUND_EPOCH.key: epoch}, **bounds)
        return cls(limit, previous is not None, parameters)


def claim_parameters(claim: ReconciliationRecord, **extra: Any) -> dict[str, Any]:
    bound = {
        _BOUND_CLAIM.collection_id.key: claim.collection_id,
        _BOUND_CLAIM.collection_slug.key: claim.collection_slug,
        _BOUND_CLAIM.run_token.key: claim.run_token,
        _BOUND_CLAIM.lease_token.key: claim.lease_token,
    }
    return {**bound, **extra}


@functools.lru_cache(maxsize=4)
def owns_run_statement():
    return select(status_owns_claimed_run(_BOUND_CLAIM, BOUND_EPOCH))


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
def renew_statement(lease_seconds: int):
    return (
        update(reconciliations)
        .where(claim_holds_lease(_BOUND_CLAIM))
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
        claim_holds_lease(_BOUND_CLAIM),
        reconciliations.c.target_epoch == BOUND_EPOCH,
        reconciliations.c.phase == phase.value,
        status_owns_claimed_run(_BOUND_CLAIM, BOUND_EPOCH),
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
def checkpoint_statement(phase: ReconciliationPhase, has_previous: bool, lease_seconds: int):
    next_cursor = bindparam("next_cursor", type_=Text)
    return _checkpoint_update(phase, has_previous, lease_seconds, next_cursor)


def _page_relation(dialect_name: str, page: Select, name: str):
    """A page read inside the statement that writes it: a CTE on PostgreSQL, where the page
    feeds data-modifying CTEs and is read once; a subquery on SQLite."""
    return page.cte(name) if dialect_name == "postgresql" else page.subquery(name)


@functools.lru_cache(maxsize=64)
def write_scan_page_statements(
    dialect_name: str, collection_slug: str, has_cursor: bool, limit: int, lease_seconds: int
) -> tuple:
    """The next scan page enqueued and checkpointed together: on PostgreSQL one statement
    (the checkpoint a data-modifying CTE, the enqueue another that writes only if the
    checkpoint did); on SQLite the checkpoint, then the enqueue, in one transaction."""
    content = content_table(collection_slug)
    bounds = [content.c.id <= BOUND_UPPER]
    if has_cursor:
        bounds.append(content.c.id > BOUND_CURSOR)
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
def clean_source_page_statement(
    dialect_name: str,
    collection_slug: str,
    has_cursor: bool,
    limit: int,
    lease_seconds: int,
    variants: tuple[str, ...],
):
    """The source page checkpointed, only if each of its sources is valid and its entry's
    content row exists: a page with nothing to enqueue, the usual one when fields extract."""
    bounds = [canonical_sources(_BOUND_CLAIM.collection_id), sources.c.source_key <= BOUND_UPPER]
    if has_cursor:
        bounds.append(sources.c.source_key > BOUND_CURSOR)
    read = (
        select(sources.c.source_key, sources.c.content_id, sources.c.source_variant)
        .where(*bounds)
        .order_by(sources.c.source_key)
    )
    page = _page_relation(dialect_name, read.limit(limit), "source_page")
    content = content_table(collection_slug)
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
def scan_page_statement(
    collection_slug: str, has_cursor: bool, has_upper: bool, limit: int, guarded: bool
):
    content = content_table(collection_slug)
    bounds = [live_claim_exists(_BOUND_CLAIM)] if guarded else []
    if has_cursor:
        bounds.append(content.c.id > BOUND_CURSOR)
    # No upper id means the collection had no media fields: nothing to scan.
    bounds.append(content.c.id <= BOUND_UPPER if has_upper else false())
    return select(content.c.id).where(*bounds).order_by(content.c.id).limit(limit)


@functools.lru_cache(maxsize=16)
def source_page_statement(has_cursor: bool, has_upper: bool, limit: int):
    bounds = [
        canonical_sources(_BOUND_CLAIM.collection_id),
        live_claim_exists(_BOUND_CLAIM),
        status_owns_claimed_run(_BOUND_CLAIM, BOUND_EPOCH),
    ]
    if has_cursor:
        bounds.append(sources.c.source_key > BOUND_CURSOR)
    bounds.append(sources.c.source_key <= BOUND_UPPER if has_upper else false())
    return (
        select(sources.c.source_key, sources.c.content_id, sources.c.source_variant)
        .where(*bounds)
        .order_by(sources.c.source_key)
        .limit(limit)
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


def content_table(collection_slug: str):
    """`ec_<slug> AS content` (only its id is read); the slug is validated here, before any
    SQL is built. A lightweight table clause: statements on it are cached by name, where a
    new `Table` object per call would be compiled again on every page."""
    return table(content_table_name(collection_slug), column("id", Text)).alias("content")


def finalizing_claim(
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


def finish_failed_coverage_statement(collection_id: str, run_token: str):
    """The failed run published on the status it still owns (`finish_failed_coverage`)."""
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
        .where(canonical_sources(collection_id, source))
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
    return statement


def finalize_coverage_statement(
    claim: ReconciliationRecord, epoch: int, field_fingerprint: str, schema_version: int
):
    """Coverage trusted for the exact run, epoch, fields and live lease (`finalize_coverage`)."""
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
            no_work_rows(claim.collection_id),
            finalizing_claim(claim, epoch, field_fingerprint),
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
    return statement


def request_full_reconciliation_statement(collection_id: str):
    """Trusted coverage made untrusted again (`request_full_reconciliation`)."""
    statement = (
        update(index_status)
        .where(
            is_content_collection_status(),
            index_status.c.collection_id == collection_id,
            index_status.c.capture_state == "active",
            index_status.c.reconciliation_required == 0,
            index_status.c.status != "running",
            index_status.c.cursor.is_(None),
            registry_identity_is_current(index_status.c.collection_id, index_status.c.scope_key),
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
    return statement
