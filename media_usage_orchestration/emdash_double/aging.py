"""Time travel for the demo: rows made older than they are, in database time, so what waits
for a time window can be shown without waiting for it (the tests backdate rows the same way).

The projection GC reaps only occurrences older than its safety window (an hour): aged past
it, the generations an edit replaced are what a pass an hour later would find.
"""

from __future__ import annotations

from sqlalchemy import Engine, literal, select, update

from media_usage_orchestration.processing.projection_gc import GcLimits
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.clock import timestamp_offset

# How far past the safety window the aged rows are put.
PAST_THE_WINDOW_SECONDS = 300


def age_replaced_generations(engine: Engine, window_seconds: int | None = None) -> int:
    """Backdate `created_at` of every occurrence row that is not of its source's current
    generation (replaced by a later projection, or left by a source since removed) past the
    projection GC's safety window; current generations keep their time. Returns the rows."""
    window = GcLimits().safety_window_seconds if window_seconds is None else window_seconds
    occurrences, sources = schema.occurrences, schema.sources
    current = (
        select(literal(1))
        .where(
            sources.c.source_key == occurrences.c.source_key,
            sources.c.current_generation == occurrences.c.generation,
        )
        .exists()
    )
    statement = (
        update(occurrences)
        .where(~current)
        .values(created_at=timestamp_offset(-(window + PAST_THE_WINDOW_SECONDS)))
    )
    with engine.begin() as connection:
        return connection.execute(statement).rowcount
