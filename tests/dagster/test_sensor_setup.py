"""Before `media-usage init`, the sensors say what to do instead of failing every tick; once
the schema was found, a tick sends only its probe, and a schema lost since is still reported; a
server that closed every connection (a restart, a failover) costs no tick."""

import uuid

import dagster as dg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from media_usage_orchestration.local.in_process_lane import LANE_SENSORS
from media_usage_orchestration.sensors import common as sensor_common
from media_usage_orchestration.sensors.projection_gc import media_usage_projection_gc_sensor
from media_usage_orchestration.sensors.queue import media_usage_queue_sensor
from media_usage_orchestration.sensors.run_health import media_usage_run_health_sensor
from media_usage_orchestration.sensors.scrubber import media_usage_scrubber_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.schema import EMDASH_TABLES, missing_tables
from tests.support.sensor_loop import evaluate, resources_for


@pytest.mark.parametrize("sensor", LANE_SENSORS, ids=lambda sensor: sensor.name)
def test_a_sensor_skips_with_the_setup_step_on_a_database_without_the_schema(empty_db, sensor):
    with dg.DagsterInstance.ephemeral() as instance:
        data = evaluate(sensor, instance, resources_for(empty_db.url))

    assert not data.run_requests
    message = data.skip_message
    assert "lacks the media usage schema" in message and "media-usage init" in message
    assert missing_tables(empty_db.engine) == [table.name for table in EMDASH_TABLES]


def test_no_table_is_missing_once_the_schema_is_installed(db):
    assert missing_tables(db.engine) == []


@pytest.mark.parametrize("sensor", LANE_SENSORS, ids=lambda sensor: sensor.name)
def test_the_schema_is_looked_at_again_only_when_the_probe_fails(db, sensor, monkeypatch):
    looked = []

    def looking(engine):
        looked.append(engine)
        return missing_tables(engine)

    monkeypatch.setattr(sensor_common, "missing_tables", looking)
    with dg.DagsterInstance.ephemeral() as instance:
        evaluate(sensor, instance, resources_for(db.url))
        evaluate(sensor, instance, resources_for(db.url))
        assert len(looked) == 1  # found on the first tick; the second sent only its probe

        with db.engine.begin() as connection:
            schema.metadata.drop_all(connection)
        data = evaluate(sensor, instance, resources_for(db.url))

    assert len(looked) == 2
    assert not data.run_requests
    assert "lacks the media usage schema" in data.skip_message


# Every sensor that reads the CMS database.
DATABASE_SENSORS = (
    *LANE_SENSORS,
    media_usage_queue_sensor,
    media_usage_run_health_sensor,
    media_usage_scrubber_sensor,
    media_usage_projection_gc_sensor,
)


@pytest.mark.postgres_only("a server that terminates its sessions; SQLite has no server")
@pytest.mark.parametrize("sensor", DATABASE_SENSORS, ids=lambda sensor: sensor.name)
def test_a_tick_after_every_session_was_terminated_reconnects(db, sensor):
    """The tick's pooled connections are all closed by the server between two ticks, each
    connection used moments before (so the ping after idleness does not apply): the next tick
    still evaluates, instead of failing on a dead connection."""
    name = f"reconnect_{uuid.uuid4().hex[:12]}"  # this test's sessions alone
    url = make_url(db.url).update_query_dict({"application_name": name})
    resources = resources_for(url.render_as_string(hide_password=False))
    with dg.DagsterInstance.ephemeral() as instance:
        # The run-health sensor reads the database only while a run of the project is in flight.
        instance.add_run(
            dg.DagsterRun(job_name="media_usage_work", status=dg.DagsterRunStatus.STARTED)
        )
        evaluate(sensor, instance, resources)
        with db.engine.connect() as connection:
            terminated = connection.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = :name"
                ),
                {"name": name},
            ).scalar_one()
        assert terminated >= 1  # the first tick left its connection in the pool
        data = evaluate(sensor, instance, resources)

    assert data.skip_message is None or "unreachable" not in data.skip_message
