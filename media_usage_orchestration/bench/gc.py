"""How fast the projection GC reaps a backlog: N obsolete occurrence rows (stale and abandoned
generations aged past the safety window in database time, `emdash_double/aging.py`) beside the
current generations of `N / ROWS_PER_ENTRY` reconciled sample entries, reaped by real
`media_usage_projection_gc` runs that the projection-GC sensor requests (the in-process lane,
as the other Dagster measurements run), until the sensor asks for no more.
"""

from __future__ import annotations

import os

from media_usage_orchestration.bench.database import (
    console,
    coverage_is_complete,
    index_is_verified,
)
from media_usage_orchestration.bench.measure import (
    dagster_lane,
    lane_sensors,
    reconciled_collection,
    timed,
)
from media_usage_orchestration.emdash_double.aging import build_aged_backlog, obsolete_rows
from media_usage_orchestration.store.core.engine import create_database_engine

# Backlog rows per reconciled entry: about ten past generations of its five or so occurrences.
ROWS_PER_ENTRY = 50


def _passes_and_deleted(instance) -> tuple[int, int]:
    """The passes and deleted rows every GC run recorded on the cleanup asset."""
    import dagster as dg

    from media_usage_orchestration.assets.projection_cleanup import (
        MEDIA_USAGE_PROJECTION_CLEANUP,
    )

    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=MEDIA_USAGE_PROJECTION_CLEANUP), limit=10_000
    ).records
    metadata = [record.asset_materialization.metadata for record in records]
    return (
        sum(each["passes"].value for each in metadata),
        sum(each["deleted_rows"].value for each in metadata),
    )


def run_gc(url: str, rows: int, profile: str | None = None) -> dict:
    """Reconcile the entries, build the backlog, then run the lane with the projection-GC
    sensor until it asks for no more runs; the record says what was left."""
    engine = create_database_engine(url)
    try:
        entries = max(1, rows // ROWS_PER_ENTRY)
        collection = reconciled_collection(engine, entries)
        backlog = build_aged_backlog(engine, rows)
        console.print(
            f"{entries:,} entries reconciled ({backlog.current:,} current rows); backlog of "
            f"{backlog.rows:,} rows ({backlog.stale:,} stale, {backlog.abandoned:,} abandoned) "
            "aged past the safety window; running the projection GC"
        )
        sensors = lane_sensors("media_usage_projection_gc_sensor")
        with dagster_lane(url) as lane:
            measured = timed(url, lambda: lane(sensors), profile=profile)
            passes, deleted = _passes_and_deleted(lane.instance)
        left = obsolete_rows(engine)
        verified = index_is_verified(engine) and coverage_is_complete(engine, collection)
        seconds = measured.seconds
        return {
            "workload": "gc",
            "dialect": engine.dialect.name,
            "backlog_rows": backlog.rows,
            "stale_rows": backlog.stale,
            "abandoned_rows": backlog.abandoned,
            "current_rows": backlog.current,
            "seconds": round(seconds, 3),
            "runs": measured.runs,
            "passes": passes,
            "deleted_rows": deleted,
            "rows_per_second": round(deleted / seconds, 1) if seconds else None,
            "pass_ms": round(seconds * 1000 / passes, 2) if passes else None,
            "statements_per_pass": round(sum(measured.phase_statements.values()) / passes, 1)
            if passes
            else None,
            "backlog_left": left,
            "verified": verified and left == 0,
            # the machine's load when the runs ended (a shared machine's figures vary with it)
            "load_average": round(os.getloadavg()[0], 2),
        }
    finally:
        engine.dispose()


__all__ = ["ROWS_PER_ENTRY", "run_gc"]
