"""What a run costs when its ops do nothing: Dagster's floor, beside the project's real runs.

`floor_job(name)` is a job of the same shape as the project's job `name`: the same op names in
the same graph, the same inputs, outputs (the claim handed from op to op), config types,
required resources and IO manager, partitions and executor, with empty bodies that hand the
claim on. Executed in the same instance and process as the real runs, its wall time is what
Dagster spends on such a run whatever the ops do (`dagster_floor_seconds`).

For any run, `run_cost` reads from the instance: its wall time (first to last event of its
event log), the sum of its steps' durations (the step stats Dagster derives from its step
events) and how many event log entries it wrote; the run's own overhead is the wall time not
spent in a step.
"""

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from media_usage_orchestration.dagster_kit.claim_io import claim_io_manager
from media_usage_orchestration.dagster_kit.leased import leased_outs
from media_usage_orchestration.jobs import media_usage_reconciliation, media_usage_work
from media_usage_orchestration.ops.reconciliation import (
    ClaimReconciliationConfig,
    DrainBudget,
    PageBudget,
)
from media_usage_orchestration.ops.work import DrainDueWorkConfig
from media_usage_orchestration.partitions import media_usage_collections
from media_usage_orchestration.store.core.leases import LeaseState
from media_usage_orchestration.store.reconciliation.records import (
    ReconciliationClaim,
    ReconciliationPhase,
)

RESOURCE_KEYS = {"database"}
# A claim handed on through the claim IO manager, as the real graph hands one on.
EMPTY_CLAIM = ReconciliationClaim(
    collection_id="floor",
    collection_slug="floor",
    run_token="floor",
    target_epoch=None,
    field_fingerprint=None,
    state=LeaseState.LEASED,
    phase=ReconciliationPhase.SCAN,
    scan_cursor=None,
    scan_upper_id=None,
    source_cursor=None,
    source_upper_key=None,
    attempt_count=0,
    next_attempt_at="",
    lease_token="floor",
    lease_expires_at=None,
    last_error_code=None,
    created_at="",
    updated_at="",
)


@dg.op(
    name="claim_reconciliation",
    out=leased_outs(ReconciliationClaim),
    required_resource_keys=RESOURCE_KEYS,
)
def _claim(config: ClaimReconciliationConfig):
    """The graph's first op, with its outputs, handing on an empty claim."""
    yield dg.Output(EMPTY_CLAIM, output_name="lease")


def _leased_op(name: str, config_type: type[dg.Config] | None) -> dg.OpDefinition:
    """An op named as a later op of the graph: takes the claim, hands it on."""
    ins = {"lease": dg.In(ReconciliationClaim)}
    outs = leased_outs(ReconciliationClaim)
    if config_type is None:

        @dg.op(name=name, ins=ins, out=outs, required_resource_keys=RESOURCE_KEYS)
        def step(lease):
            yield dg.Output(lease, output_name="lease")

        return step

    @dg.op(name=name, ins=ins, out=outs, required_resource_keys=RESOURCE_KEYS)
    def configured_step(config: config_type, lease):  # type: ignore[valid-type]
        yield dg.Output(lease, output_name="lease")

    return configured_step


def _reconciliation_floor(resources: Mapping[str, Any]) -> dg.JobDefinition:
    prepare = _leased_op("prepare_run", None)
    scan = _leased_op("scan_pages", PageBudget)
    drain = _leased_op("drain_collection_work", DrainBudget)
    sources = _leased_op("scan_sources", PageBudget)
    finalize = _leased_op("finalize_coverage", None)

    @dg.job(
        name=f"{media_usage_reconciliation.name}_floor",
        executor_def=dg.in_process_executor,
        partitions_def=media_usage_collections,
        resource_defs={**resources, "io_manager": claim_io_manager},
        tags=dict(media_usage_reconciliation.tags),
    )
    def reconciliation_floor():
        finalize(sources(drain(scan(prepare(_claim().lease).lease).lease).lease).lease)

    return reconciliation_floor


def _work_floor(resources: Mapping[str, Any]) -> dg.JobDefinition:
    @dg.op(name="drain_due_work", out=dg.Out(dg.Nothing), required_resource_keys=RESOURCE_KEYS)
    def drain_due_work(config: DrainDueWorkConfig):
        yield dg.Output(None)

    @dg.job(
        name=f"{media_usage_work.name}_floor",
        executor_def=dg.in_process_executor,
        resource_defs={**resources, "io_manager": claim_io_manager},
        tags=dict(media_usage_work.tags),
    )
    def work_floor():
        drain_due_work()

    return work_floor


FLOOR_JOBS = {
    media_usage_reconciliation.name: _reconciliation_floor,
    media_usage_work.name: _work_floor,
}


def floor_job(job_name: str, resources: Mapping[str, Any]) -> dg.JobDefinition:
    """The floor of the project's job `job_name`, bound to `resources` and the claim IO
    manager, as the definitions bind the real job."""
    return FLOOR_JOBS[job_name](resources)


def execute_floor(
    instance: dg.DagsterInstance,
    job_name: str,
    resources: Mapping[str, Any],
    partition_key: str | None,
) -> str:
    """One run of the job's floor in `instance`; its run id."""
    job = floor_job(job_name, resources)
    result = job.execute_in_process(
        instance=instance,
        partition_key=partition_key if job.partitions_def is not None else None,
        run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
    )
    return result.run_id


# --- what a run cost -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunCost:
    seconds: float  # first to last event of the run
    steps_seconds: float  # the steps' durations, summed
    events: int

    @property
    def overhead_seconds(self) -> float:
        return self.seconds - self.steps_seconds


def run_cost(instance: dg.DagsterInstance, run_id: str) -> RunCost:
    records = instance.get_records_for_run(run_id).records
    stamps = [record.timestamp for record in records]
    steps = sum(
        stats.end_time - stats.start_time
        for stats in instance.get_run_step_stats(run_id)
        if stats.start_time is not None and stats.end_time is not None
    )
    return RunCost(max(stamps) - min(stamps), steps, len(records))


def median_cost(costs: Sequence[RunCost]) -> RunCost:
    """Each number's median over the runs."""
    return RunCost(
        statistics.median(cost.seconds for cost in costs),
        statistics.median(cost.steps_seconds for cost in costs),
        round(statistics.median(cost.events for cost in costs)),
    )


def floor_record(
    real: Sequence[RunCost], floor: Sequence[RunCost]
) -> dict[str, float | int | None]:
    """The numbers the bench reports (medians): the floor run, the real runs and their
    ratio, the real runs' own overhead over the floor's wall time."""
    empty = median_cost(floor)
    record: dict[str, float | int | None] = {
        "dagster_floor_seconds": round(empty.seconds, 4),
        "floor_steps_seconds": round(empty.steps_seconds, 4),
        "floor_overhead_seconds": round(empty.overhead_seconds, 4),
        "floor_events_per_run": empty.events,
    }
    if not real:
        return record
    run = median_cost(real)
    return {
        **record,
        "run_seconds": round(run.seconds, 4),
        "run_steps_seconds": round(run.steps_seconds, 4),
        "run_overhead_seconds": round(run.overhead_seconds, 4),
        "events_per_run": run.events,
        "overhead_over_floor": round(run.overhead_seconds / empty.seconds, 3)
        if empty.seconds
        else None,
    }


__all__ = [
    "EMPTY_CLAIM",
    "RunCost",
    "execute_floor",
    "floor_job",
    "floor_record",
    "median_cost",
    "run_cost",
]
