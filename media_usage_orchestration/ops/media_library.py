"""The media library in the UI: the asset `media_usage_media_library` records how many of
EmDash's media rows content fields use, how many they do not, and the bytes those hold, so the
asset page plots the reclaimable space over time. Counts of unused media are recorded only while
every collection's coverage proves them (otherwise an observation says why they are not)."""

import dagster as dg

from ..processing.usage import NOT_INDEXED, media_library_summary
from ..resources.database import MediaUsageDatabase
from .common import TRANSIENT_RETRY_POLICY, retry_transient_errors_only

MEDIA_USAGE_MEDIA_LIBRARY = dg.AssetKey("media_usage_media_library")

media_usage_media_library = dg.AssetSpec(
    MEDIA_USAGE_MEDIA_LIBRARY,
    group_name="media_usage",
    kinds={"sql"},
    description="EmDash's media library seen through the usage index: media rows, used, "
    f"unused and reclaimable bytes (nothing is deleted); {NOT_INDEXED}.",
)


@dg.op(
    ins={"after": dg.In(dg.Nothing)},
    out=dg.Out(dg.Nothing),
    retry_policy=TRANSIENT_RETRY_POLICY,
    description="Count EmDash's media rows that content fields use and do not use, and the "
    "bytes of the unused ones; deletes nothing.",
)
def summarize_media_library(context: dg.OpExecutionContext, database: MediaUsageDatabase):
    with retry_transient_errors_only():
        found = media_library_summary(database.engine)
    if found is None:
        context.log.info("this database has no EmDash media table: nothing to summarize")
        yield dg.Output(None, metadata={"media_table": False})
        return
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
    yield dg.Output(None, metadata=metadata)
