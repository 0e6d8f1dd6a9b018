"""Coverage in the UI: the asset `media_usage_index` (one partition per collection slug) and
its check `coverage_complete`.

Every run that changes a collection (a reconciliation completing or failing, a work run that
completed or failed items of it, an operator's retry, activation) reads what its index holds
now, once, and records it twice:
- a materialization of the collection's partition with the numbers `media-usage status` shows
  (and the run's own: duration, items projected or failed, what the operator retried). Always
  a materialization: the asset page shows a partition's latest materialization ahead of any
  newer observation, so the page equals the status only if every change is one;
- the partition's `coverage_complete` evaluation: it fails (severity ERROR) unless coverage is
  complete with no failed and no stuck work, with the counts and error codes as metadata.
A collection's deletion removes its partition. The partition's materialization is also
logged on the collection's own asset `media_usage_coverage/<slug>` (`coverage_history.py`).
"""

from collections.abc import Mapping
from datetime import datetime

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.execution.context.invocation import BaseDirectExecutionContext

from media_usage_orchestration.assets.coverage_history import coverage_history_key
from media_usage_orchestration.assets.queue import queue_key
from media_usage_orchestration.ops.run_tags import tag_run_outcome
from media_usage_orchestration.partitions import media_usage_collections
from media_usage_orchestration.previews import PARTITIONED_ASSET_CHECK, accepting
from media_usage_orchestration.processing.run_loop import WorkDrain
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.coverage import CollectionCoverage, read_collection_coverage
from media_usage_orchestration.store.registry import read_collection_id

MEDIA_USAGE_INDEX = dg.AssetKey("media_usage_index")
COVERAGE_CHECK = "coverage_complete"
FAILED_WORK_OUTCOME = "failed_work"

media_usage_index = dg.AssetSpec(
    MEDIA_USAGE_INDEX,
    partitions_def=media_usage_collections,
    group_name="media_usage",
    kinds={"sql"},
    description="EmDash's media usage index (sources and occurrences) of one collection, "
    "materialized with what it holds whenever a run changes the collection: a reconciliation "
    "completing or failing (with its error code), a work run, an operator's retry, activation. "
    "The check coverage_complete says whether the index can be trusted.",
)


def record_coverage(
    context: dg.OpExecutionContext,
    engine: Engine,
    collection_id: str,
    slug: str,
    duration_seconds: float | None = None,
    **extra: str | int,
) -> CollectionCoverage | None:
    """Materialize the collection's partition with what its index holds now, and evaluate its
    check. The duration is the run's own when given, else how long the completed coverage
    took; `extra` names what the run did (counts, or a word such as the operator's retry)."""
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
    # The same numbers on the collection's own asset, whose Plots show them over time.
    context.log_event(
        dg.AssetMaterialization(asset_key=coverage_history_key(slug), metadata=metadata)
    )
    # An op invoked directly (outside any run) stores nothing and cannot log a check evaluation.
    if not isinstance(context, BaseDirectExecutionContext):
        target = _stored_materialization(context, slug)
        context.log_event(coverage_check_evaluation(coverage, target))
    return coverage


def _stored_materialization(
    context: dg.OpExecutionContext, slug: str
) -> AssetCheckEvaluationTargetMaterializationData | None:
    """The materialization just logged (the instance stores it as it is logged). The check
    evaluation names it as its target: Dagster counts a partition's check result only while it
    targets the partition's latest materialization, else the partition shows as not evaluated."""
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=MEDIA_USAGE_INDEX, asset_partitions=[slug]), limit=1
    ).records
    if not records or records[0].run_id != context.run_id:
        return None
    return AssetCheckEvaluationTargetMaterializationData(
        storage_id=records[0].storage_id,
        run_id=records[0].run_id,
        timestamp=records[0].timestamp,
    )


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


def coverage_metadata(coverage: CollectionCoverage) -> dict[str, dg.MetadataValue]:
    metadata: dict[str, dg.MetadataValue] = {
        "collection_id": dg.MetadataValue.text(coverage.collection_id),
        "coverage": dg.MetadataValue.text(coverage.status or "none"),
        "sources": dg.MetadataValue.int(coverage.sources),
        "occurrences": dg.MetadataValue.int(coverage.occurrences),
        "pending_work": dg.MetadataValue.int(coverage.pending_work),
        "failed_work": dg.MetadataValue.int(coverage.failed_work),
        "stuck_work": dg.MetadataValue.int(coverage.stuck_work),
        "error_code": dg.MetadataValue.text(coverage.last_error_code or "-"),
    }
    if coverage.entries is not None:
        metadata["entries"] = dg.MetadataValue.int(coverage.entries)
    if coverage.change_epoch is not None:
        metadata["change_epoch"] = dg.MetadataValue.int(coverage.change_epoch)
    return metadata


# --- the check --------------------------------------------------------------------------------


def coverage_check_metadata(coverage: CollectionCoverage) -> dict[str, dg.MetadataValue]:
    """The partition's numbers with the coverage row's error code, and the failed work's codes."""
    metadata = coverage_metadata(coverage)
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


def coverage_check_evaluation(
    coverage: CollectionCoverage,
    target: AssetCheckEvaluationTargetMaterializationData | None = None,
) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=MEDIA_USAGE_INDEX,
        check_name=COVERAGE_CHECK,
        passed=coverage.is_complete,
        severity=dg.AssetCheckSeverity.ERROR,
        description=coverage_verdict(coverage),
        metadata=coverage_check_metadata(coverage),
        partition=coverage.collection_slug,
        target_materialization_data=target,
    )


def _coverage_complete(
    context: dg.AssetCheckExecutionContext, database: MediaUsageDatabase
) -> dg.AssetCheckResult:
    slug = context.partition_key
    engine = database.engine
    collection_id = read_collection_id(engine, slug)
    coverage = None if collection_id is None else read_collection_coverage(engine, collection_id)
    if coverage is None:
        tag_run_outcome(context.op_execution_context, "not_found")
        return dg.AssetCheckResult(
            passed=False,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"no registry collection {slug!r}",
        )
    evaluation = coverage_check_evaluation(coverage)
    tag_run_outcome(context.op_execution_context, "passed" if evaluation.passed else "failed")
    return dg.AssetCheckResult(
        passed=evaluation.passed,
        severity=evaluation.severity,
        description=evaluation.description,
        metadata=evaluation.metadata,
    )


with accepting(PARTITIONED_ASSET_CHECK):
    coverage_complete = dg.asset_check(
        asset=MEDIA_USAGE_INDEX,
        name=COVERAGE_CHECK,
        partitions_def=media_usage_collections,
        description="Fails (ERROR) unless the collection's coverage is complete with no failed and "
        "no stuck (lease expired) work; the metadata carries the counts and error codes. Every run "
        "that changes the collection evaluates it; executing it here reads the database now.",
    )(_coverage_complete)


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
