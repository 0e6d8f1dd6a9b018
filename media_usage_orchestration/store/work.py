"""Durable per-entry media usage work: EmDash's `MediaUsageWorkRepository` on SQLAlchemy Core.

One row per (collection_id, content_id) in `_emdash_media_usage_work`. A row is claimed by
leasing an exact `work_version`; every later write (complete, retry, fail, renew) re-asserts
that version, the lease token and a live lease in the same statement, so an owner whose lease
expired, or whose work was re-enqueued meanwhile, can no longer change anything. All
timestamps come from the database clock (`store/core/clock.py`).

Each public method runs in its own transaction (`BEGIN IMMEDIATE` on SQLite; a method of one
statement runs without a transaction block on PostgreSQL). The guards do not rely on that
transaction: every statement is individually guarded, as in the seed.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Integer,
    Select,
    String,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    func,
    literal,
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import FromClause
from ulid import ULID

from media_usage_orchestration.store.activation import capture_active
from media_usage_orchestration.store.core.clock import (
    is_due,
    lease_live_at_clock,
    lease_live_at_statement,
    now,
    timestamp_offset,
    validate_duration,
)
from media_usage_orchestration.store.core.engine import (
    is_postgres,
    read_transaction,
    single_statement,
)
from media_usage_orchestration.store.core.id_lists import (
    in_text_list,
    text_list_item,
    text_list_parameter,
)
from media_usage_orchestration.store.core.json_rows import JsonRows
from media_usage_orchestration.store.core.leases import (
    LeaseState,
    bounded_limit,
    is_claimable,
    lease_has_expired,
    non_negative_whole,
    parse_lease_state,
    positive_whole,
)
from media_usage_orchestration.store.core.predicates import (
    activation_is_active,
    capture_is_active,
    no_deletion_tombstone,
    registry_identity_is_current,
    status_row_owns_run,
)
from media_usage_orchestration.store.core.schema import (
    collections,
    dialect_insert,
    index_status,
    reconciliations,
    work,
)
from media_usage_orchestration.store.registry import RegisteredCollection, collection_id_for_slug
from media_usage_orchestration.values.cursors import PageCursor, decode_cursor, encode_cursor
from media_usage_orchestration.values.identifiers import require_text, validate_error_code
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome
from media_usage_orchestration.values.records import record_from_record, record_from_row
from media_usage_orchestration.values.source_records import new_ulids

MAX_WORK_SELECTION_LIMIT = 100
OPERATOR_DEFAULT_LIMIT = 50
OPERATOR_MAX_LIMIT = 100
RECONCILIATION_PAGE_LIMIT = 50
RECONCILIATION_PHASES = ("scan", "sources")
_PAGE_ROWS = JsonRows.of("page", {"content_id": Text()})

_PENDING = LeaseState.PENDING.value
_RETRY = LeaseState.RETRY.value
_LEASED = LeaseState.LEASED.value
_DUE_STATES = (LeaseState.PENDING, LeaseState.RETRY, LeaseState.LEASED)
_WORK_COLUMNS = tuple(work.c.keys())


# --- records ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkLease:
    """What a claimer must present to complete, retry, fail or renew its work."""

    collection_id: str
    content_id: str
    work_version: int
    lease_token: str


@dataclass(frozen=True)
class WorkRecord:
    collection_id: str
    collection_slug: str
    content_id: str
    change_epoch: int
    work_version: int
    state: LeaseState
    attempt_count: int
    next_attempt_at: str
    lease_token: str | None
    lease_expires_at: str | None
    last_attempted_at: str | None
    last_error_code: str | None
    created_at: str
    updated_at: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> WorkRecord:
        return record_from_row(cls, row, **_ROW_CONVERTERS)

    @property
    def lease(self) -> WorkLease | None:
        """The lease this record carries, when it is a leased row."""
        if self.state is not LeaseState.LEASED or not self.lease_token:
            return None
        return WorkLease(self.collection_id, self.content_id, self.work_version, self.lease_token)

    @property
    def due_at(self) -> str:
        """When the row becomes (or became) claimable: the seed's `dueTimestamp`."""
        if self.state is not LeaseState.LEASED:
            return self.next_attempt_at
        if not self.lease_expires_at:
            raise ValueError("Due leased media usage work must have a lease expiry")
        return self.lease_expires_at


_ROW_CONVERTERS = {
    "change_epoch": int,
    "work_version": int,
    "state": functools.partial(parse_lease_state, label="media usage work"),
    "attempt_count": int,
}


@dataclass(frozen=True)
class OperatorWorkItem:
    """A work row as operators see it: never its version, epoch or lease token."""

    collection_id: str
    collection_slug: str
    content_id: str
    state: LeaseState
    attempt_count: int
    next_attempt_at: str
    lease_expires_at: str | None
    last_attempted_at: str | None
    last_error_code: str | None
    updated_at: str

    @classmethod
    def from_record(cls, record: WorkRecord) -> OperatorWorkItem:
        return record_from_record(cls, record)


@dataclass(frozen=True)
class OperatorPage:
    items: tuple[OperatorWorkItem, ...]
    next_cursor: str | None = None


@dataclass(frozen=True)
class OperatorRetryResult:
    """`pending` carries `changed` and `work`; `lease_active` carries only the expiry."""

    outcome: OperatorRetryOutcome
    changed: bool = False
    work: OperatorWorkItem | None = None
    lease_expires_at: str | None = None

    @classmethod
    def pending(cls, changed: bool, record: WorkRecord) -> OperatorRetryResult:
        item = OperatorWorkItem.from_record(record)
        return cls(OperatorRetryOutcome.PENDING, changed=changed, work=item)

    @classmethod
    def lease_active(cls, lease_expires_at: str) -> OperatorRetryResult:
        return cls(OperatorRetryOutcome.LEASE_ACTIVE, lease_expires_at=lease_expires_at)

    @classmethod
    def collection_not_found(cls) -> OperatorRetryResult:
        return cls(OperatorRetryOutcome.COLLECTION_NOT_FOUND)

    @classmethod
    def conflict(cls) -> OperatorRetryResult:
        return cls(OperatorRetryOutcome.CONFLICT)


def _is_pending_under(record: WorkRecord | None, collection_slug: str) -> bool:
    return (
        record is not None
        and record.state is LeaseState.PENDING
        and record.collection_slug == collection_slug
    )


def _records(rows: Iterable[Any]) -> list[WorkRecord]:
    return [WorkRecord.from_row(row._mapping) for row in rows]


def due_order_key(record: WorkRecord) -> tuple[str, str, str, str]:
    """The seed's `compareDueWork` (its `localeCompare` on these ASCII values is code-point order)."""
    return (record.due_at, record.updated_at, record.collection_id, record.content_id)


def _operator_order_key(item: OperatorWorkItem) -> tuple[str, str]:
    return (item.updated_at, item.content_id)


# --- validation -------------------------------------------------------------------------------


def _identity(collection_id: object, content_id: object) -> tuple[str, str]:
    message = "Media usage work identity must include collection and content IDs"
    return require_text(collection_id, message), require_text(content_id, message)


def _work_version(value: int | str) -> int:
    try:
        return positive_whole(value, "Media usage work identity work version")
    except ValueError:
        raise ValueError("Media usage work identity must include a work version") from None


def _validated_lease(lease: WorkLease) -> WorkLease:
    if not isinstance(lease, WorkLease):
        raise ValueError("Media usage work lease must be a WorkLease")
    collection_id, content_id = _identity(lease.collection_id, lease.content_id)
    version = _work_version(lease.work_version)
    token = require_text(lease.lease_token, "Media usage work lease token must not be empty")
    return WorkLease(collection_id, content_id, version, token)


def _change_epoch(value: int | str) -> int:
    return non_negative_whole(value, "Media usage work change epoch")


def _lease_seconds(value: int) -> int:
    return validate_duration(value, "Media usage work lease duration", allow_zero=False)


def _error_code(value: str) -> str:
    return validate_error_code(value, "Media usage work error code")


def _due_limit(value: int) -> int:
    return bounded_limit(
        value,
        1,
        MAX_WORK_SELECTION_LIMIT,
        f"Media usage due-work limit must be a whole number from 1 to {MAX_WORK_SELECTION_LIMIT}",
    )


def _operator_limit(value: int | None) -> int:
    if value is None:
        return OPERATOR_DEFAULT_LIMIT
    return bounded_limit(
        value,
        1,
        OPERATOR_MAX_LIMIT,
        f"Media usage operator limit must be a whole number from 1 to {OPERATOR_MAX_LIMIT}",
    )


def _operator_state(value: LeaseState | str | None) -> LeaseState | None:
    if value is None:
        return None
    try:
        return LeaseState(value)
    except ValueError:
        raise ValueError("Media usage work listing requires a valid state") from None


def _page_content_ids(content_ids: Sequence[str]) -> list[str]:
    if isinstance(content_ids, str):
        raise ValueError("Reconciliation enqueue content IDs must be a sequence of IDs")
    unique = list(dict.fromkeys(content_ids))
    if not 1 <= len(unique) <= RECONCILIATION_PAGE_LIMIT:
        raise ValueError(
            f"Reconciliation enqueue requires from 1 to {RECONCILIATION_PAGE_LIMIT} content IDs"
        )
    for content_id in unique:
        require_text(content_id, "Reconciliation enqueue content IDs must not be empty")
    return unique


# --- guards -----------------------------------------------------------------------------------


def _is_identity(collection_id: str, content_id: str, table: FromClause = work):
    return and_(table.c.collection_id == collection_id, table.c.content_id == content_id)


def _lease_is_live() -> ColumnElement[bool]:
    """The seed's `leaseIsLive()`: work leases are judged against the wall clock."""
    return lease_live_at_clock(work.c.lease_expires_at)


def _holds_lease(lease: WorkLease) -> ColumnElement[bool]:
    """Only the current owner of this exact version may write: a re-enqueue bumps the version,
    a takeover changes the token, and an expired lease belongs to nobody."""
    return and_(
        _is_identity(lease.collection_id, lease.content_id),
        work.c.work_version == lease.work_version,
        work.c.state == _LEASED,
        work.c.lease_token == lease.lease_token,
        _lease_is_live(),
    )


def _status_joins_registry(status: FromClause, collection: FromClause) -> ColumnElement[bool]:
    return and_(status.c.collection_id == collection.c.id, status.c.scope_key == collection.c.slug)


def _reconciliation_owns_page(
    *,
    collection_id: ColumnElement | str,
    collection_slug: ColumnElement | str,
    run_token: ColumnElement | str,
    lease_token: ColumnElement | str,
    change_epoch: ColumnElement | int,
    phase: ColumnElement | str,
) -> ColumnElement[bool]:
    """Only the live reconciliation lease that owns this run, phase and epoch may enqueue;
    anything else (a takeover, a restart, a deletion, deactivation) enqueues nothing."""
    reconciliation = reconciliations.alias("reconciliation")
    status = index_status.alias("status")
    joined = reconciliation.join(
        status,
        and_(
            status.c.collection_id == reconciliation.c.collection_id,
            status.c.scope_key == reconciliation.c.collection_slug,
        ),
    )
    return exists(
        select(literal(1))
        .select_from(joined)
        .where(
            reconciliation.c.collection_id == collection_id,
            reconciliation.c.collection_slug == collection_slug,
            reconciliation.c.run_token == run_token,
            reconciliation.c.target_epoch == change_epoch,
            reconciliation.c.state == _LEASED,
            reconciliation.c.phase == phase,
            reconciliation.c.lease_token == lease_token,
            lease_live_at_statement(reconciliation.c.lease_expires_at),
            registry_identity_is_current(
                reconciliation.c.collection_id, reconciliation.c.collection_slug
            ),
            status_row_owns_run(status, run_token, change_epoch),
            activation_is_active(),
            no_deletion_tombstone(reconciliation.c.collection_id),
        )
    )


def _observed_work_unchanged(observed: WorkRecord) -> ColumnElement[bool]:
    """The row the operator looked at is still the same version and state (and, if leased,
    still abandoned), so the retry cannot overwrite newer work or steal a live lease."""
    current = work.alias("work")
    conditions = [
        current.c.collection_id == index_status.c.collection_id,
        current.c.content_id == observed.content_id,
        current.c.work_version == observed.work_version,
        current.c.state == observed.state.value,
    ]
    if observed.state is LeaseState.LEASED:
        conditions.append(lease_has_expired(current))
    return exists(select(literal(1)).select_from(current).where(*conditions))


def _no_work_exists(content_id: str) -> ColumnElement[bool]:
    """Creating work is only right while no row exists; otherwise another writer got there."""
    current = work.alias("work")
    return ~exists(
        select(literal(1))
        .select_from(current)
        .where(
            current.c.collection_id == index_status.c.collection_id,
            current.c.content_id == content_id,
        )
    )


def _status_reached_epoch(collection_id: str, collection_slug: str, change_epoch: int):
    """The coverage bump this retry made is still the latest: the collection is still current
    and active, and no other writer advanced the epoch in between."""
    collection = collections.alias("collection")
    status = index_status.alias("status")
    return exists(
        select(collection.c.id)
        .select_from(collection.join(status, _status_joins_registry(status, collection)))
        .where(
            collection.c.id == collection_id,
            collection.c.slug == collection_slug,
            capture_is_active(status),
            status.c.change_epoch == change_epoch,
        )
    )


# --- statements -------------------------------------------------------------------------------


def due_rows_statement(state: LeaseState | str, limit: int) -> Select:
    """One of `find_due_work`'s three indexed queries (the seed's `findDueRows`)."""
    state = LeaseState(state)
    if state not in _DUE_STATES:
        raise ValueError("Failed media usage work is never due")
    limit = _due_limit(limit)
    if state is LeaseState.LEASED:
        column_ = work.c.lease_expires_at
        order = (column_, work.c.collection_id, work.c.content_id)
    else:
        column_ = work.c.next_attempt_at
        order = (column_, work.c.updated_at, work.c.collection_id, work.c.content_id)
    return (
        select(work)
        .where(work.c.state == state.value, is_due(column_))
        .order_by(*order)
        .limit(limit)
    )


def _operator_rows_statement(
    collection_id: str,
    collection_slug: str,
    state: LeaseState,
    limit: int,
    cursor: PageCursor | None,
) -> Select:
    statement = select(work).where(
        registry_identity_is_current(work.c.collection_id, work.c.collection_slug),
        work.c.collection_id == collection_id,
        work.c.collection_slug == collection_slug,
        work.c.state == state.value,
    )
    if cursor is not None:
        statement = statement.where(
            or_(
                work.c.updated_at < cursor.order_value,
                and_(work.c.updated_at == cursor.order_value, work.c.content_id < cursor.id),
            )
        )
    return statement.order_by(work.c.updated_at.desc(), work.c.content_id.desc()).limit(limit)


_CLAIM_COLLECTION = bindparam("claim_collection_id", type_=Text)
# The claim's fresh lease tokens, bound as one list: the candidate of rank n takes the nth.
_CLAIM_TOKENS = text_list_parameter("claim_lease_tokens")


@contextlib.contextmanager
def _due_indexes_walked_in_order(connection: Connection) -> Iterator[None]:
    """On PostgreSQL, make the claims planned in this block walk their due index in order.
    Without fresh statistics (a work table that grew since it was last analyzed, as after a
    reconciliation enqueues a whole collection) the planner expects a handful of due rows and
    prefers to collect all of them with a bitmap scan and sort them: every claim would then
    sort the whole backlog. The setting changes no result, only the plan; it is the session's
    for the block and reset after it, so the claim needs no transaction block around it
    (`SET LOCAL` would keep one open across the claim's round trips)."""
    if not is_postgres(connection):
        yield
        return
    connection.exec_driver_sql("SET enable_bitmapscan = off")
    try:
        yield
    finally:
        if not connection.invalidated:
            connection.exec_driver_sql("RESET enable_bitmapscan")


@functools.lru_cache(maxsize=64)
def _claim_batch_statement(
    dialect_name: str,
    limit: int,
    lease_seconds: int,
    by_collection: bool,
    while_capture_active: bool,
):
    """`claim_due_batch`'s UPDATE, built once per shape: the tokens (one per rank) and the
    collection are bound at execution."""
    collection_id = _CLAIM_COLLECTION if by_collection else None
    candidate = _batch_candidates(limit, dialect_name == "postgresql", collection_id)
    conditions = [
        work.c.collection_id == candidate.c.collection_id,
        work.c.content_id == candidate.c.content_id,
        work.c.work_version == candidate.c.work_version,
        is_claimable(work),
    ]
    if while_capture_active:
        conditions.append(activation_is_active())
    return (
        update(work)
        .values(
            state=_LEASED,
            lease_token=text_list_item(_CLAIM_TOKENS, candidate.c.rank),
            lease_expires_at=timestamp_offset(lease_seconds),
            last_attempted_at=now(),
            updated_at=now(),
        )
        .where(*conditions)
        .returning(*work.c)
    )


def _batch_candidates(
    limit: int, lock: bool, collection_id: ColumnElement | None = None
) -> FromClause:
    """Up to `limit` claimable rows (of one collection, if given) in due order, each
    numbered 1..n by that order.

    As in `find_due_work`, each of the three due states is its own branch walking its index
    in order with LIMIT n, so the cost is bounded by n whatever the size of the backlog; only
    the at most 3n rows of the branches are merged and sorted."""
    branches = [
        _due_branch(state, limit, lock, collection_id).subquery(f"{state.value}_due")
        for state in _DUE_STATES
    ]
    due = union_all(*(select(branch) for branch in branches)).subquery("due")
    rank = func.row_number().over(
        order_by=(due.c.due_at, due.c.updated_at, due.c.collection_id, due.c.content_id)
    )
    return (
        select(due.c.collection_id, due.c.content_id, due.c.work_version, rank.label("rank"))
        .order_by(due.c.due_at, due.c.updated_at, due.c.collection_id, due.c.content_id)
        .limit(limit)
        .subquery("candidate")
    )


def _due_branch(
    state: LeaseState, limit: int, lock: bool, collection_id: ColumnElement | None
) -> Select:
    """`due_rows_statement(state, limit)` narrowed to the batch's columns (and collection)."""
    due = work.alias(f"{state.value}_work")
    if state is LeaseState.LEASED:
        due_at = due.c.lease_expires_at
        conditions = [due.c.state == _LEASED, lease_has_expired(due)]
        order = (due_at, due.c.collection_id, due.c.content_id)
    else:
        due_at = due.c.next_attempt_at
        conditions = [due.c.state == state.value, is_due(due_at)]
        order = (due_at, due.c.updated_at, due.c.collection_id, due.c.content_id)
    if collection_id is not None and state is LeaseState.PENDING:
        # One collection's pending rows, walked through the operator index (collection, state,
        # updated_at) in its own order and filtered on being due: the cost is bounded by n
        # whatever other collections have due ahead of this one. A pending row is due from the
        # moment it was written, so this is its due order too. Its due time is compared through
        # an expression no index serves, or SQLite would walk the due index and sort.
        conditions = [
            due.c.collection_id == collection_id,
            due.c.state == state.value,
            is_due(due_at.concat("")),
        ]
        order = (due.c.updated_at, due.c.content_id)
    elif collection_id is not None:
        # Retrying and expired-lease rows are few: their due indexes are walked in due order,
        # the collection compared through an expression no index serves (with a plain
        # comparison, stale statistics make PostgreSQL sort the collection's whole set).
        conditions.append(due.c.collection_id.concat("") == collection_id)
    branch = (
        select(
            due.c.collection_id,
            due.c.content_id,
            due.c.work_version,
            due.c.updated_at,
            due_at.label("due_at"),
        )
        .where(*conditions)
        .order_by(*order)
        .limit(limit)
    )
    if lock:
        # Concurrent batch claimers on PostgreSQL take disjoint rows instead of queueing on
        # (and then losing) the same ones.
        branch = branch.with_for_update(skip_locked=True)
    return branch


def _new_work_row(collection_id, collection_slug, content_id, change_epoch) -> tuple:
    """A new work row in `_WORK_COLUMNS` order: version 1, pending, no attempt yet, due now,
    no lease."""
    return (
        collection_id,
        collection_slug,
        content_id,
        change_epoch,
        literal(1, BigInteger),
        literal(_PENDING, String),
        literal(0, Integer),
        now(),
        null(),
        null(),
        null(),
        null(),
        now(),
        now(),
    )


@functools.lru_cache(maxsize=4)
def _enqueue_statement(dialect_name: str):
    """`enqueue_reconciliation_page`'s upsert, built once per dialect: the page's ids travel
    as one parameter (a VALUES list would be compiled anew on every page, see `json_rows`),
    the identity, epoch and phase as the `page_*` parameters."""
    page = _PAGE_ROWS.relation(dialect_name)
    return enqueue_page_statement(dialect_name, page.c.content_id).returning(work.c.content_id)


def enqueue_page_statement(dialect_name: str, content_id: ColumnElement, *also: ColumnElement):
    """The upsert of a reconciliation page's work rows, one per `content_id` of its FROM (a
    bound id list, or a page read in the same statement), written only where `also` holds
    and the run, phase and epoch of the `page_*` parameters own the page. Rows are inserted,
    or reopened when their epoch is older (version + 1, attempt and lease cleared); rows at
    the same or a newer epoch are left alone."""
    collection_id = bindparam("page_collection_id", type_=Text)
    collection_slug = bindparam("page_collection_slug", type_=Text)
    epoch = bindparam("page_change_epoch", type_=BigInteger)
    owns_page = _reconciliation_owns_page(
        collection_id=collection_id,
        collection_slug=collection_slug,
        run_token=bindparam("page_run_token", type_=Text),
        lease_token=bindparam("page_lease_token", type_=Text),
        change_epoch=epoch,
        phase=bindparam("page_phase", type_=Text),
    )
    # The WHERE is also what SQLite needs to parse INSERT ... SELECT ... ON CONFLICT.
    source = select(*_new_work_row(collection_id, collection_slug, content_id, epoch)).where(
        owns_page, *also
    )
    insert = dialect_insert(dialect_name, work).from_select(_WORK_COLUMNS, source)
    excluded = insert.excluded
    return insert.on_conflict_do_update(
        index_elements=[work.c.collection_id, work.c.content_id],
        set_={
            "collection_slug": excluded.collection_slug,
            "change_epoch": excluded.change_epoch,
            "work_version": work.c.work_version + 1,
            "state": _PENDING,
            "attempt_count": 0,
            "next_attempt_at": excluded.next_attempt_at,
            "lease_token": None,
            "lease_expires_at": None,
            "last_attempted_at": None,
            "last_error_code": None,
            "updated_at": excluded.updated_at,
        },
        # Work already produced at this epoch or a newer one must not be reset.
        where=work.c.change_epoch < excluded.change_epoch,
    )


def enqueue_page_parameters(
    *,
    collection_id: str,
    collection_slug: str,
    run_token: str,
    lease_token: str,
    change_epoch: int | str,
    phase: str,
) -> dict[str, Any]:
    """The `page_*` parameters of `enqueue_page_statement`, validated: exact identity and
    lease, a whole epoch, phase `scan` or `sources`."""
    message = "Reconciliation enqueue requires exact collection and lease identity"
    for value in (collection_id, collection_slug, run_token, lease_token):
        require_text(value, message)
    epoch = _change_epoch(change_epoch)
    if phase not in RECONCILIATION_PHASES:
        raise ValueError("Reconciliation enqueue requires phase 'scan' or 'sources'")
    return {
        "page_collection_id": collection_id,
        "page_collection_slug": collection_slug,
        "page_run_token": run_token,
        "page_lease_token": lease_token,
        "page_change_epoch": epoch,
        "page_phase": str(phase),
    }


def complete_leases(connection: Connection, leases: Sequence[WorkLease]) -> set[tuple[str, str]]:
    """`complete_work` for many leases in one statement, inside the caller's transaction, each
    row under its own guard (its version, its token, still leased and live); returns the
    (collection_id, content_id) of the rows completed. Not in the seed."""
    leases = [_validated_lease(lease) for lease in leases]
    if not leases:
        return set()
    if len(leases) > MAX_WORK_SELECTION_LIMIT:
        raise ValueError(
            f"Media usage batch completion takes at most {MAX_WORK_SELECTION_LIMIT} leases"
        )
    parameters = {
        "held_collection_ids": sorted({lease.collection_id for lease in leases}),
        "held_content_ids": [lease.content_id for lease in leases],
        "held_token_versions": [f"{lease.lease_token} {lease.work_version}" for lease in leases],
    }
    statement = _complete_leases_statement()
    return {
        (row.collection_id, row.content_id) for row in connection.execute(statement, parameters)
    }


@functools.cache
def _complete_leases_statement():
    """The rows are found through the primary key (the two id lists); each is deleted only if
    one of the leases names its exact token and version (a lease token is a fresh ULID per
    claimed row, so it names the row too), and it is still leased and live. Each list is one
    parameter, so one statement text whatever the batch's size."""
    held = work.c.lease_token.concat(" ").concat(cast(work.c.work_version, Text))
    return (
        delete(work)
        .where(
            in_text_list(work.c.collection_id, "held_collection_ids"),
            in_text_list(work.c.content_id, "held_content_ids"),
            in_text_list(held, "held_token_versions"),
            work.c.state == _LEASED,
            _lease_is_live(),
        )
        .returning(work.c.collection_id, work.c.content_id)
    )


# --- repository -------------------------------------------------------------------------------


class WorkRepository:
    """EmDash's `MediaUsageWorkRepository`, one public method per seed method, plus
    `renew_lease` and `claim_due_batch`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- reconciliation enqueue ----------------------------------------------------------------

    def enqueue_reconciliation_page(
        self,
        *,
        collection_id: str,
        collection_slug: str,
        run_token: str,
        lease_token: str,
        change_epoch: int | str,
        phase: str,
        content_ids: Sequence[str],
    ) -> int:
        """Upsert one page of pending work at `change_epoch`, in one statement.

        Rows are inserted, or existing rows with an older epoch are reopened (version + 1,
        attempt and lease cleared); rows at the same or a newer epoch are left alone. Nothing
        is written unless the caller's reconciliation lease owns this run, phase and epoch.
        Returns how many rows were inserted or reopened (the seed returns nothing).
        """
        parameters = enqueue_page_parameters(
            collection_id=collection_id,
            collection_slug=collection_slug,
            run_token=run_token,
            lease_token=lease_token,
            change_epoch=change_epoch,
            phase=phase,
        )
        page_ids = _page_content_ids(content_ids)
        rows = [{"content_id": content_id} for content_id in page_ids]
        with single_statement(self.engine) as connection:
            dialect_name = connection.dialect.name
            parameters.update(_PAGE_ROWS.bind(dialect_name, rows))
            statement = _enqueue_statement(dialect_name)
            return len(connection.execute(statement, parameters).all())

    # -- operator listing ----------------------------------------------------------------------

    def find_operator_page(
        self,
        collection_slug: str,
        *,
        state: LeaseState | str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> OperatorPage | None:
        """A page of the collection's work, newest first; None if the slug is not registered."""
        require_text(collection_slug, "Media usage work listing requires a collection slug")
        wanted = _operator_state(state)
        limit = _operator_limit(limit)
        position = decode_cursor(cursor) if cursor else None
        with read_transaction(self.engine) as connection:
            collection_id = collection_id_for_slug(connection, collection_slug)
            if collection_id is None:
                return None
            collection = RegisteredCollection(collection_id, collection_slug)
            states = (wanted,) if wanted else tuple(LeaseState)
            candidates = [
                OperatorWorkItem.from_record(record)
                for each in states
                for record in self._operator_rows(connection, collection, each, limit, position)
            ]
        ordered = sorted(candidates, key=_operator_order_key, reverse=True)
        items = tuple(ordered[:limit])
        if len(ordered) > limit and items:
            return OperatorPage(items, encode_cursor(items[-1].updated_at, items[-1].content_id))
        return OperatorPage(items)

    @staticmethod
    def _operator_rows(
        connection: Connection, collection, state: LeaseState, limit: int, cursor: PageCursor | None
    ) -> list[WorkRecord]:
        statement = _operator_rows_statement(
            collection.id, collection.slug, state, limit + 1, cursor
        )
        return _records(connection.execute(statement))

    # -- operator retry ------------------------------------------------------------------------

    def retry_operator_work(self, collection_id: str, content_id: str) -> OperatorRetryResult:
        """Reopen (or create) one entry's work as pending at a freshly bumped coverage epoch.

        Pending work is reported unchanged; a live lease is never stolen; losing any race
        reports what won instead (pending unchanged, lease_active, collection_not_found or
        conflict), with coverage left stale rather than trusted.
        """
        message = "Media usage operator retry requires collection and content IDs"
        require_text(collection_id, message)
        require_text(content_id, message)
        with self.engine.begin() as connection:
            return self._retry_operator_work(connection, collection_id, content_id)

    def _retry_operator_work(
        self, connection: Connection, collection_id: str, content_id: str
    ) -> OperatorRetryResult:
        collection = self._active_collection(connection, collection_id)
        if collection is None:
            return OperatorRetryResult.collection_not_found()
        observed = self._work_by_identity(connection, collection_id, content_id)
        if _is_pending_under(observed, collection.slug):
            return OperatorRetryResult.pending(False, observed)
        epoch = self._invalidate_coverage(
            connection, collection_id, collection.slug, content_id, observed
        )
        if epoch is None:
            return self._operator_retry_lost(connection, collection_id, content_id)
        if observed:
            reopened = self._reopen_observed(connection, observed, collection.slug, epoch)
        else:
            reopened = self._create_operator_work(
                connection, collection_id, collection.slug, content_id, epoch
            )
        if reopened:
            return OperatorRetryResult.pending(True, reopened)
        return self._operator_retry_lost(connection, collection_id, content_id)

    @staticmethod
    def _active_collection(connection: Connection, collection_id: str):
        collection = collections.alias("collection")
        status = index_status.alias("status")
        return connection.execute(
            select(collection.c.id, collection.c.slug)
            .select_from(collection.join(status, _status_joins_registry(status, collection)))
            .where(collection.c.id == collection_id, capture_is_active(status))
        ).first()

    @staticmethod
    def _work_by_identity(
        connection: Connection, collection_id: str, content_id: str
    ) -> WorkRecord | None:
        row = connection.execute(
            select(work).where(_is_identity(collection_id, content_id))
        ).first()
        return WorkRecord.from_row(row._mapping) if row else None

    @staticmethod
    def _invalidate_coverage(
        connection: Connection,
        collection_id: str,
        collection_slug: str,
        content_id: str,
        observed: WorkRecord | None,
    ) -> int | None:
        status = index_status
        work_unchanged = (
            _observed_work_unchanged(observed) if observed else _no_work_exists(content_id)
        )
        epoch = connection.execute(
            update(status)
            .values(
                change_epoch=status.c.change_epoch + 1,
                status=case((status.c.status == "complete", "stale"), else_=status.c.status),
                completed_at=case(
                    (status.c.status == "complete", null()), else_=status.c.completed_at
                ),
                updated_at=now(),
            )
            .where(
                capture_is_active(status),
                status.c.scope_key == collection_slug,
                status.c.collection_id == collection_id,
                registry_identity_is_current(status.c.collection_id, status.c.scope_key),
                work_unchanged,
            )
            .returning(status.c.change_epoch)
        ).scalar_one_or_none()
        return None if epoch is None else int(epoch)

    @staticmethod
    def _reopen_observed(
        connection: Connection, observed: WorkRecord, collection_slug: str, epoch: int
    ) -> WorkRecord | None:
        conditions = [
            _is_identity(observed.collection_id, observed.content_id),
            work.c.work_version == observed.work_version,
            work.c.state == observed.state.value,
            _status_reached_epoch(observed.collection_id, collection_slug, epoch),
        ]
        if observed.state is LeaseState.LEASED:
            conditions.append(lease_has_expired(work))
        row = connection.execute(
            update(work)
            .values(
                collection_slug=collection_slug,
                change_epoch=epoch,
                work_version=work.c.work_version + 1,
                state=_PENDING,
                attempt_count=0,
                next_attempt_at=now(),
                lease_token=None,
                lease_expires_at=None,
                last_attempted_at=None,
                last_error_code=None,
                updated_at=now(),
            )
            .where(*conditions)
            .returning(*work.c)
        ).first()
        return WorkRecord.from_row(row._mapping) if row else None

    @staticmethod
    def _create_operator_work(
        connection: Connection,
        collection_id: str,
        collection_slug: str,
        content_id: str,
        epoch: int,
    ) -> WorkRecord | None:
        status = index_status.alias("status")
        collection = collections.alias("collection")
        source = (
            select(
                *_new_work_row(
                    literal(collection_id, String),
                    collection.c.slug,
                    literal(content_id, String),
                    status.c.change_epoch,
                )
            )
            .select_from(status.join(collection, _status_joins_registry(status, collection)))
            .where(
                capture_is_active(status),
                status.c.scope_key == collection_slug,
                status.c.collection_id == collection_id,
                # Only at the epoch this retry produced: a newer writer's work wins.
                status.c.change_epoch == epoch,
            )
        )
        statement = (
            dialect_insert(connection, work)
            .from_select(_WORK_COLUMNS, source)
            .on_conflict_do_nothing(index_elements=[work.c.collection_id, work.c.content_id])
            .returning(*work.c)
        )
        row = connection.execute(statement).first()
        return WorkRecord.from_row(row._mapping) if row else None

    def _operator_retry_lost(
        self, connection: Connection, collection_id: str, content_id: str
    ) -> OperatorRetryResult:
        if self._active_collection(connection, collection_id) is None:
            return OperatorRetryResult.collection_not_found()
        current = self._work_by_identity(connection, collection_id, content_id)
        if current and current.state is LeaseState.PENDING:
            return OperatorRetryResult.pending(False, current)
        expiry = connection.execute(
            select(work.c.lease_expires_at).where(
                _is_identity(collection_id, content_id),
                work.c.state == _LEASED,
                work.c.lease_expires_at.is_not(None),
                _lease_is_live(),
            )
        ).scalar_one_or_none()
        if expiry:
            return OperatorRetryResult.lease_active(expiry)
        return OperatorRetryResult.conflict()

    # -- processing ----------------------------------------------------------------------------

    def find_due_work(self, limit: int) -> list[WorkRecord]:
        """Up to `limit` claimable rows, expired leases included, in due order."""
        limit = _due_limit(limit)
        with read_transaction(self.engine) as connection:
            rows = [
                record
                for state in _DUE_STATES
                for record in _records(connection.execute(due_rows_statement(state, limit)))
            ]
        return sorted(rows, key=due_order_key)[:limit]

    def find_work_for_content(self, collection_slug: str, content_id: str) -> WorkRecord | None:
        """The entry's work row, only if it belongs to the collection currently at this slug."""
        message = "Media usage work lookup requires collection and content identity"
        require_text(collection_slug, message)
        require_text(content_id, message)
        statement = select(work).where(
            registry_identity_is_current(work.c.collection_id, work.c.collection_slug),
            work.c.collection_slug == collection_slug,
            work.c.content_id == content_id,
        )
        with read_transaction(self.engine) as connection:
            row = connection.execute(statement).first()
        return WorkRecord.from_row(row._mapping) if row else None

    def collection_has_work_in_hand(self, collection_id: str) -> bool:
        """Whether some of the collection's work is leased, or due now.

        Leased: another claimer is processing it and will complete, retry or fail it under its
        own lease, or let the lease lapse, after which the next claim takes it over. Due now
        although a claim just took nothing: on PostgreSQL a concurrent claim has locked those
        rows and not committed yet (`FOR UPDATE SKIP LOCKED` skipped them), so its leases are
        not visible to this statement; or the rows became due after that claim. Either way the
        next claim, or the check after it, sees them. Work backing off (retry not yet due) is
        in nobody's hand, and neither is a lease without an expiry (never taken over). One
        probe, served by the (collection, state) index."""
        require_text(collection_id, "Media usage work-in-hand check requires a collection ID")
        in_hand = or_(
            and_(work.c.state == _LEASED, work.c.lease_expires_at.is_not(None)), is_claimable(work)
        )
        statement = select(exists().where(work.c.collection_id == collection_id, in_hand))
        with read_transaction(self.engine) as connection:
            return bool(connection.execute(statement).scalar())

    def claim_work(
        self, collection_id: str, content_id: str, work_version: int | str, lease_seconds: int
    ) -> WorkRecord | None:
        """Lease this exact version if it is due (or its previous lease expired); None if not."""
        collection_id, content_id = _identity(collection_id, content_id)
        version = _work_version(work_version)
        lease_seconds = _lease_seconds(lease_seconds)
        statement = (
            update(work)
            .values(
                state=_LEASED,
                lease_token=str(ULID()),
                lease_expires_at=timestamp_offset(lease_seconds),
                last_attempted_at=now(),
                updated_at=now(),
            )
            .where(
                _is_identity(collection_id, content_id),
                work.c.work_version == version,
                is_claimable(work),
            )
            .returning(*work.c)
        )
        with single_statement(self.engine) as connection:
            row = connection.execute(statement).first()
        return WorkRecord.from_row(row._mapping) if row else None

    def claim_due_batch(
        self,
        limit: int,
        lease_seconds: int,
        collection_id: str | None = None,
        *,
        while_capture_active: bool = False,
    ) -> list[WorkRecord] | None:
        """Lease up to `limit` due rows in one UPDATE, each under its own fresh ULID token.

        Not in the seed, which claims one row at a time. The candidate subquery picks due rows
        in `find_due_work` order - like it, one branch per due state, each walking its index in
        order and stopping after n rows, so a claim costs the same on any backlog - and
        numbers them 1..n. SQL has no portable ULID, so n ULIDs are generated beforehand and
        bound as one relation of (number, token); the UPDATE therefore joins the candidates
        and the tokens (UPDATE ... FROM) rather than using `pk IN (...)`, so the number travels
        with its key. It joins on (pk, work_version) and re-asserts the claim guard on the row
        it writes: a row that someone else claimed or re-enqueued meanwhile is neither
        written nor returned. On PostgreSQL the candidates are locked `FOR UPDATE SKIP LOCKED`,
        so concurrent batches take disjoint rows. Records come back in due order; each is then
        completed, retried, failed or renewed under its own lease. With `collection_id`, only
        that collection's due rows are candidates. With `while_capture_active` nothing is claimed
        unless capture is active, as EmDash's processor checks before each claim: the UPDATE
        asserts it, so a claim never lands after capture was deactivated, and only a claim that
        took nothing reads the activation row, to tell inactive (None) from nothing due. The
        UPDATE is a statement of its own (no transaction block on PostgreSQL), and records are
        built once it has committed.
        """
        limit = _due_limit(limit)
        if collection_id is not None:
            require_text(collection_id, "Media usage batch claim collection ID must not be empty")
        lease_seconds = _lease_seconds(lease_seconds)
        tokens = new_ulids(limit)
        dialect_name = self.engine.dialect.name
        parameters = {_CLAIM_TOKENS.key: tokens, _CLAIM_COLLECTION.key: collection_id}
        statement = _claim_batch_statement(
            dialect_name, limit, lease_seconds, collection_id is not None, while_capture_active
        )
        with (
            single_statement(self.engine) as connection,
            _due_indexes_walked_in_order(connection),
        ):
            rows = connection.execute(statement, parameters).all()
        if not rows and while_capture_active and not self._capture_active():
            return None
        order = {token: index for index, token in enumerate(tokens)}
        return sorted(_records(rows), key=lambda record: order[record.lease_token])

    def _capture_active(self) -> bool:
        with read_transaction(self.engine) as connection:
            return capture_active(connection)

    def renew_lease(self, lease: WorkLease, lease_seconds: int) -> str | None:
        """Extend a live lease to now + `lease_seconds`; returns the new expiry, or None.

        Not in the seed. The same guard as completion: only the current owner of this exact
        version, while its lease is still live, so an expired owner cannot resurrect a lease
        that another claimer may already be entitled to take over.
        """
        lease = _validated_lease(lease)
        lease_seconds = _lease_seconds(lease_seconds)
        statement = (
            update(work)
            .values(lease_expires_at=timestamp_offset(lease_seconds), updated_at=now())
            .where(_holds_lease(lease))
            .returning(work.c.lease_expires_at)
        )
        with single_statement(self.engine) as connection:
            return connection.execute(statement).scalar_one_or_none()

    def complete_work(self, lease: WorkLease) -> bool:
        """Delete the work row: success leaves nothing behind."""
        lease = _validated_lease(lease)
        with single_statement(self.engine) as connection:
            result = connection.execute(delete(work).where(_holds_lease(lease)))
        return result.rowcount > 0

    def delete_work_through_epoch(self, collection_id: str, max_change_epoch: int | str) -> int:
        """Delete the collection's work produced at or before `max_change_epoch`."""
        require_text(collection_id, "Media usage work cleanup requires a collection ID")
        epoch = _change_epoch(max_change_epoch)
        statement = delete(work).where(
            work.c.collection_id == collection_id, work.c.change_epoch <= epoch
        )
        with single_statement(self.engine) as connection:
            return connection.execute(statement).rowcount

    def retry_work(self, lease: WorkLease, retry_delay_seconds: int, error_code: str) -> bool:
        delay = validate_duration(
            retry_delay_seconds, "Media usage work retry delay", allow_zero=True
        )
        code = _error_code(error_code)
        return self._transition_failure(
            lease, LeaseState.RETRY, code, next_attempt_at=timestamp_offset(delay)
        )

    def fail_work(self, lease: WorkLease, error_code: str) -> bool:
        return self._transition_failure(lease, LeaseState.FAILED, _error_code(error_code))

    def _transition_failure(
        self, lease: WorkLease, state: LeaseState, error_code: str, **extra: Any
    ) -> bool:
        lease = _validated_lease(lease)
        statement = (
            update(work)
            .values(
                state=state.value,
                attempt_count=work.c.attempt_count + 1,
                lease_token=None,
                lease_expires_at=None,
                last_error_code=error_code,
                updated_at=now(),
                **extra,
            )
            .where(_holds_lease(lease))
        )
        with single_statement(self.engine) as connection:
            return connection.execute(statement).rowcount > 0


__all__ = [
    "MAX_WORK_SELECTION_LIMIT",
    "OPERATOR_DEFAULT_LIMIT",
    "OPERATOR_MAX_LIMIT",
    "RECONCILIATION_PAGE_LIMIT",
    "RECONCILIATION_PHASES",
    "OperatorPage",
    "OperatorRetryResult",
    "OperatorWorkItem",
    "WorkLease",
    "WorkRecord",
    "WorkRepository",
    "complete_leases",
    "due_order_key",
    "due_rows_statement",
]
