"""The run-health sensor fails a run whose worker is gone: its run lease expired on the
database clock, or it never took one within a lease's length of database time; a CANCELING run
whose worker is gone is marked canceled. Live runs, and runs that ended meanwhile, are left
alone. Time moves by backdating rows and cursors, never by sleeping."""

from __future__ import annotations

import json

import dagster as dg
import pytest
from sqlalchemy import select

from media_usage_orchestration.dagster_kit.run_tags import OUTCOME_TAG
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.processing.loop.run_heartbeat import RUN_LEASE_SECONDS, RunHeartbeat
from media_usage_orchestration.sensors.run_health import (
    MISSING_LEASE_GRACE_SECONDS,
    WORKER_LOST,
    media_usage_run_health_sensor,
)
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.runs.run_leases import begin_run_lease, database_now
from tests.support.factories import ago
from tests.support.sensor_loop import resources_for
from tests.support.states import backdate

WORK = "media_usage_work"


def _tick(db, instance, cursor: str | None = None):
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, resources=resources_for(db.url), definitions=defs
    ) as context:
        data = media_usage_run_health_sensor.evaluate_tick(context)
    assert not data.run_requests
    return data


def _started(instance, job_name: str = WORK, status=dg.DagsterRunStatus.STARTED) -> dg.DagsterRun:
    run = dg.DagsterRun(job_name=job_name, status=status)
    instance.add_run(run)
    return run


def _status(instance, run: dg.DagsterRun) -> dg.DagsterRunStatus:
    return instance.get_run_by_id(run.run_id).status


def test_a_run_whose_lease_is_live_is_left_alone(db, instance):
    run = _started(instance)
    assert begin_run_lease(db.engine, run.run_id, WORK, RUN_LEASE_SECONDS) is not None

    data = _tick(db, instance)

    assert _status(instance, run) is dg.DagsterRunStatus.STARTED
    assert "all alive" in data.skip_message


def test_a_run_whose_lease_expired_is_failed_and_tagged(db, instance):
    dead, alive = _started(instance), _started(instance)
    for run in (dead, alive):
        begin_run_lease(db.engine, run.run_id, WORK, RUN_LEASE_SECONDS)
    backdate(db.engine, schema.run_leases, "lease_expires_at", 1, run_id=dead.run_id)

    data = _tick(db, instance)

    failed = instance.get_run_by_id(dead.run_id)
    assert failed.status is dg.DagsterRunStatus.FAILURE
    assert failed.tags[OUTCOME_TAG] == WORKER_LOST
    assert _status(instance, alive) is dg.DagsterRunStatus.STARTED
    assert f"{dead.run_id} failed" in data.skip_message
    (failure,) = instance.all_logs(dead.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    assert "run lease expired" in failure.message


def test_a_canceling_run_whose_worker_is_gone_is_marked_canceled(db, instance):
    run = _started(instance, status=dg.DagsterRunStatus.CANCELING)
    begin_run_lease(db.engine, run.run_id, WORK, RUN_LEASE_SECONDS)
    backdate(db.engine, schema.run_leases, "lease_expires_at", 1, run_id=run.run_id)

    _tick(db, instance)

    assert _status(instance, run) is dg.DagsterRunStatus.CANCELED


def test_a_run_without_a_lease_gets_a_lease_length_of_database_time(db, instance):
    run = _started(instance)

    first = _tick(db, instance)
    assert _status(instance, run) is dg.DagsterRunStatus.STARTED
    seen = json.loads(first.cursor)[run.run_id]
    assert seen <= database_now(db.engine)

    # A tick within the grace keeps waiting (and keeps when it first saw the run).
    again = _tick(db, instance, first.cursor)
    assert json.loads(again.cursor) == {run.run_id: seen}
    assert _status(instance, run) is dg.DagsterRunStatus.STARTED

    # A lease's length of database time later, still without one: dead.
    earlier = json.dumps({run.run_id: _ago(db, MISSING_LEASE_GRACE_SECONDS + 1)})
    last = _tick(db, instance, earlier)
    assert _status(instance, run) is dg.DagsterRunStatus.FAILURE
    assert last.cursor is None


def test_a_run_that_takes_its_lease_late_is_not_failed(db, instance):
    run = _started(instance)
    first = _tick(db, instance)
    heartbeat = RunHeartbeat(db.engine, run.run_id, WORK).start()  # the database came back
    try:
        earlier = json.dumps({run.run_id: _ago(db, MISSING_LEASE_GRACE_SECONDS + 1)})
        data = _tick(db, instance, earlier)
    finally:
        heartbeat.stop()
    assert first.cursor is not None and data.cursor is None
    assert _status(instance, run) is dg.DagsterRunStatus.STARTED


def test_finished_runs_and_runs_of_unknown_jobs_are_never_judged(db, instance):
    finished = _started(instance)
    begin_run_lease(db.engine, finished.run_id, WORK, RUN_LEASE_SECONDS)
    backdate(db.engine, schema.run_leases, "lease_expires_at", 1, run_id=finished.run_id)
    instance.report_run_canceled(finished)
    other = _started(instance, job_name="someone_elses_job")

    data = _tick(db, instance, json.dumps({other.run_id: _ago(db, 3600)}))

    assert _status(instance, finished) is dg.DagsterRunStatus.CANCELED
    assert _status(instance, other) is dg.DagsterRunStatus.STARTED
    assert data.skip_message == "no run in flight"


@pytest.mark.sqlite_only("one database without EmDash's later tables is enough")
def test_a_database_without_run_leases_is_never_judged(emdash, instance):
    run = _started(instance)
    data = _tick(emdash, instance, json.dumps({run.run_id: "2000-01-01T00:00:00.000Z"}))
    assert "media-usage init" in data.skip_message
    assert _status(instance, run) is dg.DagsterRunStatus.STARTED


def _ago(db, seconds: int) -> str:
    """Database time `seconds` ago, as the cursor records it."""
    with db.engine.connect() as connection:
        return connection.execute(select(ago(seconds))).scalar_one()
