"""The collection-deletion sensor: one run per due tombstone."""

import dagster as dg

from media_usage_orchestration.dagster_kit.default_status import automation_default_status
from media_usage_orchestration.dagster_kit.run_tags import queue_tags
from media_usage_orchestration.jobs import media_usage_collection_deletion
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.common import (
    collection_has_run,
    collection_run_request,
    probe_when_ready,
)
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.reads.probes import due_deletions

MAX_DUE_DELETIONS = 25


def _due_deletions(engine: Engine):
    return due_deletions(engine, MAX_DUE_DELETIONS)


@dg.sensor(
    job=media_usage_collection_deletion,
    minimum_interval_seconds=30,
    default_status=automation_default_status(),
    description="One run per due collection-deletion tombstone (pending or retry due, or "
    "leased with an expired lease); none while a run for that tombstone is in flight.",
)
def media_usage_collection_deletion_sensor(
    context: dg.SensorEvaluationContext, database: MediaUsageDatabase
):
    due = probe_when_ready(database, _due_deletions)
    if isinstance(due, dg.SkipReason):
        return due
    requests = []
    job = media_usage_collection_deletion.name
    for tombstone in due:
        if collection_has_run(context.instance, job, tombstone.collection_id):
            continue
        generation = (tombstone.phase, tombstone.due_at, tombstone.updated_at)
        claim_config = {"collection_id": tombstone.collection_id}
        requests.append(
            collection_run_request(
                context.instance,
                job,
                tombstone.collection_id,
                ("delete", tombstone.collection_id, *generation),
                run_config={"ops": {"claim_deletion": {"config": claim_config}}},
                tags=queue_tags("deletion", tombstone.collection_slug),
            )
        )
    if not requests:
        return dg.SkipReason("no due collection-deletion tombstones without a run in flight")
    return dg.SensorResult(run_requests=requests)
