"""Coverage in the UI: the asset `media_usage_index` (one partition per collection slug), its
check `coverage_complete`, and one history asset per collection.

Every run that changes a collection records, from one read of what its index holds now:
- an event of the collection's `media_usage_index` partition: a materialization when a
  reconciliation completes coverage or a work run projects entries, an observation when only
  the collection's state changed (failed coverage with its error code, work that failed for
  good, an operator's retry, activation);
- the partition's `coverage_complete` evaluation: it fails (severity ERROR) unless coverage is
  complete with no failed and no stuck work, with the error codes and counts as metadata;
- an observation of `media_usage_coverage/<slug>` with the same numbers: Dagster 1.13 plots a
  partitioned asset's metadata across all partitions on one line (or the latest value per
  partition), never one partition over time, so each collection's history has its own key,
  whose Plots tab draws that collection alone. A collection's deletion removes its partition
  and wipes its history key.
"""

from collections.abc import Mapping
from datetime import datetime

import dagster as dg

from ..partitions import media_usage_collections
from ..processing.run_loop import WorkDrain
from ..resources.database import MediaUsageDatabase
from ..store.coverage import CollectionCoverage, read_collection_coverage
from ..store.engine import Engine
from ..store.registry import read_collection_id

MEDIA_USAGE_INDEX = dg.AssetKey("media_usage_index")
COVERAGE_CHECK = "coverage_complete"
HISTORY_PREFIX = "media_usage_coverage"
FAILED_WORK_OUTCOME = "failed_work"

media_usage_index = dg.AssetSpec(
    MEDIA_USAGE_INDEX,
    partitions_def=media_usage_collections,
    group_name="media_usage",
    kinds={"sql"},
    description="EmDash's media usage index (sources and occurrences) of one collection: "
    "materialized when a reconciliation completes its coverage or a work run projects its "
    "entries; observed when only its state changes (failed coverage with the error code, work "
    "that failed for good, an operator's retry, activation). Each collection's history over "
    "time: the asset media_usage_coverage/<slug>.",
)


def coverage_history_key(slug: str) -> dg.AssetKey:
    """The asset whose events are one collection's coverage over time."""
    return dg.AssetKey([HISTORY_PREFIX, slug])


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
    _log_coverage(
        context,
        coverage,
        dg.AssetMaterialization(asset_key=MEDIA_USAGE_INDEX, partition=slug, metadata=metadata),
    )
    return coverage


def record_observed_coverage(
    context: dg.OpExecutionContext,
    engine: Engine,
    collection_id: str,
    slug: str,
    **extra: str | int,
) -> CollectionCoverage | None:
    """Observe the partition: the collection's state changed but its index was not rebuilt."""
    coverage = read_collection_coverage(engine, collection_id)
    if coverage is None:
        return None
    metadata = {**coverage_metadata(coverage), **_metadata_values(extra)}
    _log_coverage(
        context,
        coverage,
        dg.AssetObservation(asset_key=MEDIA_USAGE_INDEX, partition=slug, metadata=metadata),
    )
    return coverage


def record_failed_coverage(
    context: dg.OpExecutionContext, engine: Engine, collection_id: str, slug: str
) -> None:
    """Observe the partition as failed, with the error code its status row published."""
    coverage = read_collection_coverage(engine, collection_id)
    if coverage is None:
        return
    failure = {"reconciliation": "failed", "error_code": coverage.last_error_code or "unknown"}
    metadata = {**coverage_metadata(coverage), **_metadata_values(failure)}
    _log_coverage(
        context,
        coverage,
        dg.AssetObservation(asset_key=MEDIA_USAGE_INDEX, partition=slug, metadata=metadata),
    )


def record_drained_coverage(
    context: dg.OpExecutionContext, engine: Engine, drained: WorkDrain, duration_seconds: float
) -> None:
    """After a work run: materialize each collection it projected entries of, observe each
    where it only failed items for good, and warn with the failed counts and error codes."""
    failures = []
    for collection_id, slug in drained.changed_collections:
        completed = drained.completed_by_collection.get((collection_id, slug), 0)
        failed = drained.failed_by_collection.get((collection_id, slug), 0)
        if completed:
            coverage = record_coverage(
                context,
                engine,
                collection_id,
                slug,
                duration_seconds=duration_seconds,
                entries_projected=completed,
                work_failed=failed,
            )
        else:
            coverage = record_observed_coverage(
                context, engine, collection_id, slug, work_failed=failed
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
    """Observe a collection named by slug; nothing when the registry no longer has it."""
    collection_id = read_collection_id(engine, slug)
    if collection_id is None:
        return None
    return record_observed_coverage(context, engine, collection_id, slug, **extra)


def forget_deleted_collection(context: dg.OpExecutionContext, engine: Engine, slug: str) -> bool:
    """Once the registry has no collection `slug`, remove its partition and wipe its history
    key, so the asset's views no longer show it. True when it was forgotten."""
    if read_collection_id(engine, slug) is not None:
        return False
    instance = context.instance
    if instance.has_dynamic_partition(media_usage_collections.name, slug):
        instance.delete_dynamic_partition(media_usage_collections.name, slug)
    instance.wipe_assets([coverage_history_key(slug)])
    return True


def coverage_metadata(coverage: CollectionCoverage) -> dict[str, dg.MetadataValue]:
    metadata: dict[str, dg.MetadataValue] = {
        "collection_id": dg.MetadataValue.text(coverage.collection_id),
        "coverage": dg.MetadataValue.text(coverage.status or "none"),
        "sources": dg.MetadataValue.int(coverage.sources),
        "occurrences": dg.MetadataValue.int(coverage.occurrences),
        "pending_work": dg.MetadataValue.int(coverage.pending_work),
        "failed_work": dg.MetadataValue.int(coverage.failed_work),
        "stuck_work": dg.MetadataValue.int(coverage.stuck_work),
    }
    if coverage.entries is not None:
        metadata["entries"] = dg.MetadataValue.int(coverage.entries)
    if coverage.change_epoch is not None:
        metadata["change_epoch"] = dg.MetadataValue.int(coverage.change_epoch)
    return metadata


# --- the check --------------------------------------------------------------------------------


def coverage_check_metadata(coverage: CollectionCoverage) -> dict[str, dg.MetadataValue]:
    """The partition's numbers, the coverage row's error code and the failed work's codes."""
    metadata = coverage_metadata(coverage)
    metadata["last_error_code"] = dg.MetadataValue.text(coverage.last_error_code or "-")
    metadata["failed_work_codes"] = dg.MetadataValue.text(
        failed_codes_text(coverage.failed_work_codes) or "-"
    )
    return metadata


def coverage_verdict(coverage: CollectionCoverage) -> str:
    """Why the check fails, or why it passes, in one line."""
    if coverage.is_complete:
        return "coverage complete, no failed or stuck work"
    problems = []
    if coverage.status != "complete":
        code = f" ({coverage.last_error_code})" if coverage.last_error_code else ""
        problems.append(f"coverage {coverage.status or 'none'}{code}")
    if coverage.failed_work:
        codes = failed_codes_text(coverage.failed_work_codes)
        problems.append(f"{coverage.failed_work} failed work item(s): {codes}")
    if coverage.stuck_work:
        problems.append(f"{coverage.stuck_work} stuck work item(s) (lease expired)")
    return "; ".join(problems)


def coverage_check_evaluation(coverage: CollectionCoverage) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=MEDIA_USAGE_INDEX,
        check_name=COVERAGE_CHECK,
        passed=coverage.is_complete,
        severity=dg.AssetCheckSeverity.ERROR,
        description=coverage_verdict(coverage),
        metadata=coverage_check_metadata(coverage),
        partition=coverage.collection_slug,
    )


@dg.asset_check(
    asset=MEDIA_USAGE_INDEX,
    name=COVERAGE_CHECK,
    partitions_def=media_usage_collections,
    description="Fails (ERROR) unless the collection's coverage is complete with no failed and "
    "no stuck (lease expired) work; the metadata carries the counts and error codes. Every run "
    "that changes the collection evaluates it; executing it here reads the database now.",
)
def coverage_complete(
    context: dg.AssetCheckExecutionContext, database: MediaUsageDatabase
) -> dg.AssetCheckResult:
    slug = context.partition_key
    engine = database.engine
    collection_id = read_collection_id(engine, slug)
    coverage = None if collection_id is None else read_collection_coverage(engine, collection_id)
    if coverage is None:
        return dg.AssetCheckResult(
            passed=False,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"no registry collection {slug!r}",
        )
    evaluation = coverage_check_evaluation(coverage)
    return dg.AssetCheckResult(
        passed=evaluation.passed,
        severity=evaluation.severity,
        description=evaluation.description,
        metadata=evaluation.metadata,
    )


def failed_codes_text(codes: Mapping[str, int]) -> str:
    return ", ".join(f"{code}: {count}" for code, count in codes.items())


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


def _log_coverage(
    context: dg.OpExecutionContext,
    coverage: CollectionCoverage,
    event: dg.AssetMaterialization | dg.AssetObservation,
) -> None:
    """The partition's event, its check evaluation and the collection's history point: three
    events from one read, one instance write each."""
    _ensure_partition(context, coverage.collection_slug)
    context.log_event(event)
    context.log_event(coverage_check_evaluation(coverage))
    numbers = {
        name: value
        for name, value in event.metadata.items()
        if isinstance(value, (dg.IntMetadataValue, dg.FloatMetadataValue))
    }
    context.log_event(
        dg.AssetObservation(
            asset_key=coverage_history_key(coverage.collection_slug),
            metadata={
                **numbers,
                "coverage": dg.MetadataValue.text(coverage.status or "none"),
                "complete": dg.MetadataValue.bool(coverage.is_complete),
            },
        )
    )


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
    instance = context.instance
    if not instance.has_dynamic_partition(media_usage_collections.name, slug):
        instance.add_dynamic_partitions(media_usage_collections.name, [slug])
