"""Bounded, indexed probes for sensors: does anything need a run, and what identifies it?

Each probe reads through the due/lease indexes with small LIMITs, so a sensor tick
stays far below Dagster's evaluation timeout whatever the table sizes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import (
    Engine,
    Select,
    String,
    Text,
    bindparam,
    cast,
    func,
    literal,
    null,
    select,
    union_all,
)

from media_usage_orchestration.store.core.clock import (
    is_due,
    is_due_at_clock,
    timestamp_offset,
)
from media_usage_orchestration.store.core.engine import read_transaction
from media_usage_orchestration.store.core.leases import (
    LeaseState,
    bounded_limit,
    due_candidates_statement,
    due_time,
    lease_has_expired,
)
from media_usage_orchestration.store.core.predicates import (
    activation_is_active,
    no_deletion_tombstone,
    registry_identity_is_current,
)
from media_usage_orchestration.store.core.schema import (
    generation_writes,
    index_status,
    reconciliations,
    work,
)
from media_usage_orchestration.store.deletion.records import DeletionPhase
from media_usage_orchestration.store.deletion.statements import find_due_statement
from media_usage_orchestration.store.host.activation import read_activation
from media_usage_orchestration.store.projection_gc.repository import (
    ProjectionGcRepository,
    scan_window_statement,
    task_is_claimable,
)
from media_usage_orchestration.store.reconciliation.guards import needs_reconciliation_row
from media_usage_orchestration.store.reconciliation.records import MAX_CANDIDATES
from media_usage_orchestration.store.reconciliation.statements import (
    find_failed_statement,
    find_stuck_failed_statement,
    oldest_obsolete_statement,
)
from media_usage_orchestration.values.records import record_from_row

# --- work ---------------------------------------------------------------------------------------

MAX_DUE_WORK_COLLECTIONS = 100
_DUE_WORK_STATES = (LeaseState.PENDING, LeaseState.RETRY, LeaseState.LEASED)


@dataclass(frozen=True)
class CollectionDueWork:
    """A collection with claimable work, as one work run of its own would claim it.

    `generation` names the first claimable row of each due state (its due time, content id and
    version), so it changes whenever the collection's due set moves on; `due_at` is the earliest
    of them; `lease_expired` says whether one of them is a lease its owner let lapse (a dead or
    stuck run)."""

    collection_id: str
    collection_slug: str
    due_at: str
    generation: str
    lease_expired: bool


def first_due_row(state: LeaseState, collection_id) -> Select:
    """The first claimable row of one state of one collection, as `due|content|version` text,
    through the index the batch claim walks for that state: the operator index (collection,
    state, updated_at) for pending rows, due from the moment they were written; the due and
    lease indexes for the few retrying and expired-lease rows."""
    if state is LeaseState.LEASED:
        due_at = work.c.lease_expires_at
        conditions = [work.c.collection_id.concat("") == collection_id, lease_has_expired(work)]
        order = (due_at, work.c.collection_id, work.c.content_id)
    elif state is LeaseState.RETRY:
        due_at = work.c.next_attempt_at
        conditions = [work.c.collection_id.concat("") == collection_id, is_due(due_at)]
        order = (due_at, work.c.updated_at, work.c.collection_id, work.c.content_id)
    else:
        due_at = work.c.next_attempt_at
        conditions = [work.c.collection_id == collection_id, is_due(due_at.concat(""))]
        order = (work.c.updated_at, work.c.content_id)
    found = due_at.concat("|").concat(work.c.content_id).concat("|")
    found = found.concat(cast(work.c.work_version, String))
    return (
        select(found)
        .where(work.c.state == state.value, *conditions)
        .order_by(*order)
        .limit(1)
        .scalar_subquery()
    )


@functools.lru_cache(maxsize=8)
def _due_work_by_collection_statement(limit: int):
    """The collections present in the work table, found by a skip scan of the operator index
    (one seek per collection, whatever each holds), each with its first claimable row per due
    state. Work rows are the truth here, not the registry: rows a deleted collection left are
    still claimed by a run of their own."""
    first = select(func.min(work.c.collection_id).label("collection_id")).cte(
        "present", recursive=True
    )
    following = (
        select(func.min(work.c.collection_id))
        .where(work.c.collection_id > first.c.collection_id)
        .scalar_subquery()
    )
    present = first.union_all(
        select(following.label("collection_id")).where(first.c.collection_id.is_not(None))
    )
    collection = present.c.collection_id
    slug = (
        select(work.c.collection_slug)
        .where(work.c.collection_id == collection)
        .limit(1)
        .scalar_subquery()
    )
    return (
        select(
            collection.label("collection_id"),
            slug.label("collection_slug"),
            *(first_due_row(state, collection).label(state.value) for state in _DUE_WORK_STATES),
        )
        .where(collection.is_not(None))
        .order_by(collection)
        .limit(limit)
    )


@functools.lru_cache(maxsize=1)
def _collection_due_work_statement():
    collection = bindparam("collection_id", type_=Text)
    return select(
        *(first_due_row(state, collection).label(state.value) for state in _DUE_WORK_STATES),
        activation_is_active().label("capture_active"),
        no_deletion_tombstone(collection).label("not_deleting"),
    )


class CollectionWork(StrEnum):
    """What a work run waiting for more of one collection's work finds."""

    DUE = "due"  # claimable work now
    IDLE = "idle"  # nothing due yet
    CLOSED = "closed"  # capture is inactive or the collection is being deleted: none will be


def collection_work_state(engine: Engine, collection_id: str) -> CollectionWork:
    """Whether one collection has claimable work now, or can have none (capture inactive, a
    deletion tombstone): a few index seeks, cheap enough for a work run to ask every half
    second while it waits for more."""
    with read_transaction(engine) as connection:
        row = connection.execute(
            _collection_due_work_statement(), {"collection_id": collection_id}
        ).one()
    if not row.capture_active or not row.not_deleting:
        return CollectionWork.CLOSED
    due = any(row[index] is not None for index in range(len(_DUE_WORK_STATES)))
    return CollectionWork.DUE if due else CollectionWork.IDLE


def collection_has_due_work(engine: Engine, collection_id: str) -> bool:
    """Whether one collection has claimable work now."""
    return collection_work_state(engine, collection_id) is CollectionWork.DUE


def due_work_by_collection(engine: Engine, limit: int) -> list[CollectionDueWork]:
    """Every collection (the first `limit` by id) with claimable work, earliest due first: one
    statement of a few index seeks per collection present in the work table."""
    limit = bounded_limit(limit, 1, MAX_DUE_WORK_COLLECTIONS, "Work collection limit")
    with read_transaction(engine) as connection:
        rows = connection.execute(_due_work_by_collection_statement(limit)).all()
    found = []
    for row in rows:
        firsts = {state: getattr(row, state.value) for state in _DUE_WORK_STATES}
        due = [first for first in firsts.values() if first is not None]
        if not due:
            continue
        found.append(
            CollectionDueWork(
                collection_id=row.collection_id,
                collection_slug=row.collection_slug,
                due_at=min(first.split("|", 1)[0] for first in due),
                generation=";".join(first or "-" for first in firsts.values()),
                lease_expired=firsts[LeaseState.LEASED] is not None,
            )
        )
    return sorted(found, key=lambda due: (due.due_at, due.collection_id))


# --- reconciliations ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReconciliationCandidate:
    """A collection that needs a reconciliation run now; `generation` changes every time the
    row becomes due again (or, with no row yet, every time its coverage changes). A collection
    without a coordinator row is due since its status row last changed."""

    collection_id: str
    collection_slug: str
    run_token: str | None
    due_at: str
    generation: str
    lease_expired: bool = False


def due_reconciliations(engine: Engine, limit: int) -> list[ReconciliationCandidate]:
    """Due coordinator rows, plus collections that need one and have none, in one statement.
    A collection being deleted (tombstoned) or gone from the registry is never a candidate:
    its run could only end `not_found`, and its partition must stay removed."""
    limit = bounded_limit(
        limit,
        1,
        MAX_CANDIDATES,
        f"Reconciliation candidate limit must be from 1 to {MAX_CANDIDATES}",
    )
    with read_transaction(engine) as connection:
        found = connection.execute(_due_reconciliations_statement(limit)).all()
    return [record_from_row(ReconciliationCandidate, row._mapping) for row in found[:limit]]


@functools.lru_cache(maxsize=8)
def _due_reconciliations_statement(limit: int):
    """Built once per limit: the sensor asks every tick, and building it costs more than
    running it (times are the database's, evaluated when it runs)."""
    due = due_candidates_statement(claimable_reconciliations(), limit).subquery("due")
    rows = select(
        due.c.collection_id,
        due.c.collection_slug,
        due.c.run_token,
        (due_time(due) + literal(":") + due.c.updated_at).label("generation"),
        *_due_columns(due),
    )
    status = index_status.alias("status")
    needing = (
        select(
            status.c.collection_id,
            status.c.scope_key.label("collection_slug"),
            null().label("run_token"),
            (cast(status.c.change_epoch, String) + literal(":") + status.c.updated_at).label(
                "generation"
            ),
            status.c.updated_at.label("due_at"),
            literal(False).label("lease_expired"),
        )
        .where(needs_reconciliation_row(status))
        .order_by(status.c.collection_id)
        .limit(limit)
    )
    # SQLite refuses a parenthesized compound member: the bounded branch becomes a subquery.
    return union_all(rows, select(needing.subquery("needing")))


def _due_columns(due) -> tuple:
    """A due row's due time, and whether it is due because its lease lapsed (a reconciliation
    or a tombstone: the rows the bounded due branches picked)."""
    return (
        due_time(due).label("due_at"),
        (due.c.state == LeaseState.LEASED.value).label("lease_expired"),
    )


def claimable_reconciliations():
    """Coordinator rows of current, undeleted collections. Filtered before the bounded due
    branches pick their rows, so rows of deleted collections (whose leases lapse and are never
    renewed) cannot fill the LIMIT and starve the others."""
    row = reconciliations
    return (
        select(row)
        .where(
            no_deletion_tombstone(row.c.collection_id),
            registry_identity_is_current(row.c.collection_id, row.c.collection_slug),
        )
        .subquery("claimable")
    )


# --- the maintenance job's settle loops ----------------------------------------------------------


def _seed_candidate_statement():
    status = index_status.alias("status")
    return select(status.c.collection_id).where(needs_reconciliation_row(status)).limit(1)


# Each is the selection of one settle loop (`processing/reconciliation/maintenance.py`),
# limited to one row: the loop changes something exactly when its selection is not empty.
_PENDING_SETTLEMENTS = {
    "obsolete": oldest_obsolete_statement,
    "failed": lambda: find_failed_statement(1),
    "stuck": lambda: find_stuck_failed_statement(1),
    "seed": _seed_candidate_statement,
}


def pending_settlements(engine: Engine) -> tuple[str, ...]:
    """Which settle loops of the maintenance job have something to do now (obsolete, failed,
    stuck, seed); none while capture is inactive, when settling does nothing. Four
    one-row selections in one read transaction."""
    with read_transaction(engine) as connection:
        activation_row = read_activation(connection)
        if activation_row is None or activation_row.state != "active":
            return ()
        return tuple(
            name
            for name, statement in _PENDING_SETTLEMENTS.items()
            if connection.execute(statement()).first() is not None
        )


# --- collection deletions ------------------------------------------------------------------------


@dataclass(frozen=True)
class DeletionCandidate:
    """A due collection-deletion tombstone: `due_at` and `updated_at` change every time it
    becomes due again."""

    collection_id: str
    collection_slug: str
    phase: DeletionPhase
    due_at: str
    updated_at: str
    lease_expired: bool


def due_deletions(engine: Engine, limit: int) -> list[DeletionCandidate]:
    """The oldest due pending, retry and lease-expired tombstones, in due order."""
    due = find_due_statement(limit).subquery("due")
    statement = select(
        due.c.collection_id,
        due.c.collection_slug,
        due.c.phase,
        due.c.updated_at,
        *_due_columns(due),
    ).order_by(due_time(due), due.c.updated_at, due.c.collection_id)
    with read_transaction(engine) as connection:
        rows = connection.execute(statement).all()
    return [
        record_from_row(DeletionCandidate, row._mapping, phase=DeletionPhase, lease_expired=bool)
        for row in rows
    ]


# --- the projection GC -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectionGcCandidate:
    """The projection GC task row is due (`due_at`, its next eligible time, has passed) and no
    pass holds it; `lease_expired` says a pass let its lease lapse. The rest is what the next
    pass would have to do."""

    due_at: str
    updated_at: str
    lease_expired: bool
    sweeping: bool
    window_rows: int
    window_full: bool
    targets_in_window: int
    expired_write_leases: bool

    @property
    def has_work(self) -> bool:
        """A pass deletes something, advances the sweep, or finishes one in progress."""
        return (
            self.expired_write_leases
            or self.targets_in_window > 0
            or self.window_full
            or self.sweeping
        )


def due_projection_gc(
    engine: Engine, window: int, safety_window_seconds: int
) -> ProjectionGcCandidate | None:
    """What the next pass would find, reading at most `window` occurrences through the
    cleanup-scan index: None while the task is not due (or leased)."""
    task = ProjectionGcRepository(engine).read_task()
    with read_transaction(engine) as connection:
        due = connection.execute(select(literal(1)).where(task_is_claimable())).first()
        if due is None or task is None:
            return None
        cutoff = (
            task.scan_before_at
            or connection.execute(select(timestamp_offset(-safety_window_seconds))).scalar_one()
        )
        expired_leases = connection.execute(
            select(func.count()).select_from(
                select(generation_writes.c.lease_token)
                .where(is_due_at_clock(generation_writes.c.expires_at))
                .limit(1)
                .subquery()
            )
        ).scalar_one()
        window_rows = connection.execute(scan_window_statement(cutoff, task.cursor, window)).all()
    return ProjectionGcCandidate(
        due_at=task.next_eligible_at,
        updated_at=task.updated_at,
        lease_expired=task.leased,
        sweeping=task.cursor is not None,
        window_rows=len(window_rows),
        window_full=len(window_rows) >= window,
        targets_in_window=sum(1 for row in window_rows if row.target),
        expired_write_leases=bool(expired_leases),
    )
