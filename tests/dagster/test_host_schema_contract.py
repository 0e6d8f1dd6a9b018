"""The host-schema contract in Dagster: on a database where a later EmDash ran a media usage
migration the project does not know, every sensor and the maintenance schedule skip with one
line naming it, and every job fails before its first op with nothing changed. EmDash 0.34.0's
own database, and a database without `_emdash_migrations`, run as before."""

from __future__ import annotations

import datetime
import weakref

import dagster as dg
import pytest

from media_usage_orchestration.dagster_kit.run_tags import OUTCOME_TAG
from media_usage_orchestration.local.in_process_lane import LANE_SENSORS, execute_job
from media_usage_orchestration.resources import database as database_module
from media_usage_orchestration.schedules import media_usage_maintenance_schedule
from media_usage_orchestration.sensors import common as sensor_common
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import OperationalError
from media_usage_orchestration.store.core.host_schema import read_host_schema
from media_usage_orchestration.values.host_schema import EMDASH_RELEASE
from tests.support.emdash_migrations import (
    LATER_MIGRATION,
    as_later_emdash,
    remove_migration,
)
from tests.support.sensor_loop import evaluate, resources
from tests.support.states import set_activation, snapshot

WRITING_JOBS = (
    "media_usage_activation",
    "media_usage_maintenance",
    "media_usage_projection_gc",
    "media_usage_work",
)


@pytest.fixture(autouse=True)
def schema_unseen(monkeypatch):
    """Test schemas are pooled and their URLs reused: no engine starts as "schema found"."""
    monkeypatch.setattr(sensor_common, "_schema_found", weakref.WeakSet())


@pytest.fixture
def later(emdash):
    """EmDash's database after a later EmDash: an unknown media usage migration recorded."""
    as_later_emdash(emdash.engine)
    return emdash


def refusal(database) -> str:
    line = read_host_schema(database.engine).write_refusal()
    assert line is not None and LATER_MIGRATION in line
    return line


def run_steps(run) -> list[str]:
    return [event.step_key for event in run.result.all_events if event.is_step_start]


@pytest.mark.parametrize("sensor", LANE_SENSORS, ids=lambda sensor: sensor.name)
def test_a_sensor_skips_naming_the_unknown_migration(later, sensor):
    with dg.DagsterInstance.ephemeral() as instance:
        data = evaluate(sensor, instance, resources(later))

    assert not data.run_requests
    assert data.skip_message == refusal(later)
    assert "upgrade media_usage_orchestration" in data.skip_message


def test_the_maintenance_schedule_skips_naming_the_unknown_migration(later):
    scheduled = datetime.datetime(2026, 11, 30, 4, 0, tzinfo=datetime.UTC)
    with (
        dg.DagsterInstance.ephemeral() as instance,
        dg.build_schedule_context(
            instance=instance, scheduled_execution_time=scheduled, resources=resources(later)
        ) as context,
    ):
        tick = media_usage_maintenance_schedule.evaluate_tick(context)

    assert not tick.run_requests
    assert tick.skip_message == refusal(later)


def test_the_contract_is_read_with_the_schema_check_and_again_while_it_refuses(later, monkeypatch):
    reads = []

    def reading(engine):
        reads.append(engine)
        return read_host_schema(engine)

    monkeypatch.setattr(sensor_common, "read_host_schema", reading)
    sensor = LANE_SENSORS[0]
    with dg.DagsterInstance.ephemeral() as instance:
        for _ in range(2):
            assert evaluate(sensor, instance, resources(later)).skip_message == refusal(later)
        assert len(reads) == 2  # a refusing database is never cached as ready

        remove_migration(later.engine, LATER_MIGRATION)  # as if the project knew it now
        evaluate(sensor, instance, resources(later))
        evaluate(sensor, instance, resources(later))

    assert len(reads) == 3  # found ready once; the next tick sent only its probe


def test_on_an_older_emdash_without_its_tables_a_sensor_says_to_upgrade_emdash(emdash):
    remove_migration(emdash.engine, "066_media_usage_reconciliation")
    with emdash.engine.begin() as connection:  # as EmDash 0.33.0 left the database
        schema.reconciliations.drop(connection)
    with dg.DagsterInstance.ephemeral() as instance:
        data = evaluate(LANE_SENSORS[0], instance, resources(emdash))

    assert not data.run_requests
    assert "lacks the media usage schema" in data.skip_message
    assert f"upgrade EmDash to {EMDASH_RELEASE}" in data.skip_message


@pytest.mark.parametrize("job_name", WRITING_JOBS)
def test_a_job_fails_before_its_first_op_changing_nothing(later, job_name):
    before = snapshot(later.engine)
    with dg.DagsterInstance.ephemeral() as instance:
        run = execute_job(instance, resources(later), job_name)
        tags = instance.get_run_by_id(run.result.run_id).tags

    assert not run.success
    assert run_steps(run) == []
    assert tags[OUTCOME_TAG] == "unknown_emdash_migration"
    failure = next(event for event in run.result.all_events if event.is_run_failure)
    assert LATER_MIGRATION in str(failure.event_specific_data.error)
    assert snapshot(later.engine) == before


def test_a_contract_unread_at_run_start_is_read_before_the_first_write(later, monkeypatch):
    """A database error at run start is left to the op's retry policy (as before the
    contract); the op's first use of the engine then reads the contract and refuses."""
    checks = []
    real = database_module.refuse_unknown_migrations

    def unreachable_once(engine):
        checks.append(engine)
        if len(checks) == 1:
            raise OperationalError("SELECT 1", {}, Exception("connection refused"))
        return real(engine)

    monkeypatch.setattr(database_module, "refuse_unknown_migrations", unreachable_once)
    before = snapshot(later.engine)
    with dg.DagsterInstance.ephemeral() as instance:
        run = execute_job(instance, resources(later), "media_usage_activation")
        tags = instance.get_run_by_id(run.result.run_id).tags

    assert not run.success
    assert len(checks) == 2
    assert run_steps(run) == ["activate_capture"]  # one attempt: the refusal is not retried
    assert tags[OUTCOME_TAG] == "unknown_emdash_migration"
    assert snapshot(later.engine) == before


def test_emdash_0_34_0s_database_runs_its_jobs(emdash):
    with dg.DagsterInstance.ephemeral() as instance:
        run = execute_job(instance, resources(emdash), "media_usage_projection_gc")

    assert run.success, run.outcome


def test_a_database_without_the_record_runs_its_jobs_as_before(db):
    set_activation(db.engine, state="expanded")
    with dg.DagsterInstance.ephemeral() as instance:
        run = execute_job(instance, resources(db), "media_usage_activation")

    assert run.success and run.outcome == "active"
    assert read_host_schema(db.engine).recorded is None
