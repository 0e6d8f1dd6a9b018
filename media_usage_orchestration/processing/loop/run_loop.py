"""The budgeted loops of the long-running steps, Dagster-free: one `Budget`, one leased page
loop and the work drain. Ops make one call here and turn the result into their report; the
reconciliation driver runs the same loops (`reconciliation/walks.py`).

- `page_until_done` runs a leased step page after page until a page says it is done,
  renewing the lease between pages; once the budget is spent it hands the row back due at
  once, so the next run continues from the row's checkpoints.
- `drain_due_work` claims and processes due work in batches until nothing is due, capture
  is inactive or the budget (items claimed, seconds) is spent.
- `drain_while_work_arrives` drains one collection again and again while more of its work
  arrives within a `Linger` (a work run that stays for the next edit, instead of a new run
  per edit).

Both take an optional `progress` callable, told each page's or batch's result as it lands, so
a caller can report how far a long step has come (the ops log it, throttled).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

from media_usage_orchestration.processing.work.processor import (
    WorkBatchResult,
    WorkCounts,
    process_due_batch,
)
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.reads.probes import CollectionWork, collection_work_state

L = TypeVar("L")
R = TypeVar("R")


class Budget:
    """At most `max_steps` steps and/or `max_seconds` on the monotonic clock, whichever runs out
    first (None: unbounded). The first `guaranteed_steps` are granted whatever the clock says,
    so a step that must make progress runs at least that often."""

    def __init__(
        self,
        max_steps: int | None = None,
        max_seconds: float | None = None,
        *,
        guaranteed_steps: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_steps = max_steps
        self.guaranteed_steps = guaranteed_steps
        self.clock = clock
        self.started = clock()
        self.deadline = None if max_seconds is None else self.started + max_seconds
        self.used = 0

    def elapsed_seconds(self) -> float:
        return self.clock() - self.started

    def elapsed_ms(self) -> int:
        return int(max(0.0, self.elapsed_seconds()) * 1000)

    @property
    def remaining_steps(self) -> int | None:
        return None if self.max_steps is None else max(0, self.max_steps - self.used)

    def exhausted(self) -> bool:
        if self.used < self.guaranteed_steps:
            return False
        if self.max_steps is not None and self.used >= self.max_steps:
            return True
        return self.deadline is not None and self.clock() >= self.deadline

    def charge(self, steps: int) -> None:
        """Count `steps` already taken (for a budget of items rather than calls)."""
        self.used += steps

    def spend(self) -> bool:
        """Take one step if the budget allows it."""
        if self.exhausted():
            return False
        self.used += 1
        return True


# --- a leased page loop -----------------------------------------------------------------------


@dataclass(frozen=True)
class Page(Generic[L, R]):
    """One page: the step's own `result`, the lease to go on with, and whether to page again."""

    result: R
    lease: L
    more: bool


class PagingEnd(StrEnum):
    DONE = "done"  # a page said it was the last: its result says how the walk ended
    CLAIM_LOST = "claim_lost"  # renewing the lease between pages was refused
    BUDGET_SPENT = "budget_spent"  # the row was handed back due at once


@dataclass(frozen=True)
class Paging(Generic[L, R]):
    end: PagingEnd
    lease: L
    results: tuple[R, ...]
    released: bool = False  # for BUDGET_SPENT: whether the hand-back landed

    @property
    def last(self) -> R | None:
        return self.results[-1] if self.results else None

    def count(self, result: R) -> int:
        return sum(1 for each in self.results if each == result)


def page_until_done(
    lease: L,
    page: Callable[[L], Page[L, R]],
    *,
    budget: Budget,
    renew: Callable[[L], L | None],
    release_now: Callable[[L], bool],
    progress: Callable[[R], None] | None = None,
) -> Paging[L, R]:
    """Run `page` while the budget allows, renewing the lease between pages (never after the
    last one: the next step renews it when it starts); `progress` is told each page's result."""
    results: list[R] = []
    while budget.spend():
        if results:
            renewed = renew(lease)
            if renewed is None:
                return Paging(PagingEnd.CLAIM_LOST, lease, tuple(results))
            lease = renewed
        paged = page(lease)
        results.append(paged.result)
        if progress is not None:
            progress(paged.result)
        lease = paged.lease
        if not paged.more:
            return Paging(PagingEnd.DONE, lease, tuple(results))
    return Paging(PagingEnd.BUDGET_SPENT, lease, tuple(results), released=release_now(lease))


# --- the work drain ---------------------------------------------------------------------------


class WorkDrainEnd(StrEnum):
    NOTHING_DUE = "nothing_due"
    BUDGET = "budget"
    INACTIVE = "inactive"
    # while it waited for more: capture went inactive or the collection is being deleted
    CLOSED = "collection_closed"


_ENDED_BECAUSE = {
    WorkDrainEnd.NOTHING_DUE: "nothing more is due",
    WorkDrainEnd.BUDGET: "its budget was spent",
    WorkDrainEnd.INACTIVE: "capture is not active",
    WorkDrainEnd.CLOSED: "its collection is being deleted or capture is not active",
}


class WorkRunOutcome(StrEnum):
    """A work run's final word, the strongest thing it did: items failed for good, items
    projected, items to retry, items that turned out superseded or obsolete; or, having
    claimed nothing, why it stopped."""

    FAILED_WORK = "failed_work"
    PROJECTED = "projected"
    RETRYING = "retrying"
    SUPERSEDED = "superseded"
    NOTHING_DUE = "nothing_due"
    BUDGET = "budget"
    INACTIVE = "inactive"
    CLOSED = "collection_closed"


@dataclass(frozen=True)
class WorkDrain:
    stopped_by: WorkDrainEnd
    counts: WorkCounts  # summed over the batches
    # (collection id, slug) -> items of that collection completed
    completed_by_collection: Mapping[tuple[str, str], int]
    # (collection id, slug) -> items of that collection failed for good
    failed_by_collection: Mapping[tuple[str, str], int]

    def ended(self, stopped_by: WorkDrainEnd) -> WorkDrain:
        """The same drain, stopped by `stopped_by` instead."""
        return WorkDrain(
            stopped_by, self.counts, self.completed_by_collection, self.failed_by_collection
        )

    def __add__(self, later: WorkDrain) -> WorkDrain:
        """This drain followed by `later` (one run's bursts): summed, stopped as `later`."""
        return WorkDrain(
            later.stopped_by,
            self.counts + later.counts,
            Counter(self.completed_by_collection) + Counter(later.completed_by_collection),
            Counter(self.failed_by_collection) + Counter(later.failed_by_collection),
        )

    @property
    def changed_collections(self) -> list[tuple[str, str]]:
        """Collections with work completed or failed for good, by id."""
        return sorted({*self.completed_by_collection, *self.failed_by_collection})

    @property
    def outcome(self) -> WorkRunOutcome:
        counts = self.counts
        if counts.claimed == 0:
            return WorkRunOutcome(self.stopped_by.value)
        if counts.failed:
            return WorkRunOutcome.FAILED_WORK
        if counts.completed:
            return WorkRunOutcome.PROJECTED
        if counts.retry:
            return WorkRunOutcome.RETRYING
        return WorkRunOutcome.SUPERSEDED

    def summary(self, collection: str | None = None) -> str:
        """One sentence for the run log."""
        c = self.counts
        of = f" of {collection}" if collection else ""
        return (
            f"Claimed {c.claimed} item(s){of}: {c.completed} projected, {c.retry} to retry, "
            f"{c.failed} failed for good, {c.superseded + c.obsolete} superseded or obsolete, "
            f"{c.claim_lost} lost to another owner; stopped because "
            f"{_ENDED_BECAUSE[self.stopped_by]}."
        )


def drain_due_work(
    engine: Engine,
    budget: Budget,
    batch_size: int,
    progress: Callable[[WorkBatchResult], None] | None = None,
    collection_id: str | None = None,
) -> WorkDrain:
    """Batches of due work (of one collection, if given), each at most `batch_size` and what is
    left of the budget's steps (items claimed), until nothing is due, capture is inactive or the
    budget is spent; `progress` is told each batch's result."""
    counts = WorkCounts()
    completed: Counter[tuple[str, str]] = Counter()
    failed: Counter[tuple[str, str]] = Counter()
    while not budget.exhausted():
        remaining = budget.remaining_steps
        batch = process_due_batch(
            engine,
            batch_size if remaining is None else min(batch_size, remaining),
            collection_id=collection_id,
        )
        if batch.inactive:
            return WorkDrain(WorkDrainEnd.INACTIVE, counts, completed, failed)
        counts += batch.counts
        completed.update(batch.completed_by_collection)
        failed.update(batch.failed_by_collection)
        if progress is not None:
            progress(batch)
        budget.charge(batch.counts.claimed)
        if batch.counts.claimed == 0:
            return WorkDrain(WorkDrainEnd.NOTHING_DUE, counts, completed, failed)
    return WorkDrain(WorkDrainEnd.BUDGET, counts, completed, failed)


@dataclass(frozen=True)
class Linger:
    """How long a drained work run waits for more of its collection's work: it asks every
    `poll_seconds` and gives up after `seconds` without any (or when its budget is spent)."""

    seconds: float
    poll_seconds: float = 0.5
    sleep: Callable[[float], None] = time.sleep

    def wait_for_work(self, budget: Budget, has_due_work: Callable[[], bool]) -> bool:
        """True as soon as `has_due_work()` says so; False once the linger or budget ran out."""
        quiet_since = budget.clock()
        while not budget.exhausted():
            waited = budget.clock() - quiet_since
            if waited >= self.seconds:
                return False
            self.sleep(min(self.poll_seconds, self.seconds - waited))
            if has_due_work():
                return True
        return False


def drain_while_work_arrives(
    engine: Engine,
    budget: Budget,
    batch_size: int,
    collection_id: str,
    linger: Linger,
    on_burst: Callable[[WorkDrain], None],
    progress: Callable[[WorkBatchResult], None] | None = None,
) -> WorkDrain:
    """`drain_due_work` of one collection, then again each time more of its work becomes due
    within the linger, within one budget. `on_burst` is told each drain that ended with
    nothing due (what it did, so the caller can record coverage before waiting); the result
    sums them. The wait ends at once (`CLOSED`) when the collection can have no more work:
    capture went inactive or a deletion tombstone appeared, so a deletion never waits for a
    lingering run."""
    total: WorkDrain | None = None
    while True:
        burst = drain_due_work(engine, budget, batch_size, progress, collection_id)
        on_burst(burst)
        total = burst if total is None else total + burst
        if burst.stopped_by is not WorkDrainEnd.NOTHING_DUE:
            return total
        waited = _wait_for_more(engine, collection_id, linger, budget)
        if waited is CollectionWork.CLOSED:
            return total.ended(WorkDrainEnd.CLOSED)
        if waited is not CollectionWork.DUE:
            return total


def _wait_for_more(
    engine: Engine, collection_id: str, linger: Linger, budget: Budget
) -> CollectionWork:
    """Wait within the linger for the collection's next work: DUE when it came, CLOSED when the
    collection can have none (checked once before waiting too), IDLE when the linger ran out."""
    found = [collection_work_state(engine, collection_id)]
    if found[-1] is CollectionWork.CLOSED:
        return CollectionWork.CLOSED

    def due_or_closed() -> bool:
        found.append(collection_work_state(engine, collection_id))
        return found[-1] is not CollectionWork.IDLE

    if not linger.wait_for_work(budget, due_or_closed):
        return CollectionWork.IDLE
    return found[-1] if found[-1] is not CollectionWork.IDLE else CollectionWork.DUE


__all__ = [
    "Budget",
    "Linger",
    "Page",
    "Paging",
    "PagingEnd",
    "WorkDrain",
    "WorkDrainEnd",
    "WorkRunOutcome",
    "drain_due_work",
    "drain_while_work_arrives",
    "page_until_done",
]
