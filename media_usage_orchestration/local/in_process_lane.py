"""Run the automatic lane in this process: evaluate the sensors as the daemon would and execute
every run they request, until nothing is requested.

This is what the daemon does on a schedule; doing it in a loop serves the demo, the benchmark
and the end-to-end tests. Runs are real Dagster runs in the given instance.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from media_usage_orchestration.definitions import defs
from media_usage_orchestration.sensors.deletion import media_usage_collection_deletion_sensor
from media_usage_orchestration.sensors.reconciliation import media_usage_reconciliation_sensor
from media_usage_orchestration.sensors.work import media_usage_work_sensor

RUN_KEY_TAG = "dagster/run_key"
LANE_SENSORS: tuple[dg.SensorDefinition, ...] = (
    media_usage_collection_deletion_sensor,
    media_usage_reconciliation_sensor,
    media_usage_work_sensor,
)


@dataclass(frozen=True)
class LaneRun:
    job_name: str
    partition_key: str | None
    success: bool
    outcome: str | None
    result: dg.ExecuteInProcessResult | None = field(default=None, compare=False, repr=False)


def evaluate_sensor(
    sensor: dg.SensorDefinition, instance: dg.DagsterInstance, resources: Mapping[str, Any]
) -> dg.SensorResult | Any:
    """One tick; every RunRequest's run config must be valid for the sensor's job."""
    with (
        dg.build_sensor_context(
            instance=instance, resources=resources, definitions=defs
        ) as context,
        dg.partition_loading_context(dynamic_partitions_store=instance),
    ):
        data = sensor.evaluate_tick(context)
    if data.run_requests:  # a sensor that launches no runs has no job
        job = defs.resolve_job_def(sensor.job_name)
        for request in data.run_requests:
            dg.validate_run_config(job, request.run_config)
    return data


def run_lane(
    instance: dg.DagsterInstance,
    resources: Mapping[str, Any],
    *,
    sensors: Sequence[dg.SensorDefinition] = LANE_SENSORS,
    max_rounds: int = 1000,
    log_level: str | None = None,
    on_run: Callable[[LaneRun], None] | None = None,
    on_tick: Callable[[dg.SensorDefinition, Any], None] | None = None,
) -> list[LaneRun]:
    """Tick the sensors and execute their requests until a round requests nothing;
    `on_tick` hears of each evaluation before its requests run, `on_run` of each run as it
    ends."""
    runs: list[LaneRun] = []
    for _ in range(max_rounds):
        requested = False
        for sensor in sensors:
            for run in _tick(sensor, instance, resources, log_level, on_tick):
                requested = True
                runs.append(run)
                if on_run is not None:
                    on_run(run)
        if not requested:
            return runs
    raise RuntimeError(f"The lane was still busy after {max_rounds} rounds")


def quiet_run_config(run_config: Mapping[str, Any] | None = None, log_level: str = "WARNING"):
    """`run_config` with the console logger raised to `log_level` (demo and benchmark output)."""
    return {**(run_config or {}), "loggers": {"console": {"config": {"log_level": log_level}}}}


def _tick(
    sensor: dg.SensorDefinition,
    instance: dg.DagsterInstance,
    resources: Mapping[str, Any],
    log_level: str | None,
    on_tick: Callable[[dg.SensorDefinition, Any], None] | None,
) -> Iterator[LaneRun]:
    data = evaluate_sensor(sensor, instance, resources)
    if on_tick is not None:
        on_tick(sensor, data)
    for _request in add_requested_partitions(instance, data):
        yield LaneRun("partitions", None, True, "added")
    for request in data.run_requests:
        yield execute_request(instance, resources, sensor.job_name, request, log_level=log_level)


def add_requested_partitions(
    instance: dg.DagsterInstance, data: Any
) -> list[dg.AddDynamicPartitionsRequest]:
    """Add the dynamic partitions a tick asked for; returns the requests it carried out."""
    requests = list(data.dynamic_partitions_requests or [])
    for request in requests:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return requests


def execute_request(
    instance: dg.DagsterInstance,
    resources: Mapping[str, Any],
    job_name: str,
    request: dg.RunRequest,
    *,
    log_level: str | None = None,
) -> LaneRun:
    """The run a sensor requested, with its config, partition, tags and run key."""
    return execute_job(
        instance,
        resources,
        job_name,
        run_config=request.run_config,
        tags=_with_run_key(request),
        partition_key=request.partition_key,
        log_level=log_level,
    )


def execute_job(
    instance: dg.DagsterInstance,
    resources: Mapping[str, Any],
    job_name: str,
    *,
    run_config: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    partition_key: str | None = None,
    log_level: str | None = None,
) -> LaneRun:
    """One real run of the job in this process; a failed run is reported, not raised."""
    result = defs.resolve_job_def(job_name).execute_in_process(
        run_config=quiet_run_config(run_config, log_level) if log_level else run_config,
        instance=instance,
        resources=resources,
        tags=tags,
        partition_key=partition_key,
        raise_on_error=False,
    )
    return LaneRun(job_name, partition_key, result.success, last_outcome(result), result)


def _with_run_key(request: dg.RunRequest) -> dict[str, str]:
    """The request's tags plus its run key, as the daemon tags the runs it launches."""
    tags = dict(request.tags or {})
    if request.run_key:
        tags[RUN_KEY_TAG] = request.run_key
    return tags


def last_outcome(result: dg.ExecuteInProcessResult) -> str | None:
    """The outcome metadata of the last op that reported one."""
    outcome = None
    for event in result.all_node_events:
        if event.event_type_value != "STEP_OUTPUT":
            continue
        data = event.event_specific_data
        if "outcome" in data.metadata:
            outcome = data.metadata["outcome"].value
    return outcome
