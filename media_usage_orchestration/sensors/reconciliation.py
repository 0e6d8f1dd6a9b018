"""The reconciliation sensor: one run per collection that needs a reconciliation now."""

import dagster as dg

from media_usage_orchestration.jobs import media_usage_reconciliation
from media_usage_orchestration.ops.common import automation_default_status
from media_usage_orchestration.ops.run_tags import COLLECTION_TAG
from media_usage_orchestration.partitions import media_usage_collections
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.common import (
    COLLECTION_ID_TAG,
    collection_has_run,
    last_unsuccessful_run_id,
    probe_when_ready,
    run_key,
)
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.probes import due_reconciliations

MAX_DUE_RECONCILIATIONS = 25


def _due_reconciliations(engine: Engine):
    return due_reconciliations(engine, MAX_DUE_RECONCILIATIONS)


@dg.sensor(
    job=media_usage_reconciliation,
    minimum_interval_seconds=30,
    default_status=automation_default_status(),
    description="One reconciliation run per due coordinator row (and per collection that "
    "needs one but has none), partitioned by slug; none while that collection has a run "
    "queued or in progress.",
)
def media_usage_reconciliation_sensor(
    context: dg.SensorEvaluationContext, database: MediaUsageDatabase
):
    candidates = probe_when_ready(database, _due_reconciliations)
    if isinstance(candidates, dg.SkipReason):
        return candidates
    # An idle tick (no candidate) asks the instance nothing.
    known = (
        set(context.instance.get_dynamic_partitions(media_usage_collections.name))
        if candidates
        else set()
    )
    new_partitions = sorted({c.collection_slug for c in candidates} - known)
    requests = []
    for candidate in candidates:
        tags = {COLLECTION_ID_TAG: candidate.collection_id}
        if candidate.collection_slug not in known:
            continue  # its partition is added by this tick; the run is requested on the next
        if collection_has_run(
            context.instance, media_usage_reconciliation.name, candidate.collection_id
        ):
            continue
        requests.append(
            dg.RunRequest(
                run_key=run_key(
                    "reconcile",
                    candidate.collection_id,
                    candidate.run_token or "seed",
                    candidate.generation,
                    # a run canceled or failed before its claim left the row unchanged
                    last_unsuccessful_run_id(
                        context.instance, media_usage_reconciliation.name, tags
                    ),
                ),
                partition_key=candidate.collection_slug,
                tags={**tags, COLLECTION_TAG: candidate.collection_slug},
            )
        )
    partition_requests = (
        [media_usage_collections.build_add_request(new_partitions)] if new_partitions else []
    )
    if not requests:
        return dg.SensorResult(
            skip_reason=dg.SkipReason("no collection needs a reconciliation run now"),
            dynamic_partitions_requests=partition_requests,
        )
    return dg.SensorResult(run_requests=requests, dynamic_partitions_requests=partition_requests)
