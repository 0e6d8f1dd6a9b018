"""The projection GC in the UI: each run that completed a pass materializes the asset
`media_usage_projection_cleanup` with its totals, so the asset page plots what each run reaped
and the backlog its last pass saw."""

import dagster as dg

from media_usage_orchestration.processing.projection_gc.passes import GcRun

MEDIA_USAGE_PROJECTION_CLEANUP = dg.AssetKey("media_usage_projection_cleanup")

media_usage_projection_cleanup = dg.AssetSpec(
    MEDIA_USAGE_PROJECTION_CLEANUP,
    group_name="media_usage",
    kinds={"sql"},
    description="The projection GC of EmDash's media usage index: each run records what its "
    "passes deleted (orphans, stale and abandoned generations, expired write leases), the "
    "candidates they scanned, how many passes ran and why the run stopped, and the lower bound "
    "of the backlog its last pass saw.",
)


def gc_metadata(run: GcRun) -> dict[str, dg.MetadataValue]:
    """The run's totals; `backlog_lower_bound` and `scan_has_more` are its last pass's."""
    c = run.counters
    return {
        "outcome": dg.MetadataValue.text(run.outcome.value),
        "passes": dg.MetadataValue.int(run.completed_passes),
        "stopped_by": dg.MetadataValue.text(run.ended.value),
        "candidates": dg.MetadataValue.int(c.candidate_count),
        "deleted_orphans": dg.MetadataValue.int(c.deleted_orphans),
        "deleted_stale": dg.MetadataValue.int(c.deleted_stale),
        "deleted_abandoned": dg.MetadataValue.int(c.deleted_abandoned),
        "deleted_write_leases": dg.MetadataValue.int(c.deleted_write_leases),
        "deleted_rows": dg.MetadataValue.int(run.deleted_rows),
        "backlog_lower_bound": dg.MetadataValue.int(c.backlog_lower_bound),
        "scan_has_more": dg.MetadataValue.bool(c.scan_has_more),
        "duration_ms": dg.MetadataValue.int(c.duration_ms),
    }
