"""The media library in the UI: the asset `media_usage_media_library` records how many of
EmDash's media rows content fields use, how many they do not, and the bytes those hold, so the
asset page plots the reclaimable space over time. Counts of unused media are recorded only while
every collection's coverage proves them (otherwise an observation says why they are not). The
count is one bounded read (`store/sources/usage.py: media_summary`): past its time limit it is
cancelled and observed as not counted, so it never holds up the projection GC run it ends."""

import dagster as dg

from media_usage_orchestration.processing.operator.usage import NOT_INDEXED, media_library_summary
from media_usage_orchestration.store.core.engine import Engine, StatementTimedOut

MEDIA_USAGE_MEDIA_LIBRARY = dg.AssetKey("media_usage_media_library")

media_usage_media_library = dg.AssetSpec(
    MEDIA_USAGE_MEDIA_LIBRARY,
    group_name="media_usage",
    kinds={"sql"},
    description="EmDash's media library seen through the usage index: media rows, used, "
    f"unused and reclaimable bytes (nothing is deleted); {NOT_INDEXED}.",
)


def record_media_library(
    context: dg.OpExecutionContext, engine: Engine
) -> dict[str, dg.MetadataValue] | None:
    """Materialize the media library when coverage proves its counts, observe it with the
    incomplete collections otherwise, or with why it was not counted when the count hit its
    time limit (`SUMMARY_SECONDS`); None when the database has no EmDash media table."""
    try:
        found = media_library_summary(engine)
    except StatementTimedOut as timed_out:
        context.log.warning(f"the media library was not counted: {timed_out}")
        metadata = {"not_counted": dg.MetadataValue.text(str(timed_out))}
        context.log_event(
            dg.AssetObservation(asset_key=MEDIA_USAGE_MEDIA_LIBRARY, metadata=metadata)
        )
        return metadata
    if found is None:
        return None
    summary, coverage = found
    metadata = {
        "media": dg.MetadataValue.int(summary.media),
        "coverage": dg.MetadataValue.text(coverage.status),
    }
    if coverage.proves_absence:
        metadata.update(
            used=dg.MetadataValue.int(summary.used),
            unused=dg.MetadataValue.int(summary.unused),
            reclaimable_bytes=dg.MetadataValue.int(summary.reclaimable_bytes),
        )
        context.log_event(
            dg.AssetMaterialization(asset_key=MEDIA_USAGE_MEDIA_LIBRARY, metadata=metadata)
        )
    else:
        incomplete = ", ".join(view.collection for view in coverage.incomplete)
        metadata["incomplete"] = dg.MetadataValue.text(incomplete)
        context.log_event(
            dg.AssetObservation(asset_key=MEDIA_USAGE_MEDIA_LIBRARY, metadata=metadata)
        )
    return metadata
