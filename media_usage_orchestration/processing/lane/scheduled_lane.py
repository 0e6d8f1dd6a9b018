"""EmDash's scheduled maintenance lane (`runScheduledMediaUsageLane`, spec 8.1), Dagster-free.

One call runs exactly one task class, once: it rotates the activation row's
`media_usage_maintenance_turn` (one guarded `UPDATE ... RETURNING`, `state = 'active'` in its
WHERE) and runs the class of the new turn: 0 entry work (`process_due_work`), 1 collection
deletion (`process_due_deletions`), 2 reconciliation (`process_due_reconciliation`). The stored
default is 2, so the first call runs entry work.

The Dagster deployment replaces this lane with one sensor per class; this function is the lane
itself, for a process that drives the database the way EmDash's cron does (beside EmDash's own
lane or instead of it). It coordinates through nothing but the rows each tick claims, so it may
run beside EmDash's lane and the project's Dagster runs on one database.

Admission: EmDash counts the statements its request has already sent (`requestMetrics.dbCount`)
and closes the lane, without touching the turn, when that count plus the rotation plus the
largest class's reservation would pass the request's ceiling. A Python caller has no request
meter, so it passes the count it has spent (`request_query_count`, 0 for a lane of its own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from media_usage_orchestration.processing.deletion.processor import (
    DeletionTickResult,
    process_due_deletions,
)
from media_usage_orchestration.processing.reconciliation.model import ReconciliationTickResult
from media_usage_orchestration.processing.reconciliation.tick import process_due_reconciliation
from media_usage_orchestration.processing.work.processor import WorkTickResult, process_due_work
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.core.leases import non_negative_whole
from media_usage_orchestration.store.host.activation import rotate_maintenance_turn

# EmDash's MEDIA_USAGE_MAINTENANCE_QUERY_RESERVATIONS: the largest class may send 30 statements
# and one lane event at most 40.
ROTATION_QUERIES = 1
MAX_CLASS_QUERIES = 30
EVENT_QUERY_CEILING = 40


class LaneOutcome(StrEnum):
    PROCESSED = "processed"
    INACTIVE = "inactive"
    ADMISSION_CLOSED = "admission_closed"


class TaskClass(StrEnum):
    ENTRY_WORK = "entry_work"
    COLLECTION_DELETION = "collection_deletion"
    RECONCILIATION = "reconciliation"


# The stored turn, after rotation, names the class that runs.
TASK_CLASS_OF_TURN = {
    0: TaskClass.ENTRY_WORK,
    1: TaskClass.COLLECTION_DELETION,
    2: TaskClass.RECONCILIATION,
}

TickResult = WorkTickResult | DeletionTickResult | ReconciliationTickResult

_TICKS: dict[TaskClass, Callable[[Engine], TickResult]] = {
    TaskClass.ENTRY_WORK: process_due_work,
    TaskClass.COLLECTION_DELETION: process_due_deletions,
    TaskClass.RECONCILIATION: process_due_reconciliation,
}


@dataclass(frozen=True)
class LaneResult:
    """EmDash's `{outcome, taskClass, turn}`, plus what the class's tick reported."""

    outcome: LaneOutcome
    task_class: TaskClass | None = None
    turn: int | None = None
    tick: TickResult | None = None


def admits(request_query_count: int) -> bool:
    """Whether a request that has sent `request_query_count` statements may run a lane event."""
    spent = non_negative_whole(request_query_count, "request query count")
    return spent + ROTATION_QUERIES + MAX_CLASS_QUERIES <= EVENT_QUERY_CEILING


def run_scheduled_lane(engine: Engine, *, request_query_count: int = 0) -> LaneResult:
    """One lane event: admission, the turn rotation, then the one class the turn names."""
    if not admits(request_query_count):
        return LaneResult(LaneOutcome.ADMISSION_CLOSED)
    with engine.begin() as connection:
        turn = rotate_maintenance_turn(connection)
    if turn is None:
        return LaneResult(LaneOutcome.INACTIVE)
    task_class = TASK_CLASS_OF_TURN.get(turn)
    if task_class is None:  # only a hand-edited negative turn stays outside 0..2
        raise ValueError(f"Media usage maintenance turn {turn} names no task class")
    return LaneResult(LaneOutcome.PROCESSED, task_class, turn, _TICKS[task_class](engine))
