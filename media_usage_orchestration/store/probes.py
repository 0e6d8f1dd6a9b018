"""Bounded, indexed probes for sensors: does anything need a run, and what identifies it?

Each probe reads through the due/lease indexes with small LIMITs, so a sensor tick
stays far below Dagster's evaluation timeout whatever the table sizes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sqlalchemy import (
    Engine,
    String,
    cast,
    func,
    literal,
    null,
    select,
    union_all,
)

from media_usage_orchestration.store.activation import read_activation
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
)
from media_usage_orchestration.store.core.predicates import (
    no_deletion_tombstone,
    registry_identity_is_current,
)
from media_usage_orchestration.store.core.schema import (
    generation_writes,
    index_status,
    reconciliations,
    work,
)
from media_usage_orchestration.store.deletions import DeletionPhase, find_due_statement
from media_usage_orchestration.store.reconciliations import (
    MAX_CANDIDATES,
    find_failed_statement,
    find_stuck_failed_statement,
    needs_reconciliation_row,
    oldest_obsolete_statement,
)
from media_usage_orchestration.store.sources.projection_gc import (
    ProjectionGcRepository,
    scan_window_statement,
    task_is_claimable,
)
from media_usage_orchestration.values.records import record_from_row

# --- work ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DueWork:
    """The earliest due work item: its identity changes whenever the due set moves on.
    `lease_expired` says whether any due item is a lease its owner let lapse (a dead or stuck
    run), whether or not it is the earliest."""

    collection_id: str
    content_id: str
    work_version: int
    due_at: str
    lease_expired: bool = False


def _work_due_branch(state: LeaseState, column):
    """The first due row of one state in the order of its index, so the branch reads one index
    entry whatever the backlog: pending and retry rows in `idx__emdash_media_usage_work_due`
    order (due time, then `updated_at`), expired leases in `..._work_lease` order. An order the
    index does not give would sort every due row of the state (a second on a million rows)."""
    if state is LeaseState.LEASED:
        order = (column, work.c.collection_id, work.c.content_id)
    else:
        order = (column, work.c.updated_at, work.c.collection_id, work.c.content_id)
    return (
        select(
            work.c.collection_id,
            work.c.content_id,
            work.c.work_version,
            column.label("due_at"),
            work.c.updated_at,
            literal(state.value).label("state"),
        )
        .where(work.c.state == state.value, column.is_not(None), is_due(column))
        .order_by(*order)
        .limit(1)
    )


def earliest_due_work_statement():
    """At most one row per due state, the earliest of each, so both of `earliest_due_work`'s
    answers come from one statement."""
    branches = [
        _work_due_branch(LeaseState.PENDING, work.c.next_attempt_at).subquery("pending_due"),
        _work_due_branch(LeaseState.RETRY, work.c.next_attempt_at).subquery("retry_due"),
        _work_due_branch(LeaseState.LEASED, work.c.lease_expires_at).subquery("lease_expired"),
    ]
    return union_all(*(select(branch) for branch in branches))


def earliest_due_work(engine: Engine) -> DueWork | None:
    """The first due item in `find_due_work` order (the seed's due order) and whether any
    due item is an expired lease: one statement, one index entry per due state."""
    with read_transaction(engine) as connection:
        rows = connection.execute(earliest_due_work_statement()).all()
    if not rows:
        return None
    first = min(
        rows, key=lambda row: (row.due_at, row.updated_at, row.collection_id, row.content_id)
    )
    lease_expired = any(row.state == LeaseState.LEASED for row in rows)
    return record_from_row(
        DueWork, {**first._mapping, "lease_expired": lease_expired}, work_version=int
    )


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
