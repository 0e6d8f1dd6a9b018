"""Before `media-usage init`, the sensors say what to do instead of failing every tick; once
the schema was found, a tick sends only its probe, and a schema lost since is still reported."""

import dagster as dg
import pytest

from media_usage_orchestration.local.in_process_lane import LANE_SENSORS
from media_usage_orchestration.sensors import common as sensor_common
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
