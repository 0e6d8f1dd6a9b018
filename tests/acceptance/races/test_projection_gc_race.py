"""PostgreSQL: projection-GC passes race projections (threads editing entries and projecting
their work) with no safety window at all, so every in-flight generation is a candidate. No
current generation and no generation under a live write lease may ever lose a row; a late
publication below the fence's floor is a no-op; in the end the index equals the content."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import update

from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.projection_gc.passes import (
    GcLimits,
    GcOutcome,
    run_projection_gc,
)
from media_usage_orchestration.store.core import schema
from tests.support.projection_gc import (
    drain,
    edit_storm,
    gc_until_quiet,
    hold_write_leases,
    non_current_occurrences,
    random_edits,
    sources_missing_their_generation,
)
from tests.support.states import count, one

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres_only("row locks and the fence's FOR SHARE ordering are PostgreSQL's"),
]

AGGRESSIVE = GcLimits(interval_seconds=0, safety_window_seconds=0, candidate_limit=60)
EDITORS = 2
EDITS_PER_EDITOR = 40
HELD = 4


def test_gc_passes_racing_projections_keep_current_and_leased_generations(activated):
    engine = activated.engine
    ids = edit_storm(engine, "posts", entries=8, rounds=1)
    held = hold_write_leases(engine, HELD)
    stop = threading.Event()
    problems: list[str] = []
    passes: list[GcOutcome] = []
    deleted: list[int] = []

    def collector() -> None:
        try:
            while not stop.is_set():
                result = run_projection_gc(engine, AGGRESSIVE)
                passes.append(result.outcome)
                deleted.append(result.deleted_rows)
                missing = sources_missing_their_generation(engine)
                if missing:
                    problems.append(f"{missing} sources lost their current generation")
        except Exception as error:
            problems.append(f"gc: {type(error).__name__}: {error}")

    editors = [
        threading.Thread(target=random_edits, args=(engine, ids, seed, EDITS_PER_EDITOR, problems))
        for seed in range(EDITORS)
    ]
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
    assert sources_missing_their_generation(engine) == 0
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
