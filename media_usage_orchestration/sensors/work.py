"""The work sensor: one work run per collection with claimable work.

Each run claims only its collection's items and carries its `media_usage/collection` tag, so
filtering the Runs list by a collection finds every work run that changed it. `max_work_runs`
bounds the work runs queued or running at once, `work_runs_per_collection` those of one
collection running at once; collections are served earliest due first. A collection with a
work run queued (or starting) gets no second one: that run drains whatever is due when it
starts, so a stall never piles up runs. Both limits only shape load: every claim is
lease-guarded, so runs of one collection (or EmDash's own lane beside them) take disjoint items.

A work run whose worker died holds nothing for long: the run-health sensor fails it once its
run lease expires, and the next tick asks for its successor (work runs are not crash-retried:
the sensor is their one source, `dagster/max_retries=0` on the job).

A run in the last `HANDOVER_LEAD_SECONDS` of its time budget (`work_seconds_per_run`) no longer
counts against `work_runs_per_collection`: while its collection's work is still due, its
successor is asked for then, so that run's process starts while the ending one still drains,
and no edit waits for a tick and a process start at the handover."""

import time
from collections import Counter

import dagster as dg

from media_usage_orchestration.dagster_kit.default_status import automation_default_status
from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_TAG, IN_FLIGHT_STATUSES
from media_usage_orchestration.jobs import media_usage_work
from media_usage_orchestration.resources.automation import (
    MediaUsageAutomation,
    work_linger_from_environment,
)
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.common import (
    COLLECTION_ID_TAG,
    WAITING_STATUSES,
    collection_run_request,
    probe_when_ready,
)
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.reads.probes import (
    MAX_DUE_WORK_COLLECTIONS,
    CollectionDueWork,
    due_work_by_collection,
)

# Asked for this long before its predecessor's budget ends, a successor is running before the
# predecessor stops: a tick (up to 5 s in the daemon's loop), the queue and a run worker's start
# (2-4 s here) take less.
HANDOVER_LEAD_SECONDS = 15.0


def _now() -> float:
    return time.time()


def _ending(record: dg.RunRecord, automation: MediaUsageAutomation, now: float) -> bool:
    """A running work run within its budget's last `HANDOVER_LEAD_SECONDS` (by its start). A
    budget of less than two leads has no handover: each successor would end at once."""
    started = record.start_time
    budget = automation.work_seconds_per_run
    if started is None or budget < 2 * HANDOVER_LEAD_SECONDS:
        return False
    return now - started >= budget - HANDOVER_LEAD_SECONDS


def _due_work(engine: Engine) -> list[CollectionDueWork]:
    return due_work_by_collection(engine, MAX_DUE_WORK_COLLECTIONS)


@dg.sensor(
    job=media_usage_work,
    # The probe is a few index seeks: ticking often costs little, and a new edit waits at
    # most this long for its run (a run in flight drains it within half a second).
    minimum_interval_seconds=3,
    default_status=automation_default_status(),
    description="One work run per collection with claimable work, tagged with the collection, "
    "while fewer than `max_work_runs` work runs are queued or running, fewer than "
    "`work_runs_per_collection` of that collection are running (a run in its budget's last "
    f"{HANDOVER_LEAD_SECONDS:g} s not counted: its successor starts before it stops) and none "
    "of it is queued; the run key follows the collection's due set.",
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
    in_flight = context.instance.get_run_records(
        filters=dg.RunsFilter(job_name=media_usage_work.name, statuses=IN_FLIGHT_STATUSES)
    )
    now = _now()
    waiting, running, ending = Counter(), Counter(), {}
    for record in in_flight:
        run = record.dagster_run
        collection_id = run.tags.get(COLLECTION_ID_TAG)
        if run.status in WAITING_STATUSES:
            waiting[collection_id] += 1
        elif _ending(record, automation, now):
            ending[collection_id] = run.run_id
        else:
            running[collection_id] += 1
    total = len(in_flight)
    requests = []
    for collection in due:
        collection_id = collection.collection_id
        if (
            waiting[collection_id]
            or running[collection_id] >= automation.work_runs_per_collection
            or total >= automation.max_work_runs
        ):
            continue
        requests.append(
            _work_run(
                context.instance,
                automation,
                collection,
                running[collection_id],
                ending.get(collection_id),
            )
        )
        total += 1
    if not requests:
        if total >= automation.max_work_runs:
            return dg.SkipReason(
                f"work is due in {len(due)} collection(s), but {total} work runs are already "
                "queued or running"
            )
        return dg.SkipReason(
            f"work is due in {len(due)} collection(s), each with its work run queued or running"
        )
    return dg.SensorResult(run_requests=requests)


def _work_run(
    instance: dg.DagsterInstance,
    automation: MediaUsageAutomation,
    collection: CollectionDueWork,
    running: int,
    succeeding: str | None = None,
) -> dg.RunRequest:
    # The successor of an ending run: keyed by that run too, once per predecessor.
    handover = (succeeding,) if succeeding is not None else ()
    return collection_run_request(
        instance,
        media_usage_work.name,
        collection.collection_id,
        # with work_runs_per_collection > 1, the next run of a collection beside the running
        # ones (the key stays the same while a run waits to start)
        ("work", collection.collection_id, collection.generation, running),
        key_after=handover,
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
        tags={COLLECTION_TAG: collection.collection_slug, "media_usage/workflow": "work"},
    )
