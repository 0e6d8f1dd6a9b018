"""PostgreSQL: the project's looping GC runs (passes back to back while full) and EmDash-style
single passes (the project's pass function called one at a time, as EmDash's cron tick calls
it) share the one task row while writers publish new generations under write leases, with
everything aged past the safety window (a window of zero). No current or leased generation
ever loses a row; in the end the index verifies clean."""

from __future__ import annotations

import threading

import pytest

from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.projection_gc.passes import (
    GcLimits,
    GcOutcome,
    GcRunEnd,
    run_projection_gc,
    run_projection_gc_passes,
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
from tests.support.states import count

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres_only("row locks and the fence's FOR SHARE ordering are PostgreSQL's"),
]

# Small windows, so the looping runs' passes are full and follow one another; no safety window
# and no interval, so every generation in flight is a candidate and the row is always due.
LIMITS = GcLimits(interval_seconds=0, safety_window_seconds=0, candidate_limit=20, delete_limit=5)
EDITORS = 2
EDITS_PER_EDITOR = 30
HELD = 4


def test_looping_runs_and_single_passes_keep_current_and_leased_generations(activated):
    engine = activated.engine
    ids = edit_storm(engine, "posts", entries=10, rounds=2)
    held = hold_write_leases(engine, HELD)
    stop = threading.Event()
    # EmDash's passes start once the first looping run has ended: that run finds the storm's
    # backlog whole and shows passes back to back however the threads are scheduled.
    first_run_ended = threading.Event()
    problems: list[str] = []
    runs: list = []
    single: list[GcOutcome] = []

    def check(who: str) -> None:
        missing = sources_missing_their_generation(engine)
        if missing:
            problems.append(f"{who}: {missing} sources lost their current generation")

    def looping_runs() -> None:
        try:
            while not stop.is_set():
                runs.append(run_projection_gc_passes(engine, LIMITS, max_seconds=1.0))
                first_run_ended.set()
                check("run")
        except Exception as error:
            problems.append(f"run: {type(error).__name__}: {error}")
        finally:
            first_run_ended.set()

    def emdash_ticks() -> None:
        try:
            first_run_ended.wait(timeout=60)
            while not stop.is_set():
                single.append(run_projection_gc(engine, LIMITS).outcome)
                check("emdash")
        except Exception as error:
            problems.append(f"emdash: {type(error).__name__}: {error}")

    collectors = [threading.Thread(target=looping_runs), threading.Thread(target=emdash_ticks)]
    editors = [
        threading.Thread(target=random_edits, args=(engine, ids, seed, EDITS_PER_EDITOR, problems))
        for seed in range(EDITORS)
    ]
    for thread in [*collectors, *editors]:
        thread.start()
    for thread in editors:
        thread.join(timeout=120)
    stop.set()
    for thread in collectors:
        thread.join(timeout=60)

    assert problems == []
    assert all(run.ended is not GcRunEnd.FAILED for run in runs)
    assert GcOutcome.FAILED not in single
    assert runs[0].completed_passes > 1  # passes back to back happened
    assert single.count(GcOutcome.COMPLETED) > 0  # and EmDash's passes took turns between them
    assert sum(run.deleted_rows for run in runs) > 0
    for key, generation in held:  # the leased generations kept every row
        assert count(engine, schema.occurrences, source_key=key, generation=generation) == 1

    drain(engine)
    gc_until_quiet(engine, LIMITS, max_passes=200)
    assert non_current_occurrences(engine) == HELD  # only the leased generations remain
    assert sources_missing_their_generation(engine) == 0
    assert not verify_index(engine).has_drift
