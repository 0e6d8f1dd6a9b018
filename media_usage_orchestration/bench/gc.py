"""How fast the projection GC reaps a backlog: N obsolete occurrence rows (stale and abandoned
generations, aged past the safety window in database time, as the tests backdate rows) beside
the current generations of reconciled sample entries, reaped by real `media_usage_projection_gc`
runs that the projection-GC sensor requests (the in-process lane, as the other Dagster
measurements run), until the sensor asks for no more.

Every source of `N / ROWS_PER_ENTRY` reconciled entries gets past generations, copies of its
current rows under older generation ids, until the backlog holds N rows: four in five stale
(created before the source was last indexed), one in five abandoned (created after it, never
made current). The collection was indexed three hours ago: its current rows are older than the
cutoff too, so the sweep walks past them as it would in a deployment.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import cycle

from sqlalchemy import Engine, func, insert, literal, select, update
from ulid import ULID

from media_usage_orchestration.bench.database import (
    console,
    coverage_is_complete,
    create_collection,
    index_is_verified,
    insert_entries,
)
from media_usage_orchestration.bench.measure import DriverMode, dagster_lane, lane_sensors, timed
from media_usage_orchestration.processing.activation import activate
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.clock import timestamp_offset
from media_usage_orchestration.store.core.engine import create_database_engine

# Backlog rows per reconciled entry: about ten past generations of its five or so occurrences.
ROWS_PER_ENTRY = 50
ABANDONED_EVERY = 5  # every fifth past generation never landed
INSERT_CHUNK = 1000
HOUR = 3600
INDEXED_AGO = 3 * HOUR
STALE_AGO = 4 * HOUR  # before the source was indexed
ABANDONED_AGO = 2 * HOUR  # after it, still an hour past the safety window
GC_JOB = "media_usage_projection_gc"
COPIED_COLUMNS = (
    "source_key",
    "field_slug",
    "field_path",
    "occurrence_index",
    "reference_type",
    "media_id",
    "provider",
    "provider_asset_id",
    "media_kind",
    "mime_type",
)


@dataclass(frozen=True)
class Backlog:
    stale: int
    abandoned: int
    current: int

    @property
    def rows(self) -> int:
        return self.stale + self.abandoned


def _db_time(engine: Engine, seconds: int) -> str:
    with engine.connect() as connection:
        return connection.execute(select(timestamp_offset(seconds))).scalar_one()


def _current_rows(engine: Engine) -> dict[str, list[dict]]:
    o, s = schema.occurrences, schema.sources
    statement = (
        select(*(o.c[name] for name in COPIED_COLUMNS))
        .join(s, (s.c.source_key == o.c.source_key) & (s.c.current_generation == o.c.generation))
        .order_by(o.c.source_key, o.c.field_path, o.c.occurrence_index)
    )
    by_source: dict[str, list[dict]] = {}
    with engine.connect() as connection:
        for row in connection.execute(statement).mappings():
            by_source.setdefault(row["source_key"], []).append(dict(row))
    return by_source


def _past_generations(by_source: dict[str, list[dict]], rows: int) -> Iterator[tuple[str, dict]]:
    """(kind, row) of past generations, the sources taken in turn, until `rows` rows."""
    made = 0
    rounds: dict[str, int] = {}
    for source_key in cycle(sorted(by_source)):
        round_ = rounds[source_key] = rounds.get(source_key, 0) + 1
        kind = "abandoned" if round_ % ABANDONED_EVERY == 0 else "stale"
        generation = str(ULID())  # never current: the source's generation stays the newest
        for current in by_source[source_key]:
            if made == rows:
                return
            made += 1
            yield kind, {**current, "id": str(ULID()), "generation": generation}


def build_backlog(engine: Engine, rows: int) -> Backlog:
    """Age the index three hours, then add `rows` past-generation rows aged past the safety
    window (all timestamps from the database)."""
    with engine.begin() as connection:
        connection.execute(update(schema.sources).values(indexed_at=timestamp_offset(-INDEXED_AGO)))
        connection.execute(
            update(schema.occurrences).values(created_at=timestamp_offset(-INDEXED_AGO))
        )
    created = {"stale": _db_time(engine, -STALE_AGO), "abandoned": _db_time(engine, -ABANDONED_AGO)}
    by_source = _current_rows(engine)
    current = sum(len(each) for each in by_source.values())
    counts = {"stale": 0, "abandoned": 0}
    chunk: list[dict] = []
    with engine.begin() as connection:
        for kind, row in _past_generations(by_source, rows):
            counts[kind] += 1
            chunk.append({**row, "created_at": created[kind]})
            if len(chunk) == INSERT_CHUNK:
                connection.execute(insert(schema.occurrences), chunk)
                chunk = []
        if chunk:
            connection.execute(insert(schema.occurrences), chunk)
    return Backlog(counts["stale"], counts["abandoned"], current)


def obsolete_rows(engine: Engine) -> int:
    """Occurrence rows that are not their source's current generation."""
    o, s = schema.occurrences, schema.sources
    current = (
        select(literal(1))
        .where(s.c.source_key == o.c.source_key, s.c.current_generation == o.c.generation)
        .exists()
    )
    with engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(o).where(~current)).scalar_one()


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
        collection = create_collection(engine)
        insert_entries(engine, entries)
        activate(engine)
        DriverMode(engine, collection).reconcile()
        if not coverage_is_complete(engine, collection):
            raise RuntimeError("coverage is not complete after the reconciliation")
        backlog = build_backlog(engine, rows)
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
        }
    finally:
        engine.dispose()


__all__ = ["Backlog", "build_backlog", "obsolete_rows", "run_gc"]
