"""Sensors read, ops write: each sensor runs one bounded, indexed query for due rows and asks
for runs whose run key changes every time a row becomes due again."""

import hashlib

import dagster as dg

from .jobs import media_usage_collection_deletion
from .ops.common import automation_default_status
from .ops.leased import COLLECTION_TAG
from .resources.database import MediaUsageDatabase
from .store.deletions import DeletionRepository

COLLECTION_ID_TAG = "media_usage/collection_id"
IN_FLIGHT_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
MAX_DUE_DELETIONS = 25


def runs_in_flight(
    instance: dg.DagsterInstance, job_name: str, tags: dict[str, str] | None = None
) -> int:
    return instance.get_runs_count(
        filters=dg.RunsFilter(job_name=job_name, statuses=IN_FLIGHT_STATUSES, tags=tags or {})
    )


def run_key(*parts: object) -> str:
    """A readable key prefix plus a digest of the due generation."""
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).hexdigest()[:16]
    return f"{parts[0]}:{parts[1]}:{digest}"


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
    due = DeletionRepository(database.engine).find_due(MAX_DUE_DELETIONS)
    requests = []
    for tombstone in due:
        tags = {COLLECTION_ID_TAG: tombstone.collection_id}
        if runs_in_flight(context.instance, media_usage_collection_deletion.name, tags):
            continue
        due_at = (
            tombstone.lease_expires_at if tombstone.state == "leased" else tombstone.next_attempt_at
        )
        requests.append(
            dg.RunRequest(
                run_key=run_key(
                    "delete", tombstone.collection_id, tombstone.phase, due_at, tombstone.updated_at
                ),
                run_config={
                    "ops": {
                        "claim_deletion": {"config": {"collection_id": tombstone.collection_id}}
                    }
                },
                tags={**tags, COLLECTION_TAG: tombstone.collection_slug},
            )
        )
    if not requests:
        return dg.SkipReason("no due collection-deletion tombstones without a run in flight")
    return dg.SensorResult(run_requests=requests)
