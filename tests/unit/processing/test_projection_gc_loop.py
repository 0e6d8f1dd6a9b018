"""The looping GC's arithmetic, without a database: which pass is full, why a run stops, and
the run's totals (sums of the passes, the backlog bound and window of the last)."""

from __future__ import annotations

from media_usage_orchestration.processing.projection_gc.passes import (
    GcLimits,
    GcOutcome,
    GcResult,
    GcRun,
    GcRunEnd,
    is_full,
)
from media_usage_orchestration.store.projection_gc.repository import GcCounters

LIMITS = GcLimits(delete_limit=5)


def _pass(stale: int, *, candidates: int = 10, more: bool = False, bound: int = 0) -> GcResult:
    counters = GcCounters(
        candidate_count=candidates,
        deleted_stale=stale,
        deleted_write_leases=1,
        backlog_lower_bound=bound,
        scan_has_more=more,
        duration_ms=7,
    )
    return GcResult(GcOutcome.COMPLETED, counters, full=is_full(counters, LIMITS))


def test_a_pass_is_full_at_its_delete_limit_or_with_a_full_window():
    assert is_full(GcCounters(deleted_orphans=2, deleted_stale=2, deleted_abandoned=1), LIMITS)
    assert is_full(GcCounters(scan_has_more=True), LIMITS)
    assert not is_full(GcCounters(deleted_stale=4, deleted_write_leases=49), LIMITS)


def test_a_run_sums_its_passes_and_keeps_the_last_passes_backlog():
    run = GcRun(
        (_pass(5, bound=5), _pass(5, more=True, bound=5), _pass(3, bound=3)), GcRunEnd.NOT_FULL, 900
    )

    totals = run.counters
    assert (run.outcome, run.completed_passes, run.deleted_rows) == (GcOutcome.COMPLETED, 3, 13)
    assert (totals.deleted_stale, totals.deleted_write_leases, totals.candidate_count) == (
        13,
        3,
        30,
    )
    assert (totals.backlog_lower_bound, totals.scan_has_more, totals.duration_ms) == (3, False, 900)


def test_a_run_is_failed_if_a_pass_failed_and_skipped_if_none_completed():
    failed = GcRun((_pass(5), GcResult(GcOutcome.FAILED)), GcRunEnd.FAILED, 10)
    skipped = GcRun((GcResult(GcOutcome.SKIPPED),), GcRunEnd.SKIPPED, 1)

    assert (failed.outcome, failed.completed_passes, failed.deleted_rows) == ("failed", 1, 5)
    assert (skipped.outcome, skipped.completed_passes, skipped.counters) == (
        "skipped",
        0,
        GcCounters(duration_ms=1),
    )


def test_a_run_that_lost_the_row_to_another_pass_keeps_its_last_completed_passes_backlog():
    run = GcRun((_pass(5, more=True, bound=5), GcResult(GcOutcome.SKIPPED)), GcRunEnd.SKIPPED, 3)

    assert (run.outcome, run.completed_passes, run.deleted_rows) == ("completed", 1, 5)
    assert (run.counters.backlog_lower_bound, run.counters.scan_has_more) == (5, True)
