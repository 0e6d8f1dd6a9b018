"""Projection-GC passes back to back, on both dialects: a full pass (its delete limit reached,
or a full window) leaves the task row due at once, any other EmDash's interval after its claim;
a run goes on while its passes are full and stops at the first that is not, at a skipped or
failed pass, or at its time budget; under sustained edits the obsolete rows stay bounded.
Time passes by backdating rows, never by sleeping."""

from __future__ import annotations

from media_usage_orchestration.emdash_double.aging import age_replaced_generations
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.projection_gc.passes import (
    GcLimits,
    GcOutcome,
    GcRunEnd,
    run_projection_gc,
    run_projection_gc_passes,
)
from media_usage_orchestration.store.core import schema
from tests.support.projection import image
from tests.support.projection_gc import (
    HOUR,
    drain,
    edit_storm,
    make_gc_due,
    non_current_occurrences,
    one_task,
    orphans,
)
from tests.support.states import backdate, count, db_now

SMALL = GcLimits(candidate_limit=10, delete_limit=5)


def _due_now(engine) -> bool:
    return one_task(engine)["next_eligible_at"] <= db_now(engine)


def test_a_full_pass_leaves_the_row_due_at_once_and_a_partial_one_waits_the_interval(activated):
    engine = activated.engine
    orphans(engine, 7)
    make_gc_due(engine)

    full = run_projection_gc(engine, SMALL)
    assert (full.outcome, full.deleted_rows, full.full) == (GcOutcome.COMPLETED, 5, True)
    assert _due_now(engine)

    partial = run_projection_gc(engine, SMALL)  # no time travel: due at once
    assert (partial.outcome, partial.deleted_rows, partial.full) == (GcOutcome.COMPLETED, 2, False)
    task = one_task(engine)
    assert db_now(engine, 30) < task["next_eligible_at"] <= db_now(engine, 60)
    assert run_projection_gc(engine, SMALL).outcome is GcOutcome.SKIPPED
    assert count(engine, schema.occurrences) == 0


def test_a_full_window_of_rows_to_keep_is_full_too(activated):
    engine = activated.engine
    edit_storm(engine, "posts", entries=12, rounds=0)  # twelve current heroes, nothing to reap
    backdate(engine, schema.occurrences, "created_at", 2 * HOUR)
    make_gc_due(engine)

    result = run_projection_gc(engine, SMALL)

    assert (result.deleted_rows, result.counters.scan_has_more, result.full) == (0, True, True)
    assert _due_now(engine) and one_task(engine)["cursor_id"] is not None
    assert count(engine, schema.occurrences) == 12


def test_passes_run_back_to_back_until_one_is_not_full(activated):
    engine = activated.engine
    orphans(engine, 12)
    make_gc_due(engine)
    heard = []

    run = run_projection_gc_passes(engine, SMALL, progress=heard.append)

    assert [result.deleted_rows for result in run.passes] == [5, 5, 2]
    assert list(run.passes) == heard
    assert (run.ended, run.outcome, run.completed_passes) == (GcRunEnd.NOT_FULL, "completed", 3)
    totals = run.counters
    assert (totals.deleted_orphans, run.deleted_rows) == (12, 12)
    assert totals.candidate_count == sum(r.counters.candidate_count for r in run.passes)
    assert (totals.backlog_lower_bound, totals.scan_has_more) == (2, False)  # the last pass's
    assert not _due_now(engine)  # the last pass was not full: EmDash's interval
    assert count(engine, schema.occurrences) == 0


def test_a_run_stops_at_its_time_budget_with_the_row_due(activated):
    engine = activated.engine
    orphans(engine, 12)
    make_gc_due(engine)
    seconds = iter(range(1000))  # every reading of the clock a second later
    patient = GcLimits(candidate_limit=10, delete_limit=5, time_budget_seconds=1000)

    run = run_projection_gc_passes(
        engine, patient, max_seconds=1.5, clock=lambda: float(next(seconds))
    )

    assert (run.ended, run.completed_passes, run.deleted_rows) == (GcRunEnd.TIME_BUDGET, 1, 5)
    assert _due_now(engine)  # the next run takes over at once
    assert count(engine, schema.occurrences) == 7


def test_a_run_whose_row_is_not_due_is_skipped_and_changes_nothing(activated):
    engine = activated.engine
    orphans(engine, 3)
    backdate(engine, schema.cleanup, "next_eligible_at", -60)
    before = one_task(engine)

    run = run_projection_gc_passes(engine, SMALL)

    assert (run.ended, run.outcome, run.completed_passes) == (GcRunEnd.SKIPPED, "skipped", 0)
    assert one_task(engine) == before
    assert count(engine, schema.occurrences) == 3


def test_a_failed_pass_ends_the_run_after_the_passes_before_it(activated, monkeypatch):
    from media_usage_orchestration.store.projection_gc.repository import ProjectionGcRepository

    engine = activated.engine
    orphans(engine, 12)
    make_gc_due(engine)
    original, calls = ProjectionGcRepository.find_candidates, []

    def second_call_fails(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ProjectionGcRepository, "find_candidates", second_call_fails)
    run = run_projection_gc_passes(engine, SMALL)

    assert [r.outcome for r in run.passes] == [GcOutcome.COMPLETED, GcOutcome.FAILED]
    assert (run.ended, run.outcome, run.deleted_rows) == (GcRunEnd.FAILED, "failed", 5)
    task = one_task(engine)
    assert task["consecutive_failures"] == 1 and not _due_now(engine)  # backing off


def _edit_round(engine, ids: list[str], round_: int, edits_per_entry: int) -> None:
    writer = CmsWriter(engine)
    for edit in range(edits_per_entry):
        for id_ in ids:
            writer.update_entry("posts", id_, {"hero": image(f"{id_}-{round_}-{edit}")})
        drain(engine)


def test_obsolete_rows_stay_bounded_under_sustained_edits(activated):
    """Each round (a minute of EmDash's cadence) edits every entry twice, leaving 12 obsolete
    rows, then the GC runs once: one pass a round (EmDash) falls behind by 7 rows a round; a
    run of passes back to back reaps each round's rows."""
    engine = activated.engine
    ids = edit_storm(engine, "posts", entries=6, rounds=0)
    single_pass, looping = [], []
    for round_ in range(4):
        _edit_round(engine, ids, round_, edits_per_entry=2)
        age_replaced_generations(engine)
        make_gc_due(engine)
        assert run_projection_gc(engine, SMALL).outcome is GcOutcome.COMPLETED
        single_pass.append(non_current_occurrences(engine))
    assert single_pass == [7, 14, 21, 28]  # growing without bound

    for round_ in range(4, 8):
        _edit_round(engine, ids, round_, edits_per_entry=2)
        age_replaced_generations(engine)
        make_gc_due(engine)
        run = run_projection_gc_passes(engine, SMALL)
        assert run.ended is GcRunEnd.NOT_FULL
        looping.append(non_current_occurrences(engine))
    assert looping == [0, 0, 0, 0]  # the first run also reaped the 28 left behind
    assert not verify_index(engine).has_drift
