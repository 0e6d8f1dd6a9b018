"""The queue sensor: every live collection's work queue as an observation of its asset
`media_usage_queue/<slug>` and an evaluation of its check `queue_healthy`, reported by the tick
itself (no run is launched, so an idle deployment launches none).

A collection is observed when its numbers change (the counts, the first due item, the newest
failures, the items completed in the last 5 minutes) and at least every 5 minutes, so its lag
keeps plotting while nothing moves: the cursor keeps, per collection, a digest of what was last
observed and when (database time).

Completed work leaves nothing in the database (a completed work row is deleted, and the status
row keeps only the time of the last success), so "completed in the last 5 minutes" is what
Dagster recorded: the `media_usage/completed` counts of the collection's work runs that ended
in the last 5 minutes (last updated then, on Dagster's clock; their `media_usage/collection`
tag says which collection). Items completed elsewhere (a reconciliation's drain, EmDash's own lane) are not in it.
"""

import hashlib
import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import dagster as dg

from media_usage_orchestration.assets.queue import (
    COMPLETED_WINDOW_SECONDS,
    queue_check_evaluation,
    queue_observation,
)
from media_usage_orchestration.jobs import media_usage_work
from media_usage_orchestration.ops.common import automation_default_status
from media_usage_orchestration.ops.run_tags import COLLECTION_TAG
from media_usage_orchestration.ops.work import COUNT_TAGS
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.common import probe_when_ready
from media_usage_orchestration.store.core.clock import seconds_between
from media_usage_orchestration.store.queue import QueueReading, WorkQueue, read_work_queues

OBSERVE_AT_LEAST_EVERY_SECONDS = 300
# Work runs end a few a minute per collection; more than this in 5 minutes are not counted.
MAX_RECENT_WORK_RUNS = 1000

# slug -> (digest of what was observed, when: database time)
Observed = dict[str, tuple[str, str]]


@dg.sensor(
    minimum_interval_seconds=30,
    default_status=automation_default_status(),
    description="Observes each live collection's work queue (asset media_usage_queue/<slug>: "
    "due, backing off, leased, stuck, failed, lag, completed in the last 5 minutes, the newest "
    "failures with their retry config) and evaluates its check queue_healthy, when the numbers "
    "change and at least every 5 minutes; launches no run.",
)
def media_usage_queue_sensor(context: dg.SensorEvaluationContext, database: MediaUsageDatabase):
    reading = probe_when_ready(database, read_work_queues)
    if isinstance(reading, dg.SkipReason):
        return reading
    if not reading.queues:
        return dg.SkipReason("no live collection, no queue to observe")
    completed = completed_by_collection(context.instance)
    before = observed_before(context.cursor)
    observed: Observed = {}
    events: list[dg.AssetObservation | dg.AssetCheckEvaluation] = []
    for queue in reading.queues:
        slug = queue.collection_slug
        digest = queue_digest(queue, completed[slug])
        if not _observe_again(before.get(slug), digest, reading):
            observed[slug] = before[slug]
            continue
        events += [queue_observation(queue, completed[slug]), queue_check_evaluation(queue)]
        observed[slug] = (digest, reading.read_at)
    cursor = json.dumps(observed, sort_keys=True, separators=(",", ":"))
    fresh = len(events) // 2
    if not fresh:
        return dg.SensorResult(
            skip_reason=f"the queues of {len(reading.queues)} collection(s) are as last "
            f"observed (each is observed again within {OBSERVE_AT_LEAST_EVERY_SECONDS} s)",
            cursor=cursor,
        )
    # No run is requested: without a reason the tick would read "empty result".
    return dg.SensorResult(
        asset_events=events,
        skip_reason=f"observed the queues of {fresh} of {len(reading.queues)} collection(s)",
        cursor=cursor,
    )


def _observe_again(before: tuple[str, str] | None, digest: str, reading: QueueReading) -> bool:
    if before is None or before[0] != digest:
        return True
    elapsed = seconds_between(before[1], reading.read_at)
    return elapsed is None or elapsed >= OBSERVE_AT_LEAST_EVERY_SECONDS


def queue_digest(queue: WorkQueue, completed: int) -> str:
    """What an observation shows but the lag (which grows by itself and is observed again at
    the latest every 5 minutes), digested."""
    failures = [
        (item.content_id, item.last_error_code, item.attempt_count, item.updated_at)
        for item in queue.failed_items
    ]
    shown = [queue.counts(), completed, queue.inexact, queue.first_due_at, failures]
    return hashlib.sha256(json.dumps(shown).encode()).hexdigest()[:16]


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


def completed_by_collection(instance: dg.DagsterInstance) -> Counter[str]:
    """Items each collection's work runs completed, over the runs last updated in the last 5
    minutes: their completed-count tag is written as the run's final word, just before it
    ends. (Run records would give the end time, but read the run table's columns on every
    call.)"""
    since = datetime.now(UTC) - timedelta(seconds=COMPLETED_WINDOW_SECONDS)
    runs = instance.get_runs(
        filters=dg.RunsFilter(job_name=media_usage_work.name, updated_after=since),
        limit=MAX_RECENT_WORK_RUNS,
    )
    completed: Counter[str] = Counter()
    for run in runs:
        slug, count = run.tags.get(COLLECTION_TAG), run.tags.get(COUNT_TAGS["completed"], "")
        if slug and count.isdigit():
            completed[slug] += int(count)
    return completed
