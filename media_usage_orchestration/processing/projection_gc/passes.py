"""Projection-GC passes (EmDash's `cleanupMediaUsage`), Dagster-free.

A pass claims the task row, deletes a bounded batch of expired generation-write leases, scans
the next window of occurrences below the sweep's cutoff, picks at most `delete_limit` of them
to reap (orphans, then stale, then abandoned generations; any row under a live write lease is
skipped) and records its counters on the row. The sweep cursor only advances past candidates
whose kind was fully deleted, so rows a lost race left behind are looked at again. A pass stops
issuing statements once its time budget is spent; correctness never depends on the budget.

A pass is *full* when it deleted `delete_limit` rows or its window was full (`scan_has_more`):
there is probably more right behind it, so it leaves the task row due at once instead of
EmDash's interval. `run_projection_gc_passes` runs passes back to back while they are full,
within a time budget; each pass is still one claim of the row under its own lease, so EmDash's
own cleanup (or another run) sharing the row takes its turn between any two of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from ulid import ULID

from media_usage_orchestration.processing.loop.run_loop import Budget
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.projection_gc.repository import (
    DELETE_BATCH_SIZE,
    GcCandidate,
    GcClaim,
    GcCounters,
    GcCursor,
    GcTarget,
    ProjectionGcRepository,
)

logger = logging.getLogger(__name__)

CLEANUP_FAILED = "MEDIA_USAGE_CLEANUP_FAILED"
MAX_RECORDED_FAILURES = 5
MAX_BACKOFF_INTERVALS = 15


@dataclass(frozen=True)
class GcLimits:
    """EmDash's `MEDIA_USAGE_CLEANUP_*` constants."""

    candidate_limit: int = 250
    delete_limit: int = 50
    write_lease_delete_limit: int = 49
    interval_seconds: int = 60
    lease_seconds: int = 300
    safety_window_seconds: int = 3600
    time_budget_seconds: float = 5.0


class GcOutcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class GcResult:
    outcome: GcOutcome
    counters: GcCounters = field(default_factory=GcCounters)
    # the pass hit its delete limit or a full window: the task row was left due at once
    full: bool = False

    @property
    def deleted_rows(self) -> int:
        return deleted_occurrences(self.counters)


def deleted_occurrences(counters: GcCounters) -> int:
    return counters.deleted_orphans + counters.deleted_stale + counters.deleted_abandoned


def is_full(counters: GcCounters, limits: GcLimits) -> bool:
    """More garbage is probably right behind this pass: it deleted as much as a pass may, or
    its window of candidates was full."""
    return deleted_occurrences(counters) >= limits.delete_limit or counters.scan_has_more


@dataclass
class _Selection:
    ids: dict[GcTarget, list[str]]
    # every examined candidate in scan order, with the kind chosen for it (None: kept)
    entries: list[tuple[GcCandidate, GcTarget | None]]

    @property
    def selected(self) -> int:
        return sum(len(ids) for ids in self.ids.values())


def classify(candidate: GcCandidate) -> GcTarget | None:
    if candidate.current_generation is None:
        return GcTarget.ORPHAN
    if candidate.current_generation == candidate.generation or candidate.indexed_at is None:
        return None
    if candidate.created_at < candidate.indexed_at:
        return GcTarget.STALE
    return GcTarget.ABANDONED


def select_targets(candidates: list[GcCandidate], claimed_at: str, delete_limit: int) -> _Selection:
    """Pick up to `delete_limit` rows to reap in scan order; rows under a write lease that is
    live at the claim time are kept (and do not count against the limit)."""
    selection = _Selection({target: [] for target in GcTarget}, [])
    for candidate in candidates:
        leased = (
            candidate.write_lease_expires_at is not None
            and candidate.write_lease_expires_at > claimed_at
        )
        target = None if leased else classify(candidate)
        if target is not None and selection.selected >= delete_limit:
            break
        if target is not None:
            selection.ids[target].append(candidate.id)
        selection.entries.append((candidate, target))
    return selection


def cursor_after_completed(
    selection: _Selection, completed: set[GcTarget], prior: GcCursor | None
) -> GcCursor | None:
    """The last candidate before the first one whose kind was not fully reaped."""
    cursor = prior
    for candidate, target in selection.entries:
        if target is not None and target not in completed:
            break
        cursor = GcCursor(candidate.created_at, candidate.id)
    return cursor


@dataclass
class _Pass:
    repo: ProjectionGcRepository
    claim: GcClaim
    limits: GcLimits
    budget: Budget
    counts: dict[str, int] = field(default_factory=dict)
    candidate_count: int = 0
    backlog_lower_bound: int = 0
    scan_has_more: bool = False

    @property
    def token(self) -> str:
        return self.claim.lease_token

    def delete_expired_write_leases(self) -> None:
        if self.budget.exhausted():
            return
        expired = self.repo.find_expired_write_leases(
            self.token, self.limits.write_lease_delete_limit
        )
        if expired and not self.budget.exhausted():
            self.counts["write_leases"] = self.repo.delete_expired_write_leases(self.token, expired)

    def reap(self, target: GcTarget, ids: list[str]) -> int:
        """Mark then delete `ids` in bound-sized batches while the budget allows."""
        cutoff = self.claim.scan_before_at
        deleted = 0
        for batch in [
            ids[i : i + DELETE_BATCH_SIZE] for i in range(0, len(ids), DELETE_BATCH_SIZE)
        ]:
            if self.budget.exhausted():
                break
            self.repo.mark_targets(target, batch, cutoff, self.token)
            if self.budget.exhausted():
                break
            deleted += self.repo.delete_marked_targets(target, batch, cutoff, self.token)
        self.counts[target.value] = deleted
        return deleted

    def sweep(self) -> tuple[GcCursor | None, bool]:
        """Scan one window and reap it; return the next cursor and whether the sweep ended."""
        if self.budget.exhausted():
            return self.claim.cursor, False
        candidates = self.repo.find_candidates(
            self.token, self.claim.scan_before_at, self.claim.cursor, self.limits.candidate_limit
        )
        self.candidate_count = len(candidates)
        self.scan_has_more = len(candidates) == self.limits.candidate_limit
        selection = select_targets(candidates, self.claim.claimed_at, self.limits.delete_limit)
        self.backlog_lower_bound = selection.selected
        completed: set[GcTarget] = set()
        for target in GcTarget:  # orphans, stale, abandoned: a shortfall stops the rest
            ids = selection.ids[target]
            if not ids:
                continue
            if self.budget.exhausted():
                break
            if self.reap(target, ids) != len(ids):
                break
            completed.add(target)
        incomplete = any(t is not None and t not in completed for _, t in selection.entries)
        swept = not self.scan_has_more and len(selection.entries) == len(candidates)
        swept = swept and not incomplete
        if swept:
            return None, True
        return cursor_after_completed(selection, completed, self.claim.cursor), False

    def counters(self) -> GcCounters:
        return GcCounters(
            candidate_count=self.candidate_count,
            deleted_orphans=self.counts.get(GcTarget.ORPHAN.value, 0),
            deleted_stale=self.counts.get(GcTarget.STALE.value, 0),
            deleted_abandoned=self.counts.get(GcTarget.ABANDONED.value, 0),
            deleted_write_leases=self.counts.get("write_leases", 0),
            backlog_lower_bound=self.backlog_lower_bound,
            scan_has_more=self.scan_has_more,
            duration_ms=self.budget.elapsed_ms(),
        )


def failure_delay_seconds(consecutive_failures: int, interval_seconds: int) -> int:
    """1, 2, 4, 8, then 15 intervals."""
    return min(2 ** (consecutive_failures - 1), MAX_BACKOFF_INTERVALS) * interval_seconds


def run_projection_gc(
    engine: Engine,
    limits: GcLimits | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> GcResult:
    """One pass. `skipped`: the task was not due, leased by another pass, or the lease was
    lost before the counters could be recorded; `failed`: a statement raised (recorded with
    MEDIA_USAGE_CLEANUP_FAILED and a backoff). A full pass leaves the row due at once; any
    other is due again `interval_seconds` after its claim, as EmDash's are."""
    limits = limits or GcLimits()
    budget = Budget(max_seconds=limits.time_budget_seconds, clock=clock)
    repo = ProjectionGcRepository(engine)
    claim = repo.claim(
        str(ULID()),
        lease_seconds=limits.lease_seconds,
        interval_seconds=limits.interval_seconds,
        safety_window_seconds=limits.safety_window_seconds,
    )
    if claim is None:
        return GcResult(GcOutcome.SKIPPED, GcCounters(duration_ms=budget.elapsed_ms()))
    work = _Pass(repo, claim, limits, budget)
    try:
        work.delete_expired_write_leases()
        next_cursor, swept = work.sweep()
        counters = work.counters()
        full = is_full(counters, limits)
        recorded = repo.complete(claim.lease_token, counters, next_cursor, swept, due_now=full)
    except Exception:
        logger.exception("media usage projection GC pass failed")
        counters = work.counters()
        _record_failure(repo, claim, limits, counters.duration_ms)
        return GcResult(GcOutcome.FAILED, counters)
    if not recorded:
        return GcResult(GcOutcome.SKIPPED, counters)
    return GcResult(GcOutcome.COMPLETED, counters, full=full)


def _record_failure(
    repo: ProjectionGcRepository, claim: GcClaim, limits: GcLimits, duration_ms: int
) -> None:
    failures = min(claim.consecutive_failures + 1, MAX_RECORDED_FAILURES)
    try:
        repo.fail(
            claim.lease_token,
            retry_delay_seconds=failure_delay_seconds(failures, limits.interval_seconds),
            consecutive_failures=failures,
            duration_ms=duration_ms,
            error_code=CLEANUP_FAILED,
        )
    except Exception:  # the lease lapses by itself; the next pass takes over
        logger.exception("could not record the projection GC failure")


# --- passes back to back ------------------------------------------------------------------------

DEFAULT_RUN_SECONDS = 60.0


class GcRunEnd(StrEnum):
    NOT_FULL = "not_full"  # the last pass was not full: caught up with the backlog
    TIME_BUDGET = "time_budget"  # the run's budget was spent after a full pass (the row is due)
    SKIPPED = "skipped"  # the row was not due, held by another pass, or the lease was lost
    FAILED = "failed"


@dataclass(frozen=True)
class GcRun:
    """The passes of one run, in order, and why it stopped."""

    passes: tuple[GcResult, ...]
    ended: GcRunEnd
    duration_ms: int

    @property
    def outcome(self) -> GcOutcome:
        if self.ended is GcRunEnd.FAILED:
            return GcOutcome.FAILED
        if self.completed_passes:
            return GcOutcome.COMPLETED
        return GcOutcome.SKIPPED

    @property
    def completed_passes(self) -> int:
        return sum(1 for each in self.passes if each.outcome is GcOutcome.COMPLETED)

    @property
    def counters(self) -> GcCounters:
        """The passes' counts summed; the backlog bound and `scan_has_more` of the last pass
        that completed (what is left); the run's duration."""
        completed = [each for each in self.passes if each.outcome is GcOutcome.COMPLETED]
        last = completed[-1].counters if completed else GcCounters()
        return GcCounters(
            candidate_count=sum(each.counters.candidate_count for each in self.passes),
            deleted_orphans=sum(each.counters.deleted_orphans for each in self.passes),
            deleted_stale=sum(each.counters.deleted_stale for each in self.passes),
            deleted_abandoned=sum(each.counters.deleted_abandoned for each in self.passes),
            deleted_write_leases=sum(each.counters.deleted_write_leases for each in self.passes),
            backlog_lower_bound=last.backlog_lower_bound,
            scan_has_more=last.scan_has_more,
            duration_ms=self.duration_ms,
        )

    @property
    def deleted_rows(self) -> int:
        return sum(each.deleted_rows for each in self.passes)


def _ended_by(result: GcResult) -> GcRunEnd | None:
    """Why a run stops after this pass (None: it goes on)."""
    if result.outcome is GcOutcome.FAILED:
        return GcRunEnd.FAILED
    if result.outcome is GcOutcome.SKIPPED:
        return GcRunEnd.SKIPPED
    return None if result.full else GcRunEnd.NOT_FULL


def run_projection_gc_passes(
    engine: Engine,
    limits: GcLimits | None = None,
    *,
    max_seconds: float = DEFAULT_RUN_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    progress: Callable[[GcResult], None] | None = None,
) -> GcRun:
    """Passes back to back (`run_projection_gc`, each its own claim) while each is full, until
    one is not, one is skipped or fails, or `max_seconds` are spent; `progress` is told each
    pass's result. The first pass always runs; a pass under way is never cut short by the
    run's budget (its own `time_budget_seconds` bounds it)."""
    budget = Budget(max_seconds=max_seconds, clock=clock)
    passes: list[GcResult] = []
    while True:
        result = run_projection_gc(engine, limits, clock=clock)
        passes.append(result)
        if progress is not None:
            progress(result)
        ended = _ended_by(result)
        if ended is None and budget.exhausted():
            ended = GcRunEnd.TIME_BUDGET
        if ended is not None:
            return GcRun(tuple(passes), ended, budget.elapsed_ms())
