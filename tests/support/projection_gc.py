"""States for the projection GC tests: an edit storm that leaves obsolete generations behind,
time travel past the safety window (backdating, never sleeping) and GC passes until quiet."""

from __future__ import annotations

import random

from sqlalchemy import Engine, func, insert, select, update
from ulid import ULID

from media_usage_orchestration.emdash_double.aging import obsolete_rows
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.projection_gc.passes import (
    GcLimits,
    GcOutcome,
    GcResult,
    run_projection_gc,
)
from media_usage_orchestration.processing.work.processor import process_due_batch
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.clock import timestamp_offset
from tests.support.projection import active_collection, image
from tests.support.states import backdate, count, db_now

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


def random_edits(
    engine: Engine, ids: list[str], seed: int, edits: int, problems: list[str]
) -> None:
    """`edits` edits of random entries of `posts` (each a new hero), each projected at once (its
    publication under a write lease); an error is added to `problems` (for a thread)."""
    rng, writer = random.Random(seed), CmsWriter(engine)
    try:
        for edit in range(edits):
            content_id = rng.choice(ids)
            writer.update_entry("posts", content_id, {"hero": image(f"{seed}-{edit}")})
            process_due_batch(engine, 4)
    except Exception as error:  # reported by the caller; the test fails on it
        problems.append(f"editor {seed}: {type(error).__name__}: {error}")


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
    return obsolete_rows(engine)


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


def orphans(engine: Engine, how_many: int, seconds_ago: int = 2 * HOUR) -> None:
    """`how_many` occurrence rows of sources that no longer exist, created `seconds_ago`."""
    generation = str(ULID())
    rows = [
        {
            "id": str(ULID()),
            "source_key": f"gone-{index // 10}",
            "generation": generation,
            "field_slug": "hero",
            "field_path": f"hero.{index % 10}",
            "reference_type": "image_field",
            "media_id": "m",
            "provider": "local",
            "provider_asset_id": "m",
        }
        for index in range(how_many)
    ]
    with engine.begin() as connection:
        connection.execute(insert(schema.occurrences), rows)
    backdate(engine, schema.occurrences, "created_at", seconds_ago, media_id="m")


def sources_missing_their_generation(engine: Engine) -> int:
    """Sources whose current generation has no occurrence row left (every test entry has one)."""
    s, o = schema.sources, schema.occurrences
    has_rows = (
        select(o.c.id)
        .where(o.c.source_key == s.c.source_key, o.c.generation == s.c.current_generation)
        .exists()
    )
    with engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(s).where(~has_rows)).scalar_one()


def hold_write_leases(engine: Engine, how_many: int) -> list[tuple[str, str]]:
    """Generations of real sources that are not current, old, and under a live write lease:
    exactly what the GC would reap if it ignored the lease."""
    with engine.connect() as connection:
        keys = (
            connection.execute(select(schema.sources.c.source_key).limit(how_many)).scalars().all()
        )
    held = [(key, str(ULID())) for key in keys]
    with engine.begin() as connection:
        for key, generation in held:
            connection.execute(
                insert(schema.occurrences),
                [
                    {
                        "id": str(ULID()),
                        "source_key": key,
                        "generation": generation,
                        "field_slug": "hero",
                        "field_path": "hero",
                        "reference_type": "image_field",
                        "media_id": "held",
                        "provider": "local",
                        "provider_asset_id": "held",
                    }
                ],
            )
            connection.execute(
                insert(schema.generation_writes),
                [
                    {
                        "source_key": key,
                        "generation": generation,
                        "lease_token": str(ULID()),
                        "expires_at": db_now(engine, HOUR),
                        "created_at": db_now(engine),
                    }
                ],
            )
    backdate(engine, schema.occurrences, "created_at", 2 * HOUR, media_id="held")
    return held
