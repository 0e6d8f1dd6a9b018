"""The health checks' rules and their one writer, on both dialects with a real instance:
`queue_healthy` fails on a stalled queue and on due work no live run will take, not on an edit in
flight; `coverage_complete` fails on failed work, a failed reconciliation and coverage stuck
without progress, not on a reconciliation making progress; the queue sensor evaluates a check
exactly when its latest stored evaluation (any writer's) differs from the state; "Execute"
carries the project's tags."""

from __future__ import annotations

import dagster as dg
import pytest
from sqlalchemy import update

from media_usage_orchestration.assets.coverage_history import (
    coverage_assets,
    coverage_history_key,
)
from media_usage_orchestration.assets.health import (
    CHECK_WORKFLOW,
    COVERAGE_CHECK,
    COVERED,
    QUEUE_CHECK,
    WORK_JOB,
)
from media_usage_orchestration.assets.queue import queue_key
from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_TAG, WORKFLOW_TAG
from media_usage_orchestration.jobs import media_usage_work
from media_usage_orchestration.sensors.queue import media_usage_queue_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.runs.run_leases import begin_run_lease
from tests.support.factories import ago, failed, insert_works, of
from tests.support.sensor_loop import resources
from tests.support.states import backdate, make_collection

QUEUE = dg.AssetCheckKey(queue_key("alpha"), QUEUE_CHECK)
COVERAGE = dg.AssetCheckKey(coverage_history_key("alpha"), COVERAGE_CHECK)


def tick(db, instance: dg.DagsterInstance) -> dict[dg.AssetCheckKey, dg.AssetCheckEvaluation]:
    """One tick, its events stored as the daemon stores them; the evaluations it reported."""
    with dg.build_sensor_context(instance=instance, resources=resources(db)) as context:
        data = media_usage_queue_sensor.evaluate_tick(context)
    for event in data.asset_events:
        instance.report_runless_asset_event(event)
    return {
        dg.AssetCheckKey(event.asset_key, event.check_name): event
        for event in data.asset_events
        if isinstance(event, dg.AssetCheckEvaluation)
    }


def latest(instance: dg.DagsterInstance, key: dg.AssetCheckKey) -> dg.AssetCheckEvaluation:
    return instance.get_latest_asset_check_evaluation_record(key).evaluation


@pytest.fixture
def alpha(db):
    return make_collection(db.engine, "alpha")


def _due(db, collection, seconds_ago: int) -> None:
    insert_works(
        db.engine,
        [{"content_id": "due", "next_attempt_at": ago(seconds_ago), "updated_at": ago(60)}],
        **of(collection),
    )


def _work_run(instance: dg.DagsterInstance, status: dg.DagsterRunStatus) -> dg.DagsterRun:
    return instance.create_run_for_job(
        media_usage_work, status=status, tags={COLLECTION_TAG: "alpha"}
    )


def test_an_edit_in_flight_is_healthy_and_a_stalled_queue_is_not(db, instance, alpha):
    _due(db, alpha, seconds_ago=20)
    assert tick(db, instance)[QUEUE].passed

    backdate(db.engine, schema.work, "next_attempt_at", 400, collection_id=alpha.id)
    evaluation = tick(db, instance)[QUEUE]

    assert not evaluation.passed
    assert "waited more than 300 s (queue_stall_seconds)" in evaluation.description


def test_due_work_with_no_live_run_fails_after_a_minute_until_a_run_is_coming(db, instance, alpha):
    _due(db, alpha, seconds_ago=90)
    assert "no work run of the collection is alive" in tick(db, instance)[QUEUE].description

    starting = _work_run(instance, dg.DagsterRunStatus.STARTING)
    assert tick(db, instance)[QUEUE].passed

    # Started, and its worker died: its run lease expired.
    instance.report_run_canceled(starting)
    started = _work_run(instance, dg.DagsterRunStatus.STARTED)
    begin_run_lease(db.engine, started.run_id, WORK_JOB, lease_seconds=30)
    assert tick(db, instance) == {}  # its lease is live: still healthy, nothing to evaluate
    backdate(db.engine, schema.run_leases, "lease_expires_at", 1, run_id=started.run_id)
    evaluation = tick(db, instance)[QUEUE]
    assert not evaluation.passed
    assert evaluation.metadata["work_run_alive"].value == "no"


def test_coverage_passes_while_a_reconciliation_progresses_and_fails_when_it_stops(
    db, instance, alpha
):
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.index_status)
            .where(schema.index_status.c.scope_key == "alpha")
            .values(status="running", updated_at=ago(10))
        )
    evaluation = tick(db, instance)[COVERAGE]
    assert evaluation.passed, evaluation.description
    assert "making progress" in evaluation.description

    backdate(db.engine, schema.index_status, "updated_at", 400, scope_key="alpha")
    evaluation = tick(db, instance)[COVERAGE]
    assert not evaluation.passed
    assert "unchanged for more than 300 s" in evaluation.description


def test_steady_edits_turning_complete_coverage_stale_record_no_new_evaluation(db, instance, alpha):
    """Each edit's capture turns a complete status stale until its work is projected: the
    check reads both as covered, so an edit and its projection add no evaluation; a stale
    status that needs a reconciliation is another state."""
    status = schema.index_status.c.scope_key == "alpha"
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.index_status)
            .where(status)
            .values(status="complete", reconciliation_required=0)
        )
    first = tick(db, instance)[COVERAGE]
    assert first.passed and first.description == COVERED

    with db.engine.begin() as connection:
        connection.execute(update(schema.index_status).where(status).values(status="stale"))
    assert COVERAGE not in tick(db, instance)
    assert latest(instance, COVERAGE).description == COVERED

    with db.engine.begin() as connection:
        connection.execute(
            update(schema.index_status).where(status).values(reconciliation_required=1)
        )
    again = tick(db, instance)[COVERAGE]
    assert again.passed and "coverage stale" in again.description


def test_failed_work_fails_both_checks_with_the_advice_to_fix_the_content(db, instance, alpha):
    insert_works(db.engine, [{"content_id": "x", **failed("CODE", attempts=5)}], **of(alpha))

    evaluations = tick(db, instance)

    for key in (QUEUE, COVERAGE):
        assert not evaluations[key].passed
        assert "an edit that fixes the content re-queues its entry" in evaluations[key].description


def test_the_sensor_evaluates_a_check_exactly_when_its_latest_evaluation_is_not_the_state(
    db, instance, alpha
):
    first = tick(db, instance)
    assert set(first) == {QUEUE, COVERAGE} and first[COVERAGE].passed
    assert tick(db, instance) == {}  # nothing changed, the latest evaluations are the state

    # Another writer (a run, an "Execute") stores a newer evaluation that is not the state.
    instance.report_runless_asset_event(
        dg.AssetCheckEvaluation(
            asset_key=COVERAGE.asset_key,
            check_name=COVERAGE_CHECK,
            passed=False,
            description="coverage stale",
        )
    )
    assert latest(instance, COVERAGE).passed is False

    again = tick(db, instance)

    assert set(again) == {COVERAGE}
    assert latest(instance, COVERAGE).passed is True
    assert latest(instance, COVERAGE).description == first[COVERAGE].description


def test_executing_the_coverage_check_reads_the_database_and_tags_its_run(db, instance, alpha):
    make_collection(db.engine, "beta")
    insert_works(db.engine, [{"content_id": "x", **failed("CODE", attempts=5)}], **of(alpha))
    definitions = dg.Definitions(
        assets=coverage_assets(["alpha", "beta"]),
        jobs=[dg.define_asset_job("execute", selection=dg.AssetSelection.checks(COVERAGE))],
        resources=resources(db),
    )

    result = definitions.resolve_job_def("execute").execute_in_process(instance=instance)

    [evaluation] = result.get_asset_check_evaluations()
    assert (evaluation.asset_key, evaluation.passed) == (COVERAGE.asset_key, False)
    tags = instance.get_run_by_id(result.run_id).tags
    assert (tags[WORKFLOW_TAG], tags[COLLECTION_TAG]) == (CHECK_WORKFLOW, "alpha")
    # The executed evaluation is the latest; the sensor finds it current.
    assert tick(db, instance).get(COVERAGE) is None
