"""Drive the project's sensors in a test through the project's own runner
(`media_usage_orchestration.local.in_process_lane`, which the demo and the benchmark use): a tick
evaluates a sensor against a real (test) instance and validates every RunRequest's run config
against its job; requested dynamic partitions are added to the instance and each requested run
is executed in process with the request's partition key, tags and run key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from media_usage_orchestration.local import in_process_lane
from media_usage_orchestration.resources.automation import MediaUsageAutomation
from media_usage_orchestration.resources.database import MediaUsageDatabase

RUN_KEY_TAG = in_process_lane.RUN_KEY_TAG


def resources_for(url: str, **automation: Any) -> dict[str, Any]:
    """The project's resources; work runs end once drained unless a test asks them to linger
    (the in-process lane executes one run at a time)."""
    automation.setdefault("work_linger_seconds", 0)
    return {
        "database": MediaUsageDatabase.for_url(url),
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
    return in_process_lane.evaluate_sensor(sensor, instance, dict(resources))


def requested_partition_keys(data) -> list[str]:
    """The dynamic partition keys a tick asked to add."""
    return [
        key for request in data.dynamic_partitions_requests or [] for key in request.partition_keys
    ]


def add_requested_partitions(instance: dg.DagsterInstance, data) -> list[str]:
    """Add the partitions a tick asked for; returns their keys."""
    in_process_lane.add_requested_partitions(instance, data)
    return requested_partition_keys(data)


def execute_request(
    sensor: dg.SensorDefinition,
    request: dg.RunRequest,
    instance: dg.DagsterInstance,
    resources: Mapping[str, Any],
) -> dg.ExecuteInProcessResult:
    """The run `sensor` requested, executed as the lane executes it; it must succeed."""
    run = in_process_lane.execute_request(instance, dict(resources), sensor.job_name, request)
    assert run.success and run.result is not None, (run.job_name, run.partition_key, run.outcome)
    return run.result


def output_metadata(
    result: dg.ExecuteInProcessResult, node: str, output_name: str = "result"
) -> dict[str, Any]:
    """The metadata an op attached to one of its outputs, as plain values."""
    for event in result.events_for_node(node):
        if event.is_successful_output and event.step_output_data.output_name == output_name:
            return plain(event.step_output_data.metadata)
    raise AssertionError(f"{node} emitted no {output_name!r} output")


# A leased step reports what it did on the one output it yields: the claim handed on, or
# `outcome` when the run stops there.
REPORTING_OUTPUTS = ("lease", "outcome")


def step_report(events: Iterable[dg.DagsterEvent], node: str) -> dict[str, Any] | None:
    """The metadata of what a leased op did (None when the node did not run). It must report
    on exactly one of its outputs."""
    reports = [
        plain(event.step_output_data.metadata)
        for event in events
        if event.step_key == node
        and event.is_successful_output
        and event.step_output_data.output_name in REPORTING_OUTPUTS
    ]
    assert len(reports) <= 1, (node, reports)
    return reports[0] if reports else None


@dataclass
class Drained:
    """What a drain did: every run it executed, per sensor, every evaluation, and the final skip
    reasons."""

    runs: dict[str, list[dg.ExecuteInProcessResult]] = field(default_factory=dict)
    run_keys: dict[str, list[str]] = field(default_factory=dict)
    partitions_added: list[str] = field(default_factory=list)
    evaluations: list[tuple[str, Any]] = field(default_factory=list)
    skip_messages: dict[str, str | None] = field(default_factory=dict)

    @property
    def ticks(self) -> int:
        return len(self.evaluations)

    def of(self, sensor: dg.SensorDefinition) -> list[dg.ExecuteInProcessResult]:
        return self.runs.get(sensor.name, [])

    def ticks_of(self, sensor: dg.SensorDefinition) -> list[Any]:
        return [data for name, data in self.evaluations if name == sensor.name]


def drain(
    instance: dg.DagsterInstance,
    resources: Mapping[str, Any],
    sensor_list: Sequence[dg.SensorDefinition],
    *,
    max_rounds: int = 200,
) -> Drained:
    """`in_process_lane.run_lane` over `sensor_list`: tick every sensor in turn and execute what
    each asks for, until a whole round asks for nothing (no run, no new partition). Every run
    must succeed."""
    drained = Drained()
    sensor_of_job = {sensor.job_name: sensor.name for sensor in sensor_list}

    def heard_tick(sensor: dg.SensorDefinition, data) -> None:
        drained.evaluations.append((sensor.name, data))
        drained.skip_messages[sensor.name] = data.skip_message
        drained.partitions_added.extend(requested_partition_keys(data))

    def heard_run(run: in_process_lane.LaneRun) -> None:
        if run.result is None:
            return
        assert run.success, (run.job_name, run.partition_key, run.outcome)
        sensor = sensor_of_job[run.job_name]
        drained.runs.setdefault(sensor, []).append(run.result)
        run_key = run.result.dagster_run.tags.get(RUN_KEY_TAG)
        drained.run_keys.setdefault(sensor, []).append(run_key)

    in_process_lane.run_lane(
        instance,
        dict(resources),
        sensors=sensor_list,
        max_rounds=max_rounds,
        on_tick=heard_tick,
        on_run=heard_run,
    )
    return drained
