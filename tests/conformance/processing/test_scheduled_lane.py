"""EmDash's scheduled lane (`runScheduledMediaUsageLane`, spec 8.1), on both dialects: one class
per call in the order the rotated turn names, nothing while capture is not active, nothing
when the request's query budget is spent, and each class's tick doing its own due rows."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from media_usage_orchestration.processing.deletion.processor import DeletionTickOutcome
from media_usage_orchestration.processing.lane.scheduled_lane import (
    LaneOutcome,
    LaneResult,
    TaskClass,
    run_scheduled_lane,
)
from media_usage_orchestration.processing.reconciliation.model import ReconciliationOutcome
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.deletion.records import DeletionPhase
from media_usage_orchestration.store.host.activation import rotate_maintenance_turn
from tests.support.deletions import tombstone, tombstone_row
from tests.support.projection import active_collection, canonical_key, find_source, insert_entry
from tests.support.reconciliations import reconciliation_row
from tests.support.states import count, make_collection, one, set_activation, snapshot

SEQUENCE = [TaskClass.ENTRY_WORK, TaskClass.COLLECTION_DELETION, TaskClass.RECONCILIATION]


def stored_turn(db) -> int:
    return one(db.engine, schema.activation)["media_usage_maintenance_turn"]


def test_the_first_events_from_the_default_turn_run_entry_work_deletion_reconciliation(
    activated,
):
    assert stored_turn(activated) == 2

    results = [run_scheduled_lane(activated.engine) for _ in range(6)]

    assert [result.outcome for result in results] == [LaneOutcome.PROCESSED] * 6
    assert [result.task_class for result in results] == SEQUENCE * 2
    assert [result.turn for result in results] == [0, 1, 2] * 2
    assert stored_turn(activated) == 2


def test_concurrent_lanes_each_take_a_turn_of_their_own(activated):
    """Six lane events at once (EmDash's lane beside this one): the rotation is one statement,
    so the turns they get are the next six of the rotation, each once."""
    start = threading.Barrier(6)

    def rotate() -> int | None:
        start.wait(timeout=30)
        with activated.engine.begin() as connection:
            return rotate_maintenance_turn(connection)

    with ThreadPoolExecutor(6) as pool:
        turns = [future.result() for future in [pool.submit(rotate) for _ in range(6)]]

    assert sorted(turns) == [0, 0, 1, 1, 2, 2]
    assert stored_turn(activated) == 2


@pytest.mark.parametrize("state", ["expanded", "activating"])
def test_the_lane_is_inactive_and_keeps_its_turn_unless_capture_is_active(db, state):
    set_activation(db.engine, state)
    before = snapshot(db.engine)

    assert run_scheduled_lane(db.engine) == LaneResult(LaneOutcome.INACTIVE)

    assert stored_turn(db) == 2
    assert snapshot(db.engine) == before


def test_a_spent_query_budget_closes_admission_without_touching_the_turn(activated):
    # 9 statements spent + 1 rotation + 30 for the largest class = the ceiling of 40.
    closed = run_scheduled_lane(activated.engine, request_query_count=10)
    assert closed == LaneResult(LaneOutcome.ADMISSION_CLOSED)
    assert stored_turn(activated) == 2

    last_admitted = run_scheduled_lane(activated.engine, request_query_count=9)
    assert (last_admitted.outcome, last_admitted.turn) == (LaneOutcome.PROCESSED, 0)


@pytest.mark.parametrize("spent", [-1, True, 1.5, "many"])
def test_a_bad_query_count_is_refused_before_any_sql(activated, spent):
    before = snapshot(activated.engine)

    with pytest.raises(ValueError, match="request query count"):
        run_scheduled_lane(activated.engine, request_query_count=spent)

    assert snapshot(activated.engine) == before


def test_each_turn_processes_only_its_own_class_of_due_rows(activated):
    engine = activated.engine
    posts = active_collection(engine, "posts")
    insert_entry(engine, "posts", "entry-1")  # captured: one work row, due now
    doomed = make_collection(engine, "doomed", reconciliation_required=0, status="complete")
    tombstone(engine, doomed, DeletionPhase.WORK)  # due now, no work rows left to delete
    notes = make_collection(engine, "notes")  # coverage untrusted: reconciliation required
    assert count(engine, schema.work) == 1

    work = run_scheduled_lane(engine)
    assert (work.task_class, work.tick.counts.completed) == (TaskClass.ENTRY_WORK, 1)
    assert count(engine, schema.work) == 0
    assert find_source(engine, canonical_key(posts, "entry-1")) is not None
    assert tombstone_row(engine, doomed.id)["phase"] == "work"
    assert count(engine, schema.reconciliations) == 0

    deletion = run_scheduled_lane(engine)
    assert deletion.task_class is TaskClass.COLLECTION_DELETION
    assert (deletion.tick.claimed_count, deletion.tick.outcome) == (1, DeletionTickOutcome.PROGRESS)
    row = tombstone_row(engine, doomed.id)
    assert (row["phase"], row["state"], row["lease_token"]) == ("sources", "pending", None)
    assert count(engine, schema.reconciliations) == 0

    reconciliation = run_scheduled_lane(engine)
    assert reconciliation.task_class is TaskClass.RECONCILIATION
    assert reconciliation.tick.outcome is ReconciliationOutcome.ADVANCED
    assert reconciliation.tick.collection_id == notes.id
    assert reconciliation_row(engine, notes.id) is not None
    assert tombstone_row(engine, doomed.id)["phase"] == "sources"
