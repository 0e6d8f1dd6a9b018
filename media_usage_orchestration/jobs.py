"""Dagster jobs: thin wiring of the ops in `ops/`."""

import dagster as dg

from media_usage_orchestration.dagster_kit.run_tags import queue_tags
from media_usage_orchestration.ops.activation import activate_capture
from media_usage_orchestration.ops.deletion import (
    claim_deletion,
    delete_sources,
    delete_status,
    delete_work,
    drop_table,
    fence,
    finalize_deletion,
    remove_registry,
    request_deletion,
)
from media_usage_orchestration.ops.instance_pruning import prune_instance
from media_usage_orchestration.ops.maintenance import (
    settle_and_seed_reconciliations,
    sync_collection_partitions,
)
from media_usage_orchestration.ops.operator import (
    reopen_collection_deletion,
    reopen_failed_work,
    reopen_reconciliation,
)
from media_usage_orchestration.ops.projection_gc import (
    collect_projection_garbage,
    summarize_media_library,
)
from media_usage_orchestration.ops.reconciliation import (
    claim_reconciliation,
    drain_collection_work,
    finalize_coverage,
    prepare_run,
    scan_pages,
    scan_sources,
)
from media_usage_orchestration.ops.work import drain_due_work
from media_usage_orchestration.partitions import media_usage_collections

# Every reconciliation run carries its collection's tags, however it is launched (sensor,
# backfill, Launchpad partition picker): the run queue holds it to one run per collection.
reconciliation_partitions = dg.PartitionedConfig(
    partitions_def=media_usage_collections,
    run_config_for_partition_key_fn=lambda _slug: {},
    tags_for_partition_key_fn=lambda slug: queue_tags("reconciliation", slug),
)


@dg.job(
    name="media_usage_activation",
    description="Operator action: activate incremental capture on every collection "
    "(expanded -> activating -> active), one lease-guarded step per collection.",
    executor_def=dg.in_process_executor,
    tags={"media_usage/workflow": "activation"},
)
def media_usage_activation():
    activate_capture()


@dg.job(
    name="request_collection_deletion",
    description="Operator action (Launchpad): delete a collection. Writes its tombstone and "
    "runs the front phases (fence, registry, table); refuses a collection that still has "
    "entries unless force is set. The background deletion job removes the rest.",
    executor_def=dg.in_process_executor,
    tags={"media_usage/workflow": "collection_deletion_request"},
)
def request_collection_deletion():
    request_deletion()


@dg.job(
    name="media_usage_collection_deletion",
    description="Background deletion of one tombstoned collection, one lease-guarded op per "
    "phase; re-execution resumes from the phase the tombstone is in.",
    executor_def=dg.in_process_executor,
    tags={"media_usage/workflow": "collection_deletion"},
)
def media_usage_collection_deletion():
    claimed = claim_deletion()
    fenced = fence(claimed.lease)
    detached = remove_registry(fenced.lease)
    dropped = drop_table(detached.lease)
    drained = delete_work(dropped.lease)
    emptied = delete_sources(drained.lease)
    cleared = delete_status(emptied.lease)
    finalize_deletion(cleared.lease)


@dg.job(
    name="media_usage_work",
    description="Process due per-entry work: project each entry's media references into "
    "sources and occurrences, every item under its own lease.",
    executor_def=dg.in_process_executor,
    # Not crash-retried: the work sensor asks for a collection's next work run itself, so a
    # retry would only queue a second run beside it.
    tags={"media_usage/workflow": "work", "dagster/max_retries": "0"},
)
def media_usage_work():
    drain_due_work()


@dg.job(
    name="media_usage_reconciliation",
    description="Reconcile one collection (the partition) until its coverage is complete: "
    "claim, prepare, scan pages, drain work, source pages, finalize - each op one "
    "lease-guarded step. Backfill partitions to reconcile any set of collections.",
    executor_def=dg.in_process_executor,
    config=reconciliation_partitions,
    tags={"media_usage/workflow": "reconciliation"},
)
def media_usage_reconciliation():
    claimed = claim_reconciliation()
    prepared = prepare_run(claimed.lease)
    scanned = scan_pages(prepared.lease)
    drained = drain_collection_work(scanned.lease)
    sourced = scan_sources(drained.lease)
    finalize_coverage(sourced.lease)


@dg.job(
    name="media_usage_maintenance",
    description="The maintenance lane: settle reconciliations, seed candidates and keep the "
    "collection partitions equal to the registry.",
    executor_def=dg.in_process_executor,
    tags={"media_usage/workflow": "maintenance"},
)
def media_usage_maintenance():
    settle_and_seed_reconciliations()
    sync_collection_partitions()


@dg.job(
    name="media_usage_projection_gc",
    description="EmDash's projection GC: lease-guarded passes, back to back while the backlog "
    "fills them, each deleting expired generation-write leases and a bounded batch of obsolete "
    "occurrences (orphans, stale and abandoned generations past the safety window); then the "
    "media library summary.",
    executor_def=dg.in_process_executor,
    tags={"media_usage/workflow": "projection_gc"},
)
def media_usage_projection_gc():
    summarize_media_library(collect_projection_garbage())


@dg.job(
    name="media_usage_instance_pruning",
    description="Bounds the Dagster instance: deletes the project's finished runs (with their "
    "events) older than success_days / failure_days, never a run in flight, one holding an "
    "asset's or check's latest event, or one a backfill in progress needs.",
    executor_def=dg.in_process_executor,
    tags={"media_usage/workflow": "instance_pruning"},
)
def media_usage_instance_pruning():
    prune_instance()


def _operator_job(name: str, op: dg.OpDefinition, description: str) -> dg.JobDefinition:
    @dg.job(
        name=name,
        description=description,
        executor_def=dg.in_process_executor,
        tags={"media_usage/workflow": "operator"},
    )
    def _job():
        op()

    return _job


retry_media_usage_work_job = _operator_job(
    "retry_media_usage_work",
    reopen_failed_work,
    "Operator action: reopen one entry's work (content_id), or every failed entry of a "
    "collection; a live lease is never taken. The outcome is in the run's media_usage/outcome "
    "tag and the op's metadata.",
)
retry_collection_deletion_job = _operator_job(
    "retry_collection_deletion",
    reopen_collection_deletion,
    "Operator action: reopen a failed or stalled collection deletion in its phase, named by "
    "collection id or slug; a live lease is never taken.",
)
retry_media_usage_reconciliation_job = _operator_job(
    "retry_media_usage_reconciliation",
    reopen_reconciliation,
    "Operator action: reopen a collection's failed, retrying or abandoned reconciliation as a "
    "fresh scan; a live lease is never taken.",
)
