"""The work op: claim one collection's due work (the sensor names the collection; a run launched
without one takes the collection whose work is due earliest) in batches and project each
entry, within a budget; then wait up to `linger_seconds` for more of its work, and drain that
too, so a burst of edits is projected by the run already there (coverage is recorded as a
burst empties the queue, at most every 10 s while bursts follow). A lingering run gives its
slot up (it ends) when another collection's work waits for a run because the sensor's
`max_work_runs` work runs are in flight, and it is the oldest of them. The run's tags say what
it did: `media_usage/outcome` (`projected`, `failed_work`, `retrying`, `superseded`, or why it
claimed nothing, such as `nothing_due`) and the counts `media_usage/claimed`,
`media_usage/completed`, `media_usage/retried` and `media_usage/failed`."""

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import dagster as dg
from pydantic import Field

from media_usage_orchestration.assets.index import record_drained_coverage
from media_usage_orchestration.dagster_kit import progress as progress_logs
from media_usage_orchestration.dagster_kit.progress import logged_progress
from media_usage_orchestration.dagster_kit.retries import (
    retries_transient_errors,
    retry_transient_errors_only,
)
from media_usage_orchestration.dagster_kit.run_tags import (
    COLLECTION_ID_TAG,
    COUNT_TAGS,
    IN_FLIGHT_STATUSES,
    OUTCOME_TAG,
    launched_run,
    tag_run_collection,
    tag_run_outcome,
)
from media_usage_orchestration.processing.loop import run_loop
from media_usage_orchestration.processing.loop.run_loop import (
    Budget,
    Linger,
    WorkDrain,
    WorkRunOutcome,
)
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.host.registry import read_collection_slug
from media_usage_orchestration.store.reads.coverage import read_coverage_state
from media_usage_orchestration.store.reads.probes import (
    MAX_DUE_WORK_COLLECTIONS,
    due_work_by_collection,
)


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
    max_work_runs: int = Field(
        default=0,
        ge=0,
        le=64,
        description="The sensor's limit of work runs in flight (it sets the automation's "
        "`max_work_runs`): while lingering, the run ends early when another collection's work "
        "waits for a run because that many are in flight and this run is the oldest of them. "
        "0: it never does.",
    )


# Named after the function it runs (processing/loop/run_loop.py: drain_due_work), in Dagster too.
@dg.op(
    out=dg.Out(dg.Nothing),
    description="Claim due work (several items per statement, each with its own lease) and "
    "project each entry until nothing is due or the budget is spent.",
)
@retries_transient_errors
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

        coverage = CoverageRecorder(
            lambda bursts: record_drained_coverage(
                context, database.engine, bursts, budget.elapsed_seconds()
            ),
            lambda: read_coverage_state(database.engine, collection_id),
        )
        linger = _linger(context, database.engine, config, collection_id)
        with logged_progress(
            context,
            "work",
            "items",
            total=config.max_items,
            interval=progress_logs.WORK_PROGRESS_INTERVAL_SECONDS,
        ) as progress:
            drained = run_loop.drain_while_work_arrives(
                database.engine,
                budget,
                config.batch_size,
                collection_id,
                linger,
                on_burst=coverage.burst,
                progress=progress.counting(lambda batch: batch.counts.claimed),
            )
        coverage.flush()
    context.log.info(drained.summary(slug))
    for waiting in getattr(linger, "yielded_to", ()):
        context.log.info(f"Stopped waiting for more work: {waiting} waits for a work run.")
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


# --- coverage when its state changes ------------------------------------------------------


class CoverageRecorder:
    """Records the collection's coverage (a materialization of its index partition) when the
    run's first burst empties the queue, when a burst leaves items failed for good, when the
    collection's state (`state()`: its status and whether work failed for good) differs from
    the one last recorded, and when the run ends (`flush`): not at every burst, since a
    lingering run drains one per edit. The bursts in between are summed into the next
    recording; the checks are the queue sensor's, so no failure waits for a recording."""

    def __init__(self, record: Callable[[WorkDrain], None], state: Callable[[], Hashable]) -> None:
        self.record = record
        self.state = state
        self.pending: WorkDrain | None = None
        self.recorded_state: Hashable | None = None
        self.recorded = False

    def burst(self, burst: WorkDrain) -> None:
        self.pending = burst if self.pending is None else self.pending + burst
        if not self.recorded or burst.failed_by_collection:
            self.flush()
            return
        state = self.state()
        if state != self.recorded_state:
            self._record(state)

    def flush(self) -> None:
        if self.pending is not None:
            self._record(self.state())

    def _record(self, state: Hashable) -> None:
        bursts, self.pending = self.pending, None
        self.recorded_state, self.recorded = state, True
        self.record(bursts)


# --- giving the slot up ----------------------------------------------------------------------

# How often a lingering run asks whether another collection waits for a run (an index probe
# and one read of the runs in flight).
SLOT_CHECK_SECONDS = 2.0


@dataclass(frozen=True)
class YieldingLinger(Linger):
    """A `Linger` that also ends as soon as `waiting()` names a collection that waits for this
    run's slot, asked at most every `check_seconds` of waiting, counted over the run's waits
    (each edit ends a wait: they are often shorter than the interval); `yielded_to` then holds
    that collection."""

    waiting: Callable[[], str | None] = lambda: None
    check_seconds: float = SLOT_CHECK_SECONDS
    yielded_to: list[str] = field(default_factory=list)
    # Seconds waited since `waiting()` was last asked, across waits (one mutable cell).
    waited: list[float] = field(default_factory=lambda: [0.0])

    def wait_for_work(self, budget: Budget, has_due_work: Callable[[], bool]) -> bool:
        polled = [budget.clock()]

        def due_or_waiting() -> bool:
            now = budget.clock()
            self.waited[0] += now - polled[0]
            polled[0] = now
            if has_due_work():
                return True
            if self.waited[0] < self.check_seconds:
                return False
            self.waited[0] = 0.0
            waiting = self.waiting()
            if waiting is not None:
                self.yielded_to.append(waiting)
            return waiting is not None

        # The wait ends either way; only due work of this collection means "drain again".
        return super().wait_for_work(budget, due_or_waiting) and not self.yielded_to


def _linger(
    context: dg.OpExecutionContext, engine: Engine, config: DrainDueWorkConfig, collection_id: str
) -> Linger:
    if config.max_work_runs == 0 or config.linger_seconds == 0:
        return Linger(config.linger_seconds)
    return YieldingLinger(
        config.linger_seconds,
        waiting=lambda: waiting_collection(context, engine, collection_id, config.max_work_runs),
    )


def waiting_collection(
    context: dg.OpExecutionContext, engine: Engine, collection_id: str, max_work_runs: int
) -> str | None:
    """The slug of a collection whose work is due while none of its work runs is in flight
    and `max_work_runs` work runs are (so the sensor launches none for it), when this run is
    the oldest of them (so one run gives its slot up, not all); else None."""
    due = [
        each
        for each in due_work_by_collection(engine, MAX_DUE_WORK_COLLECTIONS)
        if each.collection_id != collection_id
    ]
    if not due:
        return None
    in_flight = context.instance.get_run_records(
        filters=dg.RunsFilter(job_name=context.job_name, statuses=IN_FLIGHT_STATUSES)
    )
    if len(in_flight) < max_work_runs:
        return None
    oldest = min(in_flight, key=lambda record: record.storage_id)
    if oldest.dagster_run.run_id != context.run_id:
        return None
    running = Counter(record.dagster_run.tags.get(COLLECTION_ID_TAG) for record in in_flight)
    starved = [each for each in due if running[each.collection_id] == 0]
    return starved[0].collection_slug if starved else None


def _tag_run(context: dg.OpExecutionContext, drained: WorkDrain) -> None:
    """The outcome and the counts, in one write, as the run's final word."""
    if launched_run(context) is None:
        return
    counts = drained.counts.as_dict()
    tags = {tag: str(counts[name]) for name, tag in COUNT_TAGS.items()}
    context.instance.add_run_tags(context.run_id, {OUTCOME_TAG: drained.outcome.value, **tags})
