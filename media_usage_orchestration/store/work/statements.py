"""The work statements: due rows in due order, operator rows, the batch claim, the reconciliation page's enqueue and the guarded completion of many leases."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    Select,
    String,
    Text,
    and_,
    bindparam,
    cast,
    delete,
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

from media_usage_orchestration.store.core.clock import (
    is_due,
    now,
    timestamp_offset,
)
from media_usage_orchestration.store.core.engine import (
    is_postgres,
)
from media_usage_orchestration.store.core.id_lists import (
    in_text_list,
    text_list_item,
    text_list_parameter,
)
from media_usage_orchestration.store.core.leases import (
    LeaseState,
    is_claimable,
    lease_has_expired,
)
from media_usage_orchestration.store.core.predicates import (
    activation_is_active,
    registry_identity_is_current,
)
from media_usage_orchestration.store.core.schema import (
    dialect_insert,
    work,
)
from media_usage_orchestration.store.work.guards import lease_is_live, reconciliation_owns_page
from media_usage_orchestration.store.work.records import (
    DUE_STATES,
    LEASED_VALUE,
    MAX_WORK_SELECTION_LIMIT,
    PAGE_ROWS,
    PENDING_VALUE,
    RECONCILIATION_PHASES,
    WORK_COLUMNS,
    WorkLease,
    due_limit,
    validated_change_epoch,
    validated_lease,
)
from media_usage_orchestration.values.cursors import PageCursor
from media_usage_orchestration.values.identifiers import require_text

# --- statements -------------------------------------------------------------------------------


def due_rows_statement(state: LeaseState | str, limit: int) -> Select:
    """One of `find_due_work`'s three indexed queries (the seed's `findDueRows`)."""
    state = LeaseState(state)
    if state not in DUE_STATES:
        raise ValueError("Failed media usage work is never due")
    limit = due_limit(limit)
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


def operator_rows_statement(
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


CLAIM_COLLECTION = bindparam("claim_collection_id", type_=Text)
# The claim's fresh lease tokens, bound as one list: the candidate of rank n takes the nth.
CLAIM_TOKENS = text_list_parameter("claim_lease_tokens")


@contextlib.contextmanager
def due_indexes_walked_in_order(connection: Connection) -> Iterator[None]:
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
def claim_batch_statement(
    dialect_name: str,
    limit: int,
    lease_seconds: int,
    by_collection: bool,
    while_capture_active: bool,
):
    """`claim_due_batch`'s UPDATE, built once per shape: the tokens (one per rank) and the
    collection are bound at execution."""
    collection_id = CLAIM_COLLECTION if by_collection else None
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
            state=LEASED_VALUE,
            lease_token=text_list_item(CLAIM_TOKENS, candidate.c.rank),
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
        for state in DUE_STATES
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
        conditions = [due.c.state == LEASED_VALUE, lease_has_expired(due)]
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


def new_work_row(collection_id, collection_slug, content_id, change_epoch) -> tuple:
    """A new work row in `WORK_COLUMNS` order: version 1, pending, no attempt yet, due now,
    no lease."""
    return (
        collection_id,
        collection_slug,
        content_id,
        change_epoch,
        literal(1, BigInteger),
        literal(PENDING_VALUE, String),
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
def enqueue_statement(dialect_name: str):
    """`enqueue_reconciliation_page`'s upsert, built once per dialect: the page's ids travel
    as one parameter (a VALUES list would be compiled anew on every page, see `json_rows`),
    the identity, epoch and phase as the `page_*` parameters."""
    page = PAGE_ROWS.relation(dialect_name)
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
    owns_page = reconciliation_owns_page(
        collection_id=collection_id,
        collection_slug=collection_slug,
        run_token=bindparam("page_run_token", type_=Text),
        lease_token=bindparam("page_lease_token", type_=Text),
        change_epoch=epoch,
        phase=bindparam("page_phase", type_=Text),
    )
    # The WHERE is also what SQLite needs to parse INSERT ... SELECT ... ON CONFLICT.
    source = select(*new_work_row(collection_id, collection_slug, content_id, epoch)).where(
        owns_page, *also
    )
    insert = dialect_insert(dialect_name, work).from_select(WORK_COLUMNS, source)
    excluded = insert.excluded
    return insert.on_conflict_do_update(
        index_elements=[work.c.collection_id, work.c.content_id],
        set_={
            "collection_slug": excluded.collection_slug,
            "change_epoch": excluded.change_epoch,
            "work_version": work.c.work_version + 1,
            "state": PENDING_VALUE,
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
    epoch = validated_change_epoch(change_epoch)
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
    leases = [validated_lease(lease) for lease in leases]
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
            work.c.state == LEASED_VALUE,
            lease_is_live(),
        )
        .returning(work.c.collection_id, work.c.content_id)
    )
