"""PostgreSQL: projection-GC passes race projections (threads editing entries and projecting
their work) with no safety window at all, so every in-flight generation is a candidate. No
current generation and no generation under a live write lease may ever lose a row; a late
publication below the fence's floor is a no-op; in the end the index equals the content."""

from __future__ import annotations

import random
import threading

import pytest
from sqlalchemy import func, insert, select, update
from ulid import ULID

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.projection_gc import (
    GcLimits,
    GcOutcome,
    run_projection_gc,
)
from media_usage_orchestration.processing.verify import verify_index
from media_usage_orchestration.processing.work import process_due_batch
from media_usage_orchestration.store.core import schema
from tests.support.projection import image
from tests.support.projection_gc import (
    HOUR,
    drain,
    edit_storm,
    gc_until_quiet,
    non_current_occurrences,
)
from tests.support.states import backdate, count, db_now, one

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres_only("row locks and the fence's FOR SHARE ordering are PostgreSQL's"),
]

AGGRESSIVE = GcLimits(interval_seconds=0, safety_window_seconds=0, candidate_limit=60)
EDITORS = 2
EDITS_PER_EDITOR = 40
HELD = 4


def _sources_missing_their_generation(engine) -> int:
    s, o = schema.sources, schema.occurrences
    has_rows = (
        select(o.c.id)
        .where(o.c.source_key == s.c.source_key, o.c.generation == s.c.current_generation)
        .exists()
    )
    with engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(s).where(~has_rows)).scalar_one()


def _hold_write_leases(engine) -> list[tuple[str, str]]:
    """Generations of real sources that are not current, old, and under a live write lease:
    exactly what the GC would reap if it ignored the lease."""
    with engine.connect() as connection:
        keys = connection.execute(select(schema.sources.c.source_key).limit(HELD)).scalars().all()
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


def test_gc_passes_racing_projections_keep_current_and_leased_generations(activated):
    engine = activated.engine
    ids = edit_storm(engine, "posts", entries=8, rounds=1)
    held = _hold_write_leases(engine)
    stop = threading.Event()
    problems: list[str] = []
    passes: list[GcOutcome] = []
    deleted: list[int] = []

    def editor(seed: int) -> None:
        rng, writer = random.Random(seed), CmsWriter(engine)
        try:
            for edit in range(EDITS_PER_EDITOR):
                content_id = rng.choice(ids)
                writer.update_entry("posts", content_id, {"hero": image(f"{seed}-{edit}")})
                process_due_batch(engine, 4)
        except Exception as error:  # reported below; the test fails on it
            problems.append(f"editor {seed}: {type(error).__name__}: {error}")

    def collector() -> None:
        try:
            while not stop.is_set():
                result = run_projection_gc(engine, AGGRESSIVE)
                passes.append(result.outcome)
                deleted.append(result.deleted_rows)
                missing = _sources_missing_their_generation(engine)
                if missing:
                    problems.append(f"{missing} sources lost their current generation")
        except Exception as error:
            problems.append(f"gc: {type(error).__name__}: {error}")

    editors = [threading.Thread(target=editor, args=(seed,)) for seed in range(EDITORS)]
    gc = threading.Thread(target=collector)
    gc.start()
    for thread in editors:
        thread.start()
    for thread in editors:
        thread.join(timeout=300)
    stop.set()
    gc.join(timeout=60)

    assert problems == []
    assert GcOutcome.FAILED not in passes
    assert passes.count(GcOutcome.COMPLETED) > 3 and sum(deleted) > 0
    for key, generation in held:  # the leased generations kept every row
        assert count(engine, schema.occurrences, source_key=key, generation=generation) == 1

    drain(engine)
    gc_until_quiet(engine, AGGRESSIVE)
    assert non_current_occurrences(engine) == HELD  # only the leased generations remain
    assert _sources_missing_their_generation(engine) == 0
    assert not verify_index(engine).has_drift

    # a late publish of a generation the GC reaped (no live lease) is dropped by the fence
    floor = one(engine, schema.cleanup_fence, task_key="projection_gc")["generation_floor"]
    key = held[0][0]
    before = one(engine, schema.sources, source_key=key)["current_generation"]
    with engine.begin() as connection:
        connection.execute(
            update(schema.sources)
            .where(schema.sources.c.source_key == key)
            .values(current_generation=floor)
        )
    assert one(engine, schema.sources, source_key=key)["current_generation"] == before
