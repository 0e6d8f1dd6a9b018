"""Dagster jobs: thin wiring of the ops in `ops/`."""

import dagster as dg

from .ops.activation import activate_capture
from .ops.deletion import (
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
