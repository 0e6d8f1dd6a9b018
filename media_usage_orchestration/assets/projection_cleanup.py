"""The projection GC in the UI: each completed pass materializes the asset
`media_usage_projection_cleanup` with its counters, so the asset page plots the backlog
shrinking pass after pass."""

import dagster as dg

from media_usage_orchestration.processing.projection_gc import GcResult

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
