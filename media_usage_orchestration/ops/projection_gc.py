"""The projection GC job's ops: one pass per run (EmDash runs one per minute), its counters in
the op's metadata and on the asset `media_usage_projection_cleanup`; then the media library's
numbers on the asset `media_usage_media_library`."""

import dagster as dg

from media_usage_orchestration.assets.media_library import record_media_library
from media_usage_orchestration.assets.projection_cleanup import (
    MEDIA_USAGE_PROJECTION_CLEANUP,
    gc_metadata,
)
from media_usage_orchestration.ops.common import TRANSIENT_RETRY_POLICY, retry_transient_errors_only
from media_usage_orchestration.ops.run_tags import tag_run_outcome
from media_usage_orchestration.processing.projection_gc import GcOutcome, run_projection_gc
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.sources.projection_gc import ProjectionGcRepository


@dg.op(
    out=dg.Out(dg.Nothing),
    retry_policy=TRANSIENT_RETRY_POLICY,
    description="One projection-GC pass: claim the projection_gc task row, delete expired "
    "write leases and a bounded batch of obsolete occurrences, record the counters.",
)
def collect_projection_garbage(context: dg.OpExecutionContext, database: MediaUsageDatabase):
    with retry_transient_errors_only(context):
        result = run_projection_gc(database.engine)
    metadata = gc_metadata(result)
    tag_run_outcome(context, result.outcome.value)
    if result.outcome is GcOutcome.FAILED:
        task = ProjectionGcRepository(database.engine).read_task()
        code = task.last_error_code if task else None
        raise dg.Failure(
            description=f"the projection GC pass failed ({code or 'unknown'})",
            metadata={**metadata, "error_code": dg.MetadataValue.text(code or "unknown")},
            allow_retries=False,
        )
    if result.outcome is GcOutcome.COMPLETED:
        context.log_event(
            dg.AssetMaterialization(asset_key=MEDIA_USAGE_PROJECTION_CLEANUP, metadata=metadata)
        )
    else:
        context.log.info("the projection GC task was not due or is held by another pass")
    yield dg.Output(None, metadata=metadata)


@dg.op(
    ins={"after": dg.In(dg.Nothing)},
    out=dg.Out(dg.Nothing),
    retry_policy=TRANSIENT_RETRY_POLICY,
    description="Count EmDash's media rows that content fields use and do not use, and the "
    "bytes of the unused ones; deletes nothing.",
)
def summarize_media_library(context: dg.OpExecutionContext, database: MediaUsageDatabase):
    with retry_transient_errors_only(context):
        metadata = record_media_library(context, database.engine)
    if metadata is None:
        context.log.info("this database has no EmDash media table: nothing to summarize")
        yield dg.Output(None, metadata={"media_table": False})
        return
    yield dg.Output(None, metadata=metadata)
