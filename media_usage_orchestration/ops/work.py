"""The work op: claim one collection's due work (the sensor names the collection; a run launched
without one takes the collection whose work is due earliest) in batches and project each
entry, within a budget; then wait up to `linger_seconds` for more of its work, and drain that
too, so a burst of edits is projected by the run already there. The run's tags say what it did: `media_usage/outcome`
(`projected`, `failed_work`, `retrying`, `superseded`, or why it claimed nothing, such as
`nothing_due`) and the counts `media_usage/claimed`, `media_usage/completed`,
`media_usage/retried` and `media_usage/failed`."""

import dagster as dg
from pydantic import Field

from media_usage_orchestration.assets.index import record_drained_coverage
from media_usage_orchestration.ops.common import TRANSIENT_RETRY_POLICY, retry_transient_errors_only
from media_usage_orchestration.ops.progress import logged_progress
from media_usage_orchestration.ops.run_tags import (
    OUTCOME_TAG,
    launched_run,
    tag_run_collection,
    tag_run_outcome,
)
from media_usage_orchestration.processing import run_loop
from media_usage_orchestration.processing.run_loop import (
    Budget,
    Linger,
    WorkDrain,
    WorkRunOutcome,
)
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.probes import MAX_DUE_WORK_COLLECTIONS, due_work_by_collection
from media_usage_orchestration.store.registry import read_collection_slug

COUNT_TAGS = {
    "claimed": "media_usage/claimed",
    "completed": "media_usage/completed",
    "retry": "media_usage/retried",
    "failed": "media_usage/failed",
}


class DrainDueWorkConfig(dg.Config):
    collection_id: str | None = Field(
        default=None,
        description="Claim only this collection's work (the sensor sets it); unset: the work "
        "of the collection whose work is due earliest.",
    )
    max_items: int = Field(default=5000, ge=1, description="Stop after claiming this many items.")
    max_seconds: float = Field(default=120.0, gt=0, le=3600, description="Time budget.")
    batch_size: int = Field(default=25, ge=1, le=100, description="Items claimed per statement.")
    linger_seconds: float = Field(
        default=0.0,
        ge=0,
        le=600,
        description="Once drained, wait this long for more of the collection's work (asking "
        "every half second) before the run ends (the sensor sets the automation's "
        "`work_linger_seconds`).",
    )


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
    with retry_transient_errors_only(context):
        collection_id = config.collection_id or _earliest_due_collection(database.engine)
        if collection_id is None:
            context.log.info("No work is due in any collection.")
            tag_run_outcome(context, WorkRunOutcome.NOTHING_DUE.value)
            yield dg.Output(None, metadata={"outcome": WorkRunOutcome.NOTHING_DUE.value})
            return
        slug = read_collection_slug(database.engine, collection_id)
        tag_run_collection(context, slug)

        def record_burst(burst: WorkDrain) -> None:
            # Each collection's coverage as soon as its queue is empty, not when the run ends.
            record_drained_coverage(context, database.engine, burst, budget.elapsed_seconds())

        with logged_progress(context, "work", "items", total=config.max_items) as progress:
            drained = run_loop.drain_while_work_arrives(
                database.engine,
                budget,
                config.batch_size,
                collection_id,
                Linger(config.linger_seconds),
                on_burst=record_burst,
                progress=progress.counting(lambda batch: batch.counts.claimed),
            )
    context.log.info(drained.summary(slug))
    # Items that failed for good are their rows' state, not the run's: the run succeeds and
    # says so in its outcome tag, a WARNING and each collection's failing check.
    _tag_run(context, drained)
    metadata = {**drained.counts.as_dict(), "stopped_by": drained.stopped_by.value}
    yield dg.Output(None, metadata={**metadata, "outcome": drained.outcome.value})


def _earliest_due_collection(engine: Engine) -> str | None:
    """A run launched without a collection (from the Launchpad) drains one all the same, so
    that the Runs filter on its collection finds it like every sensor run."""
    due = due_work_by_collection(engine, MAX_DUE_WORK_COLLECTIONS)
    return due[0].collection_id if due else None


def _tag_run(context: dg.OpExecutionContext, drained: WorkDrain) -> None:
    """The outcome and the counts, in one write, as the run's final word."""
    if launched_run(context) is None:
        return
    counts = drained.counts.as_dict()
    tags = {tag: str(counts[name]) for name, tag in COUNT_TAGS.items()}
    context.instance.add_run_tags(context.run_id, {OUTCOME_TAG: drained.outcome.value, **tags})
