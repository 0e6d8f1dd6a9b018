"""Coverage in the UI: the asset `media_usage_index`, one partition per collection slug.

Every run that changes a collection (a reconciliation completing or failing, a work run that
completed or failed items of it, an operator's retry, activation) reads what its index holds
now and materializes the collection's partition with the numbers `media-usage status` shows
(and the run's own: duration, items projected or failed, what the operator retried). Always a
materialization: the asset page shows a partition's latest materialization ahead of any newer
observation. A collection's deletion removes its partition.

Whether the index can be trusted is the check `coverage_complete` of the collection's own asset
`media_usage_coverage/<slug>`, which no run evaluates (`health.py` says why).
"""

from collections.abc import Mapping
from datetime import datetime

import dagster as dg

from media_usage_orchestration.assets.coverage_history import coverage_history_key
from media_usage_orchestration.assets.health import coverage_metadata, failed_codes_text
from media_usage_orchestration.assets.queue import queue_key
from media_usage_orchestration.partitions import media_usage_collections
from media_usage_orchestration.processing.loop.run_loop import WorkDrain
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.host.registry import read_collection_id
from media_usage_orchestration.store.reads.coverage import (
    CollectionCoverage,
    read_collection_coverage,
)

MEDIA_USAGE_INDEX = dg.AssetKey("media_usage_index")
FAILED_WORK_OUTCOME = "failed_work"

media_usage_index = dg.AssetSpec(
    MEDIA_USAGE_INDEX,
    partitions_def=media_usage_collections,
    group_name="media_usage",
    kinds={"sql"},
    description="EmDash's media usage index (sources and occurrences) of one collection, "
    "materialized with what it holds whenever a run changes the collection: a reconciliation "
    "completing or failing (with its error code), a work run, an operator's retry, activation. "
    "Whether it can be trusted: the check coverage_complete of media_usage_coverage/<slug>.",
)


def record_coverage(
    context: dg.OpExecutionContext,
    engine: Engine,
    collection_id: str,
    slug: str,
    duration_seconds: float | None = None,
    **extra: str | int,
) -> CollectionCoverage | None:
    """Materialize the collection's partition with what its index holds now. The duration is
    the run's own when given, else how long the completed coverage took; `extra` names what
    the run did (counts, or a word such as the operator's retry)."""
    coverage = read_collection_coverage(engine, collection_id)
    if coverage is None:  # deleted since: its partition has nothing left to show
        return None
    if duration_seconds is None:
        duration_seconds = coverage_duration_seconds(coverage)
    metadata = coverage_metadata(coverage)
    if duration_seconds is not None:
        metadata["duration_seconds"] = dg.MetadataValue.float(round(duration_seconds, 3))
    metadata.update(_metadata_values(extra))
    _ensure_partition(context, slug)
    context.log_event(
        dg.AssetMaterialization(asset_key=MEDIA_USAGE_INDEX, partition=slug, metadata=metadata)
    )
    return coverage


def record_failed_coverage(
    context: dg.OpExecutionContext, engine: Engine, collection_id: str, slug: str
) -> None:
    """Record the partition as failed, with the error code its status row published."""
    record_coverage(context, engine, collection_id, slug, reconciliation="failed")


def record_drained_coverage(
    context: dg.OpExecutionContext, engine: Engine, drained: WorkDrain, duration_seconds: float
) -> None:
    """After a work run: record each collection it completed or failed items of, and warn with
    the counts and error codes of the items that failed for good."""
    failures = []
    for collection_id, slug in drained.changed_collections:
        failed = drained.failed_by_collection.get((collection_id, slug), 0)
        coverage = record_coverage(
            context,
            engine,
            collection_id,
            slug,
            duration_seconds=duration_seconds,
            entries_projected=drained.completed_by_collection.get((collection_id, slug), 0),
            work_failed=failed,
        )
        if failed:
            codes = failed_codes_text(coverage.failed_work_codes) if coverage else "deleted since"
            failures.append(f"{slug}: {failed} (failed work now: {codes})")
    if failures:
        context.log.warning(
            f"work: {sum(drained.failed_by_collection.values())} item(s) failed for good and "
            f"wait for an operator's retry: {'; '.join(failures)}"
        )


def record_collection_by_slug(
    context: dg.OpExecutionContext, engine: Engine, slug: str, **extra: str | int
) -> CollectionCoverage | None:
    """Record a collection named by slug; nothing when the registry no longer has it."""
    collection_id = read_collection_id(engine, slug)
    if collection_id is None:
        return None
    return record_coverage(context, engine, collection_id, slug, **extra)


def forget_deleted_collection(context: dg.OpExecutionContext, engine: Engine, slug: str) -> bool:
    """Once the registry has no collection `slug`, remove its partition, so the asset's
    partition views and the check's partitions no longer show it, and wipe its coverage
    history and queue assets. True when the partition was removed."""
    instance = context.instance
    if read_collection_id(engine, slug) is not None:
        return False
    # The catalog lists every key with stored events, defined or not: wiped, the asset's key
    # leaves it once the code location reloads without it.
    instance.wipe_assets([coverage_history_key(slug), queue_key(slug)])
    if not instance.has_dynamic_partition(media_usage_collections.name, slug):
        return False
    instance.delete_dynamic_partition(media_usage_collections.name, slug)
    return True


# --- durations --------------------------------------------------------------------------------


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


# --- events -----------------------------------------------------------------------------------


def _metadata_values(values: Mapping[str, str | int]) -> dict[str, dg.MetadataValue]:
    return {
        name: dg.MetadataValue.int(value)
        if isinstance(value, int)
        else dg.MetadataValue.text(value)
        for name, value in values.items()
    }


def _ensure_partition(context: dg.OpExecutionContext, slug: str) -> None:
    # The sensors and the maintenance job keep partitions equal to the registry; a work run
    # may project a collection created since, and its event needs the partition to exist.
    # A run of the slug's own partition (reconciliation) exists only because it does.
    if context.has_partition_key and context.partition_key == slug:
        return
    instance = context.instance
    if not instance.has_dynamic_partition(media_usage_collections.name, slug):
        instance.add_dynamic_partitions(media_usage_collections.name, [slug])
