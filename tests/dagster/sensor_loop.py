"""Drive the project's sensors and jobs the way the daemon would, synchronously, in a test.

A tick evaluates a sensor against a real (test) instance; every RunRequest's run config is
validated against its job, requested dynamic partitions are added to the instance, and each
requested run is executed in process with the request's partition key, tags and run key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from media_usage_orchestration import jobs, sensors
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.resources.automation import MediaUsageAutomation
from media_usage_orchestration.resources.database import MediaUsageDatabase

RUN_KEY_TAG = "dagster/run_key"

JOB_OF_SENSOR: dict[str, dg.JobDefinition] = {
    sensors.media_usage_work_sensor.name: jobs.media_usage_work,
    sensors.media_usage_reconciliation_sensor.name: jobs.media_usage_reconciliation,
    sensors.media_usage_collection_deletion_sensor.name: jobs.media_usage_collection_deletion,
    sensors.media_usage_projection_gc_sensor.name: jobs.media_usage_projection_gc,
}


def resources_for(url: str, **automation: Any) -> dict[str, Any]:
    return {
        "database": MediaUsageDatabase(url=url),
        "automation": MediaUsageAutomation(**automation),
    }


def resources(db) -> dict[str, Any]:
    """The project's resources for a test database, automation at its defaults."""
    return resources_for(db.url)


def plain(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Dagster metadata as plain values."""
    return {key: getattr(value, "value", value) for key, value in metadata.items()}


def evaluate(
    sensor: dg.SensorDefinition, instance: dg.DagsterInstance, resources: Mapping[str, Any]
):
    """One tick; every RunRequest's run config must be valid for the sensor's job."""
    with (
        dg.build_sensor_context(
            instance=instance, resources=dict(resources), definitions=defs
        ) as context,
        dg.partition_loading_context(dynamic_partitions_store=instance),
    ):
        data = sensor.evaluate_tick(context)
    job = JOB_OF_SENSOR[sensor.name]
    for request in data.run_requests or []:
        dg.validate_run_config(job, request.run_config)
    return data


def add_requested_partitions(instance: dg.DagsterInstance, data) -> list[str]:
    added = []
    for request in data.dynamic_partitions_requests or []:
        assert isinstance(request, dg.AddDynamicPartitionsRequest), request
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        added.extend(request.partition_keys)
    return added


def execute_request(
    job: dg.JobDefinition,
    request: dg.RunRequest,
    instance: dg.DagsterInstance,
    resources: Mapping[str, Any],
) -> dg.ExecuteInProcessResult:
    tags = dict(request.tags or {})
    if request.run_key:
        tags[RUN_KEY_TAG] = request.run_key
    return job.execute_in_process(
        run_config=request.run_config,
        instance=instance,
        resources={"database": resources["database"]},
        partition_key=request.partition_key,
        tags=tags,
    )


def output_metadata(
    result: dg.ExecuteInProcessResult, node: str, output_name: str = "result"
) -> dict[str, Any]:
    """The metadata an op attached to one of its outputs, as plain values."""
    for event in result.events_for_node(node):
        if event.is_successful_output and event.step_output_data.output_name == output_name:
            return plain(event.step_output_data.metadata)
    raise AssertionError(f"{node} emitted no {output_name!r} output")


@dataclass
class Drained:
    """What a drain loop did: every run it executed, per sensor, and the final skip reasons."""

    runs: dict[str, list[dg.ExecuteInProcessResult]] = field(default_factory=dict)
    run_keys: dict[str, list[str]] = field(default_factory=dict)
    partitions_added: list[str] = field(default_factory=list)
    ticks: int = 0
    skip_messages: dict[str, str | None] = field(default_factory=dict)

    def of(self, sensor: dg.SensorDefinition) -> list[dg.ExecuteInProcessResult]:
        return self.runs.get(sensor.name, [])


def drain(
    instance: dg.DagsterInstance,
    resources: Mapping[str, Any],
    sensor_list: Sequence[dg.SensorDefinition],
    *,
    max_rounds: int = 200,
) -> Drained:
    """Tick every sensor in turn and execute what each asks for, until a whole round asks for
    nothing (no run, no new partition)."""
    drained = Drained()
    for _ in range(max_rounds):
        progressed = False
        for sensor in sensor_list:
            data = evaluate(sensor, instance, resources)
            drained.ticks += 1
            added = add_requested_partitions(instance, data)
            drained.partitions_added.extend(added)
            progressed = progressed or bool(added)
            requests = data.run_requests or []
            drained.skip_messages[sensor.name] = data.skip_message
            for request in requests:
                result = execute_request(JOB_OF_SENSOR[sensor.name], request, instance, resources)
                assert result.success
                drained.runs.setdefault(sensor.name, []).append(result)
                drained.run_keys.setdefault(sensor.name, []).append(request.run_key)
                progressed = True
        if not progressed:
            return drained
    raise AssertionError(f"the sensors still asked for runs after {max_rounds} rounds")
