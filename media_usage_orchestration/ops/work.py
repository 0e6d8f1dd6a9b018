"""The work op: claim due work in batches and project each entry, within a budget."""

import time
from collections import Counter

import dagster as dg
from pydantic import Field

from ..processing.work import WorkBatchResult, process_due_batch
from ..resources.database import MediaUsageDatabase
from .common import TRANSIENT_RETRY_POLICY, retry_transient_errors_only
from .coverage import record_coverage

COUNTED = ("claimed", "completed", "retry", "failed", "superseded", "obsolete", "claim_lost")


class ProcessDueWorkConfig(dg.Config):
    max_items: int = Field(default=5000, ge=1, description="Stop after claiming this many items.")
    max_seconds: float = Field(default=120.0, gt=0, le=3600, description="Time budget.")
    batch_size: int = Field(default=25, ge=1, le=100, description="Items claimed per statement.")


def _add(totals: dict[str, int], batch: WorkBatchResult) -> None:
    for name in COUNTED:
        totals[name] += getattr(batch, f"{name}_count")


@dg.op(
    out=dg.Out(dg.Nothing),
    retry_policy=TRANSIENT_RETRY_POLICY,
    description="Claim due work (several items per statement, each with its own lease) and "
    "project each entry until nothing is due or the budget is spent.",
)
def process_due_work(
    context: dg.OpExecutionContext, config: ProcessDueWorkConfig, database: MediaUsageDatabase
):
    totals = dict.fromkeys(COUNTED, 0)
    completed_by_collection: Counter[tuple[str, str]] = Counter()
    started = time.monotonic()
    deadline = started + config.max_seconds
    stopped_by = "nothing_due"
    with retry_transient_errors_only():
        while True:
            if totals["claimed"] >= config.max_items or time.monotonic() >= deadline:
                stopped_by = "budget"
                break
            size = min(config.batch_size, config.max_items - totals["claimed"])
            batch = process_due_batch(database.engine, size)
            if batch.inactive:
                stopped_by = "inactive"
                break
            _add(totals, batch)
            completed_by_collection.update(batch.completed_by_collection)
            if batch.claimed_count == 0:
                break
        duration = time.monotonic() - started
        for (collection_id, slug), completed in sorted(completed_by_collection.items()):
            record_coverage(
                context,
                database.engine,
                collection_id,
                slug,
                duration_seconds=duration,
                entries_projected=completed,
            )
    context.log.info(f"work: {totals} (stopped: {stopped_by})")
    yield dg.Output(None, metadata={**totals, "stopped_by": stopped_by})
