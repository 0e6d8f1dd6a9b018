"""The projection GC job's ops: passes back to back while the backlog keeps them full (EmDash
runs one a minute), the run's totals in the op's metadata and on the asset
`media_usage_projection_cleanup`; then the media library's numbers on the asset
`media_usage_media_library`."""

import dagster as dg
from pydantic import Field

from media_usage_orchestration.assets.media_library import record_media_library
from media_usage_orchestration.assets.projection_cleanup import (
    MEDIA_USAGE_PROJECTION_CLEANUP,
    gc_metadata,
)
from media_usage_orchestration.dagster_kit.progress import logged_progress
from media_usage_orchestration.dagster_kit.retries import (
    retries_transient_errors,
    retry_transient_errors_only,
)
from media_usage_orchestration.dagster_kit.run_tags import tag_run_outcome
from media_usage_orchestration.processing.projection_gc.passes import (
    DEFAULT_RUN_SECONDS,
    GcOutcome,
    GcResult,
    GcRun,
    run_projection_gc_passes,
)
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.projection_gc.repository import ProjectionGcRepository


class CollectProjectionGarbageConfig(dg.Config):
    max_seconds: float = Field(
        default=DEFAULT_RUN_SECONDS,
        gt=0,
        le=3600,
        description="Start no further pass after this many seconds; the task row is then left "
        "due, so the sensor's next tick launches the next run.",
    )


class _LastPass:
    """The counters of the latest pass, for the progress lines."""

    def __init__(self) -> None:
        self.passes = 0
        self.result: GcResult | None = None

    def heard(self, result: GcResult) -> int:
        self.passes += 1
        self.result = result
        return result.deleted_rows

    def describe(self) -> str:
        if self.result is None:
            return "no pass yet"
        c = self.result.counters
        return (
            f"pass {self.passes} {self.result.outcome.value}: {c.candidate_count} candidates, "
            f"deleted {c.deleted_orphans} orphans, {c.deleted_stale} stale, "
            f"{c.deleted_abandoned} abandoned, {c.deleted_write_leases} write leases"
        )


def _collect(
    context: dg.OpExecutionContext, database: MediaUsageDatabase, max_seconds: float
) -> GcRun:
    last = _LastPass()
    with logged_progress(
        context, "collect_projection_garbage", "rows deleted", detail=last.describe
    ) as progress:
        return run_projection_gc_passes(
            database.engine, max_seconds=max_seconds, progress=progress.counting(last.heard)
        )


@dg.op(
    out=dg.Out(dg.Nothing),
    description="Projection-GC passes back to back while each is full (it hit its delete limit "
    "or a full window), each its own claim of the projection_gc task row: delete expired write "
    "leases and a bounded batch of obsolete occurrences; record the run's totals.",
)
@retries_transient_errors
def collect_projection_garbage(
    context: dg.OpExecutionContext,
    config: CollectProjectionGarbageConfig,
    database: MediaUsageDatabase,
):
    with retry_transient_errors_only(context):
        run = _collect(context, database, config.max_seconds)
    metadata = gc_metadata(run)
    tag_run_outcome(context, run.outcome.value)
    if run.outcome is GcOutcome.FAILED:
        task = ProjectionGcRepository(database.engine).read_task()
        code = task.last_error_code if task else None
        raise dg.Failure(
            description=f"a projection GC pass failed ({code or 'unknown'}) after "
            f"{run.completed_passes} completed pass(es)",
            metadata={**metadata, "error_code": dg.MetadataValue.text(code or "unknown")},
            allow_retries=False,
        )
    if run.outcome is GcOutcome.COMPLETED:
        context.log_event(
            dg.AssetMaterialization(asset_key=MEDIA_USAGE_PROJECTION_CLEANUP, metadata=metadata)
        )
    else:
        context.log.info("the projection GC task was not due or is held by another pass")
    yield dg.Output(None, metadata=metadata)


@dg.op(
    ins={"after": dg.In(dg.Nothing)},
    out=dg.Out(dg.Nothing),
    description="Count EmDash's media rows that content fields use and do not use, and the "
    "bytes of the unused ones; deletes nothing.",
)
@retries_transient_errors
def summarize_media_library(context: dg.OpExecutionContext, database: MediaUsageDatabase):
    with retry_transient_errors_only(context):
        metadata = record_media_library(context, database.engine)
    if metadata is None:
        context.log.info("this database has no EmDash media table: nothing to summarize")
        yield dg.Output(None, metadata={"media_table": False})
        return
    yield dg.Output(None, metadata=metadata)
