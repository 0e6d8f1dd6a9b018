"""The projection GC in Dagster: one pass per run (EmDash runs one per minute), its counters in
the op's metadata and on the asset `media_usage_projection_cleanup`, so the asset page plots
the backlog shrinking pass after pass."""

import dagster as dg

from ..processing.projection_gc import GcOutcome, GcResult, run_projection_gc
from ..resources.database import MediaUsageDatabase
from ..store.projection_gc import ProjectionGcRepository
from .common import TRANSIENT_RETRY_POLICY, retry_transient_errors_only

MEDIA_USAGE_PROJECTION_CLEANUP = dg.AssetKey("media_usage_projection_cleanup")

media_usage_projection_cleanup = dg.AssetSpec(
    MEDIA_USAGE_PROJECTION_CLEANUP,
    group_name="media_usage",
    kinds={"sql"},
    description="The projection GC of EmDash's media usage index: each completed pass records "
    "what it deleted (orphans, stale and abandoned generations, expired write leases), the "
    "candidates it scanned and a lower bound of the backlog it saw.",
)


def gc_metadata(result: GcResult) -> dict[str, dg.MetadataValue]:
    c = result.counters
    return {
        "outcome": dg.MetadataValue.text(result.outcome.value),
        "candidates": dg.MetadataValue.int(c.candidate_count),
        "deleted_orphans": dg.MetadataValue.int(c.deleted_orphans),
        "deleted_stale": dg.MetadataValue.int(c.deleted_stale),
        "deleted_abandoned": dg.MetadataValue.int(c.deleted_abandoned),
        "deleted_write_leases": dg.MetadataValue.int(c.deleted_write_leases),
        "deleted_rows": dg.MetadataValue.int(result.deleted_rows),
        "backlog_lower_bound": dg.MetadataValue.int(c.backlog_lower_bound),
        "scan_has_more": dg.MetadataValue.bool(c.scan_has_more),
        "duration_ms": dg.MetadataValue.int(c.duration_ms),
    }


@dg.op(
    out=dg.Out(dg.Nothing),
    retry_policy=TRANSIENT_RETRY_POLICY,
    description="One projection-GC pass: claim the projection_gc task row, delete expired "
    "write leases and a bounded batch of obsolete occurrences, record the counters.",
)
def collect_projection_garbage(context: dg.OpExecutionContext, database: MediaUsageDatabase):
    with retry_transient_errors_only():
        result = run_projection_gc(database.engine)
    metadata = gc_metadata(result)
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
