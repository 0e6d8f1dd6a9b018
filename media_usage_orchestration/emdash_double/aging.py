"""Time travel for the demo and the GC bench: rows made older than they are, in database time,
so what waits for a time window can be shown without waiting for it (the tests backdate rows
the same way).

The projection GC reaps only occurrences older than its safety window (an hour): aged past
it, the generations an edit replaced are what a pass an hour later would find.

`build_aged_backlog` is a busy CMS's leftovers for the GC bench: an index aged three hours,
and past generations of each source (copies of its current rows under older generation ids)
until the backlog holds N rows, four in five stale (created before the source was last
indexed), one in five abandoned (created after it, never made current). The current rows are
older than the cutoff too, so the sweep walks past them as it would in a deployment.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import cycle

from sqlalchemy import Engine, func, insert, literal, select, update
from ulid import ULID

from media_usage_orchestration.processing.projection_gc.passes import GcLimits
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.clock import timestamp_offset

# How far past the safety window the aged rows are put.
PAST_THE_WINDOW_SECONDS = 300
ABANDONED_EVERY = 5  # every fifth past generation never landed
INSERT_CHUNK = 1000
HOUR = 3600
INDEXED_AGO = 3 * HOUR
STALE_AGO = 4 * HOUR  # before the source was indexed
ABANDONED_AGO = 2 * HOUR  # after it, still an hour past the safety window
# What a past generation's row copies from the current one: all but its identity and time.
NOT_COPIED = {"id", "generation", "created_at", "cleanup_lease_token"}


def _of_current_generation():
    """EXISTS: the occurrence row belongs to its source's current generation."""
    occurrences, sources = schema.occurrences, schema.sources
    return (
        select(literal(1))
        .where(
            sources.c.source_key == occurrences.c.source_key,
            sources.c.current_generation == occurrences.c.generation,
        )
        .exists()
    )


def age_replaced_generations(engine: Engine, window_seconds: int | None = None) -> int:
    """Backdate `created_at` of every occurrence row that is not of its source's current
    generation (replaced by a later projection, or left by a source since removed) past the
    projection GC's safety window; current generations keep their time. Returns the rows."""
    window = GcLimits().safety_window_seconds if window_seconds is None else window_seconds
    statement = (
        update(schema.occurrences)
        .where(~_of_current_generation())
        .values(created_at=timestamp_offset(-(window + PAST_THE_WINDOW_SECONDS)))
    )
    with engine.begin() as connection:
        return connection.execute(statement).rowcount


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
        select(*(column for column in o.c if column.name not in NOT_COPIED))
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


def build_aged_backlog(engine: Engine, rows: int) -> Backlog:
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
    statement = select(func.count()).select_from(schema.occurrences)
    with engine.connect() as connection:
        return connection.execute(statement.where(~_of_current_generation())).scalar_one()
