"""The work op: claim due work in batches and project each entry, within a budget."""

import dagster as dg
from pydantic import Field

from media_usage_orchestration.assets.index import FAILED_WORK_OUTCOME, record_drained_coverage
from media_usage_orchestration.ops.common import TRANSIENT_RETRY_POLICY, retry_transient_errors_only
from media_usage_orchestration.ops.leased import tag_run_outcome
from media_usage_orchestration.ops.progress import logged_progress
from media_usage_orchestration.processing import run_loop
from media_usage_orchestration.processing.run_loop import Budget
from media_usage_orchestration.resources.database import MediaUsageDatabase


class DrainDueWorkConfig(dg.Config):
    max_items: int = Field(default=5000, ge=1, description="Stop after claiming this many items.")
    max_seconds: float = Field(default=120.0, gt=0, le=3600, description="Time budget.")
    batch_size: int = Field(default=25, ge=1, le=100, description="Items claimed per statement.")


# Named after the function it runs (processing/run_loop.py: drain_due_work), in Dagster too.
@dg.op(
    out=dg.Out(dg.Nothing),
    retry_policy=TRANSIENT_RETRY_POLICY,
    description="Claim due work (several items per statement, each with its own lease) and "
    "project each entry until nothing is due or the budget is spent.",
)
def drain_due_work(
    context: dg.OpExecutionContext, config: DrainDueWorkConfig, database: MediaUsageDatabase
):
    budget = Budget(config.max_items, config.max_seconds)
    with retry_transient_errors_only():
        with logged_progress(context, "work", "items", total=config.max_items) as progress:
            drained = run_loop.drain_due_work(
                database.engine,
                budget,
                config.batch_size,
                progress=progress.counting(lambda batch: batch.counts.claimed),
            )
        record_drained_coverage(context, database.engine, drained, budget.elapsed_seconds())
    totals = drained.counts.as_dict()
    context.log.info(f"work: {totals} (stopped: {drained.stopped_by.value})")
    # Items that failed for good are their rows' state, not the run's: the run succeeds and
    # says so in its outcome tag, a WARNING and each collection's failing check.
    tag_run_outcome(context, FAILED_WORK_OUTCOME if totals["failed"] else drained.stopped_by.value)
    yield dg.Output(None, metadata={**totals, "stopped_by": drained.stopped_by.value})
