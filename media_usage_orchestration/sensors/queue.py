"""The queue sensor: every live collection's work queue and coverage as observations of its
assets `media_usage_queue/<slug>` and `media_usage_coverage/<slug>`, and the evaluations of
their checks `queue_healthy` and `coverage_complete` (`assets/health.py`), reported by the tick
itself (no run is launched, so an idle deployment launches none).

A collection is observed at once when its state changes (failed or stuck work appears, changes
or clears; its coverage status, as its health sees it, or error changes), and every 5 minutes
while its numbers move or work is due (the counts, the first due item, the items completed in
the last 5 minutes, the coverage numbers, the lag): under steady edits the numbers change at
every tick, and an observation at every tick was most of the instance's growth (runless events
are never pruned). An idle, unchanged collection is not observed again. The cursor keeps, per
collection, digests of what was last observed and when (database time). A check is evaluated
whenever the verdict read now differs from its latest stored evaluation: the only writer of both
checks, so their latest evaluations are at most one tick old.

Completed work leaves nothing in the database (a completed work row is deleted, and the status
row keeps only the time of the last success), so "completed in the last 5 minutes" is what
Dagster recorded: the `media_usage/completed` counts of the collection's work runs that ended
in the last 5 minutes (last updated then, on Dagster's clock; their `media_usage/collection`
tag says which collection). Items completed elsewhere (a reconciliation's drain, EmDash's own lane) are not in it.
"""

import hashlib
import json
from dataclasses import dataclass

import dagster as dg

from media_usage_orchestration.assets.coverage_history import (
    coverage_history_key,
    coverage_observation,
)
from media_usage_orchestration.assets.health import (
    COVERAGE_CHECK,
    QUEUE_CHECK,
    Verdict,
    coverage_metadata,
    coverage_verdict,
    queue_verdict,
    run_alive,
    stale_evaluations,
    work_runs_alive,
)
from media_usage_orchestration.assets.queue import (
    completed_by_collection,
    queue_key,
    queue_observation,
)
from media_usage_orchestration.dagster_kit.default_status import automation_default_status
from media_usage_orchestration.resources.automation import MediaUsageAutomation
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.common import probe_when_ready
from media_usage_orchestration.store.core.clock import seconds_between
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.reads.coverage import (
    CollectionCoverage,
    health_status,
    read_all_coverage,
)
from media_usage_orchestration.store.reads.queue import QueueReading, WorkQueue, read_work_queues

OBSERVE_AT_LEAST_EVERY_SECONDS = 300
QUEUE_SENSOR_INTERVAL_SECONDS = 30

# slug -> (digest of what was observed, when: database time)
Observed = dict[str, tuple[str, str]]


@dg.sensor(
    minimum_interval_seconds=QUEUE_SENSOR_INTERVAL_SECONDS,
    default_status=automation_default_status(),
    description="Observes each live collection's work queue (asset media_usage_queue/<slug>: "
    "due, backing off, leased, stuck, failed, lag, completed in the last 5 minutes, the newest "
    "failures with their retry config) and coverage (asset media_usage_coverage/<slug>) when "
    "their state changes (failed or stuck work, coverage status) and every 5 minutes while "
    "their numbers move or work is due, and keeps the checks queue_healthy and "
    "coverage_complete equal to what it reads (evaluated whenever their verdict changes); "
    "launches no run.",
)
def media_usage_queue_sensor(
    context: dg.SensorEvaluationContext,
    database: MediaUsageDatabase,
    automation: MediaUsageAutomation,
):
    reading = probe_when_ready(database, read_health)
    if isinstance(reading, dg.SkipReason):
        return reading
    if not reading.queues.queues:
        return dg.SkipReason("no live collection, no queue to observe")
    completed = completed_by_collection(context.instance)
    alive = work_runs_alive(context.instance, database.engine)
    before = observed_before(context.cursor)
    observed: Observed = {}
    observations: list[dg.AssetObservation] = []
    verdicts: dict[dg.AssetCheckKey, Verdict] = {}
    read_at = reading.queues.read_at
    for queue in reading.queues.queues:
        slug = queue.collection_slug
        coverage = reading.coverage.get(queue.collection_id)
        queue_check = dg.AssetCheckKey(queue_key(slug), QUEUE_CHECK)
        verdicts[queue_check] = queue_verdict(
            queue, run_alive(alive, slug), automation.queue_stall_seconds
        )
        if coverage is not None:
            coverage_check = dg.AssetCheckKey(coverage_history_key(slug), COVERAGE_CHECK)
            verdicts[coverage_check] = coverage_verdict(
                coverage, read_at, automation.queue_stall_seconds
            )
        digest = health_digest(queue, completed[slug], coverage)
        if not _observe_again(before.get(slug), digest, read_at, bool(queue.due)):
            observed[slug] = before[slug]
            continue
        observations.append(queue_observation(queue, completed[slug]))
        if coverage is not None:
            observations.append(coverage_observation(coverage))
        observed[slug] = (digest, read_at)
    evaluations = stale_evaluations(context.instance, verdicts)
    cursor = json.dumps(observed, sort_keys=True, separators=(",", ":"))
    # No run is requested: without a reason the tick would read "empty result".
    return dg.SensorResult(
        asset_events=[*observations, *evaluations],
        skip_reason=_tick_summary(reading, observed, before, evaluations),
        cursor=cursor,
    )


def _tick_summary(reading, observed: Observed, before: Observed, evaluations) -> str:
    total = len(reading.queues.queues)
    fresh = sum(1 for slug, seen in observed.items() if before.get(slug) != seen)
    parts = [
        f"observed {fresh} of {total} collection(s)"
        if fresh
        else f"the {total} collection(s) are in the state last observed (moving numbers are "
        f"observed every {OBSERVE_AT_LEAST_EVERY_SECONDS} s)"
    ]
    if evaluations:
        changed = ", ".join(
            f"{evaluation.asset_key.path[-1]} {evaluation.check_name} "
            f"{'passed' if evaluation.passed else 'FAILED'}"
            for evaluation in evaluations
        )
        parts.append(f"evaluated {changed}")
    else:
        parts.append("every check's latest evaluation is current")
    return "; ".join(parts)


def _observe_again(
    before: tuple[str, str] | None, digest: str, read_at: str, work_due: bool
) -> bool:
    """At once when the state changed; every 5 minutes while the numbers move or work is due
    (the lag grows by itself); never while an idle collection stays as it was."""
    if before is None:
        return True
    state, _, numbers = digest.partition(":")
    state_before, _, numbers_before = before[0].partition(":")
    if state != state_before:
        return True
    if numbers == numbers_before and not work_due:
        return False
    elapsed = seconds_between(before[1], read_at)
    return elapsed is None or elapsed >= OBSERVE_AT_LEAST_EVERY_SECONDS


def health_digest(queue: WorkQueue, completed: int, coverage: CollectionCoverage | None) -> str:
    """`<state>:<numbers>`: digests of what the observations show apart from the lag (which
    grows by itself). The state is what a verdict turns on (failed and stuck work, the failures
    themselves, the coverage status as its health sees it, its error); the numbers are the rest
    (counts, the first due item, completions, the coverage counts)."""
    failures = [
        (item.content_id, item.last_error_code, item.attempt_count, item.updated_at)
        for item in queue.failed_items
    ]
    state: list = [queue.failed, queue.stuck, queue.inexact, failures]
    numbers: list = [queue.counts(), completed, queue.first_due_at]
    if coverage is not None:
        metadata = {name: str(value) for name, value in coverage_metadata(coverage).items()}
        state.append(
            [
                health_status(coverage.status, coverage.reconciliation_required),
                coverage.reconciliation_state,
                *(metadata.pop(name) for name in STATE_METADATA),
            ]
        )
        numbers.append(metadata)
    return f"{_digest(state)}:{_digest(numbers)}"


# Coverage metadata that is state, not a moving number (the status goes in as its health
# sees it instead).
STATE_METADATA = ("coverage", "failed_work", "stuck_work", "error_code", "failed_work_codes")


def _digest(shown: list) -> str:
    return hashlib.sha256(json.dumps(shown).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class HealthReading:
    """The live collections' queues, and the coverage of each registry collection by id."""

    queues: QueueReading
    coverage: dict[str, CollectionCoverage]


def read_health(engine: Engine) -> HealthReading:
    queues = read_work_queues(engine)
    coverage = {row.collection_id: row for row in read_all_coverage(engine)}
    return HealthReading(queues, coverage)


def observed_before(cursor: str | None) -> Observed:
    """The cursor's observations; one this sensor did not write (or none) observes all."""
    try:
        stored = json.loads(cursor or "{}")
        return {
            slug: (digest, observed_at)
            for slug, (digest, observed_at) in stored.items()
            if isinstance(digest, str) and isinstance(observed_at, str)
        }
    except (ValueError, TypeError, AttributeError):
        return {}
