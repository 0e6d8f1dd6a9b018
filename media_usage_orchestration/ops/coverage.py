"""Coverage in the UI: the asset `media_usage_index`, one partition per collection slug.

Runs record what they did to a collection's index as events of this asset, so the asset page
plots entries, sources, occurrences, durations and change epochs per collection over time:
a materialization when a reconciliation completes coverage or a work run projects entries,
an observation carrying the error code when coverage fails.
"""

from datetime import datetime

import dagster as dg

from ..partitions import media_usage_collections
from ..store.coverage import CollectionCoverage, read_collection_coverage
from ..store.engine import Engine

MEDIA_USAGE_INDEX = dg.AssetKey("media_usage_index")

media_usage_index = dg.AssetSpec(
    MEDIA_USAGE_INDEX,
    partitions_def=media_usage_collections,
    group_name="media_usage",
    kinds={"sql"},
    description="EmDash's media usage index (sources and occurrences) of one collection: "
    "materialized when a reconciliation completes its coverage or a work run projects its "
    "entries; observed with the error code when coverage fails.",
)


def record_coverage(
    context: dg.OpExecutionContext,
    engine: Engine,
    collection_id: str,
    slug: str,
    duration_seconds: float | None = None,
    **counts: int,
) -> CollectionCoverage | None:
    """Materialize the collection's partition with what its index holds now. The duration is
    the run's own when given, else how long the completed coverage took."""
    coverage = read_collection_coverage(engine, collection_id)
    if coverage is None:  # deleted since: its partition has nothing left to show
        return None
    if duration_seconds is None:
        duration_seconds = coverage_duration_seconds(coverage)
    metadata = coverage_metadata(coverage)
    if duration_seconds is not None:
        metadata["duration_seconds"] = dg.MetadataValue.float(round(duration_seconds, 3))
    metadata.update({name: dg.MetadataValue.int(value) for name, value in counts.items()})
    _ensure_partition(context, slug)
    context.log_event(
        dg.AssetMaterialization(asset_key=MEDIA_USAGE_INDEX, partition=slug, metadata=metadata)
    )
    return coverage


def record_failed_coverage(
    context: dg.OpExecutionContext, engine: Engine, collection_id: str, slug: str
) -> None:
    """Observe the partition as failed, with the error code its status row published."""
    coverage = read_collection_coverage(engine, collection_id)
    if coverage is None:
        return
    _ensure_partition(context, slug)
    context.log_event(
        dg.AssetObservation(
            asset_key=MEDIA_USAGE_INDEX,
            partition=slug,
            metadata={
                **coverage_metadata(coverage),
                "reconciliation": dg.MetadataValue.text("failed"),
                "error_code": dg.MetadataValue.text(coverage.last_error_code or "unknown"),
            },
        )
    )


def coverage_metadata(coverage: CollectionCoverage) -> dict[str, dg.MetadataValue]:
    metadata: dict[str, dg.MetadataValue] = {
        "collection_id": dg.MetadataValue.text(coverage.collection_id),
        "coverage": dg.MetadataValue.text(coverage.status or "none"),
        "sources": dg.MetadataValue.int(coverage.sources),
        "occurrences": dg.MetadataValue.int(coverage.occurrences),
        "pending_work": dg.MetadataValue.int(coverage.pending_work),
        "failed_work": dg.MetadataValue.int(coverage.failed_work),
    }
    if coverage.entries is not None:
        metadata["entries"] = dg.MetadataValue.int(coverage.entries)
    if coverage.change_epoch is not None:
        metadata["change_epoch"] = dg.MetadataValue.int(coverage.change_epoch)
    return metadata


def coverage_duration_seconds(coverage: CollectionCoverage) -> float | None:
    """How long the coverage took, in database time (status started_at -> completed_at)."""
    if coverage.started_at is None or coverage.completed_at is None:
        return None
    started, completed = (_parse(coverage.started_at), _parse(coverage.completed_at))
    if started is None or completed is None:
        return None
    return max((completed - started).total_seconds(), 0.0)


def _parse(timestamp: str) -> datetime | None:
    try:
        return datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:  # a legacy `CURRENT_TIMESTAMP` default; no duration then
        return None


def _ensure_partition(context: dg.OpExecutionContext, slug: str) -> None:
    # The sensors and the maintenance job keep partitions equal to the registry; a work run
    # may project a collection created since, and its event needs the partition to exist.
    # A run of the slug's own partition (reconciliation) exists only because it does.
    if context.has_partition_key and context.partition_key == slug:
        return
    instance = context.instance
    if not instance.has_dynamic_partition(media_usage_collections.name, slug):
        instance.add_dynamic_partitions(media_usage_collections.name, [slug])
