"""The work op: claim due work in batches and project each entry, within a budget."""

import dagster as dg
from pydantic import Field

from ..processing.run_loop import Budget, drain_due_work
from ..resources.database import MediaUsageDatabase
from .common import TRANSIENT_RETRY_POLICY, retry_transient_errors_only
from .coverage import FAILED_WORK_OUTCOME, record_drained_coverage
from .leased import tag_run_outcome
from .progress import logged_progress


class ProcessDueWorkConfig(dg.Config):
    max_items: int = Field(default=5000, ge=1, description="Stop after claiming this many items.")
    max_seconds: float = Field(default=120.0, gt=0, le=3600, description="Time budget.")
    batch_size: int = Field(default=25, ge=1, le=100, description="Items claimed per statement.")


# The op keeps its original name: run history, re-execution and run configs refer to it.
@dg.op(
    name="process_due_work",
    out=dg.Out(dg.Nothing),
    retry_policy=TRANSIENT_RETRY_POLICY,
    description="Claim due work (several items per statement, each with its own lease) and "
    "project each entry until nothing is due or the budget is spent.",
)
def project_due_work(
    context: dg.OpExecutionContext, config: ProcessDueWorkConfig, database: MediaUsageDatabase
):
    budget = Budget(config.max_items, config.max_seconds)
    with retry_transient_errors_only():
        with logged_progress(context, "work", "items", total=config.max_items) as progress:
            drained = drain_due_work(
                database.engine,
                budget,
                config.batch_size,
                progress=progress.counting(lambda batch: batch.claimed_count),
            )
        record_drained_coverage(context, database.engine, drained, budget.elapsed_seconds())
    totals = dict(drained.counts)
    context.log.info(f"work: {totals} (stopped: {drained.stopped_by.value})")
    # Items that failed for good are their rows' state, not the run's: the run succeeds and
    # says so in its outcome tag, a WARNING and each collection's failing check.
    tag_run_outcome(context, FAILED_WORK_OUTCOME if totals["failed"] else drained.stopped_by.value)
    yield dg.Output(None, metadata={**totals, "stopped_by": drained.stopped_by.value})
