"""The work sensor: a work run when due work exists."""

import dagster as dg

from media_usage_orchestration.jobs import media_usage_work
from media_usage_orchestration.ops.common import automation_default_status
from media_usage_orchestration.resources.automation import MediaUsageAutomation
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.common import (
    last_unsuccessful_run_id,
    probe_when_ready,
    run_key,
    runs_in_flight,
)
from media_usage_orchestration.store.probes import earliest_due_work


@dg.sensor(
    job=media_usage_work,
    minimum_interval_seconds=15,
    default_status=automation_default_status(),
    description="A work run when due work exists and fewer than `max_work_runs` work runs are "
    "queued or running; the run key follows the earliest due item.",
)
def media_usage_work_sensor(
    context: dg.SensorEvaluationContext,
    database: MediaUsageDatabase,
    automation: MediaUsageAutomation,
):
    earliest = probe_when_ready(database, earliest_due_work)
    if isinstance(earliest, dg.SkipReason):
        return earliest
    if earliest is None:
        return dg.SkipReason("no due work")
    in_flight = runs_in_flight(context.instance, media_usage_work.name)
    if in_flight >= automation.max_work_runs and not earliest.lease_expired:
        return dg.SkipReason(f"{in_flight} work runs already queued or running")
    return dg.RunRequest(
        run_key=run_key(
            "work",
            earliest.collection_id,
            earliest.content_id,
            earliest.work_version,
            earliest.due_at,
            in_flight,
            last_unsuccessful_run_id(context.instance, media_usage_work.name),
        ),
        run_config={
            "ops": {
                "drain_due_work": {
                    "config": {
                        "max_items": automation.work_items_per_run,
                        "max_seconds": automation.work_seconds_per_run,
                        "batch_size": automation.work_batch_size,
                    }
                }
            }
        },
        tags={"media_usage/workflow": "work"},
    )
