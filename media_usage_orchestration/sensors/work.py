"""The work sensor: one work run per collection with claimable work.

Each run claims only its collection's items and carries its `media_usage/collection` tag, so
filtering the Runs list by a collection finds every work run that changed it. `max_work_runs`
bounds the work runs queued or running at once, `work_runs_per_collection` those of one
collection; collections are served earliest due first. Both only shape load: every claim is
lease-guarded, so runs of one collection (or EmDash's own lane beside them) take disjoint items.
A collection whose due set holds a lease its owner let lapse gets a run even when the limits
are reached: the run that held it died or stalled, and the guards make it harmless."""

from collections import Counter

import dagster as dg

from media_usage_orchestration.jobs import media_usage_work
from media_usage_orchestration.ops.common import automation_default_status
from media_usage_orchestration.ops.run_tags import COLLECTION_TAG
from media_usage_orchestration.resources.automation import (
    MediaUsageAutomation,
    work_linger_from_environment,
)
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.common import (
    COLLECTION_ID_TAG,
    last_unsuccessful_run_id,
    probe_when_ready,
    run_key,
    runs_in_flight_of,
)
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.probes import (
    MAX_DUE_WORK_COLLECTIONS,
    CollectionDueWork,
    due_work_by_collection,
)


def _due_work(engine: Engine) -> list[CollectionDueWork]:
    return due_work_by_collection(engine, MAX_DUE_WORK_COLLECTIONS)


@dg.sensor(
    job=media_usage_work,
    # The probe is a few index seeks: ticking often costs little, and a new edit waits at
    # most this long for its run (a run in flight drains it within half a second).
    minimum_interval_seconds=3,
    default_status=automation_default_status(),
    description="One work run per collection with claimable work, tagged with the collection, "
    "while fewer than `max_work_runs` work runs (and `work_runs_per_collection` of that "
    "collection) are queued or running; the run key follows the collection's due set.",
)
def media_usage_work_sensor(
    context: dg.SensorEvaluationContext,
    database: MediaUsageDatabase,
    automation: MediaUsageAutomation,
):
    due = probe_when_ready(database, _due_work)
    if isinstance(due, dg.SkipReason):
        return due
    if not due:
        return dg.SkipReason("no due work")
    # One read of the runs in flight (a few), counted per collection.
    running = Counter(
        run.tags.get(COLLECTION_ID_TAG)
        for run in runs_in_flight_of(context.instance, media_usage_work.name)
    )
    in_flight = sum(running.values())
    requests = []
    for collection in due:
        of_collection = running[collection.collection_id]
        if not collection.lease_expired and (
            of_collection >= automation.work_runs_per_collection
            or in_flight >= automation.max_work_runs
        ):
            continue
        requests.append(_work_run(context.instance, automation, collection, of_collection))
        in_flight += 1
    if not requests:
        return dg.SkipReason(
            f"work is due in {len(due)} collection(s), but {in_flight} work runs are already "
            "queued or running"
        )
    return dg.SensorResult(run_requests=requests)


def _work_run(
    instance: dg.DagsterInstance,
    automation: MediaUsageAutomation,
    collection: CollectionDueWork,
    running: int,
) -> dg.RunRequest:
    tags = {COLLECTION_ID_TAG: collection.collection_id}
    return dg.RunRequest(
        run_key=run_key(
            "work",
            collection.collection_id,
            collection.generation,
            running,
            # a run canceled or failed before its claim left the due set unchanged
            last_unsuccessful_run_id(instance, media_usage_work.name, tags),
        ),
        run_config={
            "ops": {
                "drain_due_work": {
                    "config": {
                        "collection_id": collection.collection_id,
                        "max_items": automation.work_items_per_run,
                        "max_seconds": automation.work_seconds_per_run,
                        "batch_size": automation.work_batch_size,
                        "linger_seconds": work_linger_from_environment(
                            automation.work_linger_seconds
                        ),
                        # a lingering run gives its slot up to a collection left waiting
                        "max_work_runs": automation.max_work_runs,
                    }
                }
            }
        },
        tags={
            **tags,
            COLLECTION_TAG: collection.collection_slug,
            "media_usage/workflow": "work",
        },
    )
