"""The maintenance lane (EmDash's `*/2 * * * *`): settle reconciliations, seed candidates and
keep the collection partitions equal to the registry."""

import dagster as dg

from media_usage_orchestration.dagster_kit.retries import (
    retries_transient_errors,
    retry_transient_errors_only,
)
from media_usage_orchestration.dagster_kit.run_tags import tag_run_outcome
from media_usage_orchestration.partitions import media_usage_collections, partition_changes
from media_usage_orchestration.processing.reconciliation.maintenance import settle_reconciliations
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.host.registry import read_collection_slugs


@dg.op(
    out=dg.Out(dg.Nothing),
    description="Delete obsolete reconciliations, settle failed ones (publish the failure or "
    "reset on a newer epoch, heal stuck ones) and seed candidates.",
)
@retries_transient_errors
def settle_and_seed_reconciliations(context: dg.OpExecutionContext, database: MediaUsageDatabase):
    with retry_transient_errors_only(context):
        result = settle_reconciliations(database.engine)
    if result.inactive:
        context.log.info("capture is not active: nothing to settle")
    settled = sum(result.counts.values())
    tag_run_outcome(context, "inactive" if result.inactive else "settled" if settled else "idle")
    yield dg.Output(None, metadata={"inactive": result.inactive, **dict(result.counts)})


@dg.op(
    out=dg.Out(dg.Nothing),
    description="Add a partition for every registry collection and remove those of deleted ones.",
)
@retries_transient_errors
def sync_collection_partitions(context: dg.OpExecutionContext, database: MediaUsageDatabase):
    with retry_transient_errors_only(context):
        slugs = read_collection_slugs(database.engine)
    added, removed = partition_changes(context.instance, slugs)
    if added:
        context.instance.add_dynamic_partitions(media_usage_collections.name, added)
    for slug in removed:
        context.instance.delete_dynamic_partition(media_usage_collections.name, slug)
    yield dg.Output(
        None,
        metadata={
            "added": ", ".join(added) or "-",
            "removed": ", ".join(removed) or "-",
            "collections": len(slugs),
        },
    )
