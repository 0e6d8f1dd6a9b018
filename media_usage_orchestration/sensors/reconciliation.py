"""The reconciliation sensor: one run per collection that needs a reconciliation now."""

import dagster as dg

from media_usage_orchestration.dagster_kit.default_status import automation_default_status
from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_TAG
from media_usage_orchestration.jobs import media_usage_reconciliation
from media_usage_orchestration.partitions import media_usage_collections
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.common import (
    collection_has_run,
    collection_run_request,
    probe_when_ready,
)
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.reads.probes import due_reconciliations

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
    job = media_usage_reconciliation.name
    for candidate in candidates:
        if candidate.collection_slug not in known:
            continue  # its partition is added by this tick; the run is requested on the next
        if collection_has_run(context.instance, job, candidate.collection_id):
            continue
        generation = (candidate.run_token or "seed", candidate.generation)
        requests.append(
            collection_run_request(
                context.instance,
                job,
                candidate.collection_id,
                ("reconcile", candidate.collection_id, *generation),
                partition_key=candidate.collection_slug,
                tags={COLLECTION_TAG: candidate.collection_slug},
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
