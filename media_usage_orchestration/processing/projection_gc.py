"""One projection-GC pass (EmDash's `cleanupMediaUsage`), Dagster-free.

A pass claims the task row, deletes a bounded batch of expired generation-write leases, scans
the next window of occurrences below the sweep's cutoff, picks at most `delete_limit` of them
to reap (orphans, then stale, then abandoned generations; any row under a live write lease is
skipped) and records its counters on the row. The sweep cursor only advances past candidates
whose kind was fully deleted, so rows a lost race left behind are looked at again. A pass stops
issuing statements once its time budget is spent; correctness never depends on the budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from ulid import ULID

from media_usage_orchestration.processing.run_loop import Budget
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.sources.projection_gc import (
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

    @property
    def deleted_rows(self) -> int:
        c = self.counters
        return c.deleted_orphans + c.deleted_stale + c.deleted_abandoned


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
    MEDIA_USAGE_CLEANUP_FAILED and a backoff)."""
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
        recorded = repo.complete(claim.lease_token, counters, next_cursor, swept)
    except Exception:
        logger.exception("media usage projection GC pass failed")
        counters = work.counters()
        _record_failure(repo, claim, limits, counters.duration_ms)
        return GcResult(GcOutcome.FAILED, counters)
    return GcResult(GcOutcome.COMPLETED if recorded else GcOutcome.SKIPPED, counters)


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
