"""States for the projection GC tests: an edit storm that leaves obsolete generations behind,
time travel past the safety window (backdating, never sleeping) and GC passes until quiet."""

from __future__ import annotations

from sqlalchemy import Engine, func, select, update

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.projection_gc import (
    GcLimits,
    GcOutcome,
    GcResult,
    run_projection_gc,
)
from media_usage_orchestration.processing.work import process_due_batch
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.clock import timestamp_offset
from tests.support.projection import active_collection, image
from tests.support.states import backdate, count

HOUR = 3600


def drain(engine: Engine) -> None:
    for _ in range(50):
        if process_due_batch(engine, 25).counts.claimed == 0:
            break
    assert count(engine, schema.work) == 0


def edit_storm(engine: Engine, slug: str, entries: int, rounds: int) -> list[str]:
    """`entries` published entries, each re-edited `rounds` times with new media, every round
    projected: each edit leaves the previous generation behind."""
    active_collection(engine, slug)
    writer = CmsWriter(engine)
    ids = [f"{slug}-{index:03d}" for index in range(entries)]
    writer.insert_entries(
        slug,
        [
            {"id": id_, "slug": id_, "status": "published", "title": id_, "hero": image(f"{id_}-0")}
            for id_ in ids
        ],
    )
    drain(engine)
    for round_ in range(1, rounds + 1):
        for id_ in ids:
            writer.update_entry(slug, id_, {"hero": image(f"{id_}-{round_}")})
        drain(engine)
    return ids


def age_occurrences(engine: Engine, seconds: int = 2 * HOUR) -> None:
    """Every occurrence row created `seconds` ago: past the safety window."""
    backdate(engine, schema.occurrences, "created_at", seconds)


def make_gc_due(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(
            update(schema.cleanup)
            .where(schema.cleanup.c.task_key == "projection_gc")
            .values(next_eligible_at=timestamp_offset(-1))
        )


def non_current_occurrences(engine: Engine) -> int:
    o, s = schema.occurrences, schema.sources
    current = (
        select(s.c.source_key)
        .where(s.c.source_key == o.c.source_key, s.c.current_generation == o.c.generation)
        .exists()
    )
    with engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(o).where(~current)).scalar_one()


def gc_until_quiet(
    engine: Engine, limits: GcLimits | None = None, max_passes: int = 50
) -> list[GcResult]:
    """GC passes, each made due, until a pass finishes a sweep without deleting anything."""
    results = []
    for _ in range(max_passes):
        make_gc_due(engine)
        result = run_projection_gc(engine, limits)
        assert result.outcome is GcOutcome.COMPLETED, result
        results.append(result)
        task = one_task(engine)
        if (
            result.deleted_rows == 0
            and result.counters.deleted_write_leases == 0
            and (task["cursor_id"] is None)
        ):
            return results
    raise AssertionError(f"GC did not settle in {max_passes} passes")


def one_task(engine: Engine) -> dict:
    with engine.connect() as connection:
        return dict(
            connection.execute(
                select(schema.cleanup).where(schema.cleanup.c.task_key == "projection_gc")
            )
            .mappings()
            .one()
        )
