"""The reconciliation's paging loops, shared by its ops and `run_to_completion`: walk the scan,
drain the collection's work, walk the canonical sources, each under a `Budget`, renewing the
lease between pages and handing the row back due at once when the budget is spent.

A walk's results are the steps' own outcomes, page by page. A scan whose epoch or fields moved
is restarted in place and walked again (`restart_required`, then the fresh scan's pages). A
source walk that needs a restart restarts the run and ends there (`restart_required` last,
with the fresh scan's claim): the scan must be walked again before the sources.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from media_usage_orchestration.processing.loop.phases import phase
from media_usage_orchestration.processing.loop.run_loop import (
    Budget,
    Page,
    Paging,
    PagingEnd,
    page_until_done,
)
from media_usage_orchestration.processing.reconciliation import steps
from media_usage_orchestration.processing.reconciliation.model import (
    CONTINUE_DELAY_SECONDS,
    LEASE_DURATION_SECONDS,
    ReconciliationOutcome,
    ScanOutcome,
)
from media_usage_orchestration.processing.work.processor import WorkBatchResult, process_due_batch
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.reconciliation.records import (
    ReconciliationClaim,
    WorkBarrierState,
)
from media_usage_orchestration.store.work.repository import WorkRepository

PageOutcome = ScanOutcome | ReconciliationOutcome
# How often a drain whose remaining items are leased by other claimers looks again.
OTHER_CLAIMERS_POLL_SECONDS = 0.05


def scan_pages(
    engine: Engine,
    claim: ReconciliationClaim,
    budget: Budget,
    lease_seconds: int = LEASE_DURATION_SECONDS,
    progress: Callable[[PageOutcome], None] | None = None,
) -> Paging[ReconciliationClaim, PageOutcome]:
    """Scan pages until the scan is exhausted (`exhausted` last) or a page stops the run."""
    with phase("scan"):
        return _page_walk(
            engine, claim, steps.scan_page, budget, lease_seconds, progress, rescan=True
        )


def source_pages(
    engine: Engine,
    claim: ReconciliationClaim,
    budget: Budget,
    lease_seconds: int = LEASE_DURATION_SECONDS,
    progress: Callable[[PageOutcome], None] | None = None,
) -> Paging[ReconciliationClaim, PageOutcome]:
    """Source pages until the walk is exhausted (`exhausted` last), the run restarted
    (`restart_required` last) or a page stops the run."""
    with phase("sources"):
        return _page_walk(
            engine, claim, steps.source_page, budget, lease_seconds, progress, rescan=False
        )


def _page_walk(
    engine: Engine,
    claim: ReconciliationClaim,
    step: Callable[..., steps.PageStep],
    budget: Budget,
    lease_seconds: int,
    progress: Callable[[PageOutcome], None] | None,
    *,
    rescan: bool,
) -> Paging[ReconciliationClaim, PageOutcome]:
    # The run's fields once the walk's first page read them; each later page starts from the
    # claim its predecessor's checkpoint left, so the row, the status and the fields are read
    # once per walk (and again only where a page's guarded write was refused).
    fields_ = None

    def page(claim: ReconciliationClaim) -> Page[ReconciliationClaim, PageOutcome]:
        nonlocal fields_
        paged = step(engine, claim, lease_seconds, fields_)
        advanced = paged.outcome is ScanOutcome.ADVANCED
        fields_ = paged.fields if advanced else None
        if paged.outcome is ScanOutcome.RESTART_REQUIRED:
            return _restarted(engine, paged.claim, rescan=rescan)
        return Page(paged.outcome, paged.claim, more=advanced)

    def renew(held: ReconciliationClaim) -> ReconciliationClaim | None:
        # An advanced page's checkpoint renewed the lease (past its half) in its own guarded
        # statement: no write of its own is needed before the next page.
        return held if fields_ is not None else steps.renew(engine, held, lease_seconds)

    return _walk(engine, claim, page, budget, lease_seconds, progress, renew)


def drain_collection_work(
    engine: Engine,
    claim: ReconciliationClaim,
    budget: Budget,
    batch_size: int,
    lease_seconds: int = LEASE_DURATION_SECONDS,
    progress: Callable[[WorkBatchResult], None] | None = None,
    pause: Callable[[float], None] = time.sleep,
) -> Paging[ReconciliationClaim, WorkBatchResult]:
    """Process the collection's due work, batch after batch, while some is pending.

    Work runs may claim the same collection's due items at the same time (on PostgreSQL
    concurrent claims skip each other's locked rows), each batch under its own leases. When
    nothing is left to claim but other claimers still hold live leases on the collection's
    work, or are claiming it at this moment (due rows a claim has locked and not committed
    yet), the drain waits for them (`pause`, lease renewed between polls, within the budget)
    instead of leaving the barrier pending for 30 s. What cannot run now and is held by
    nobody (retrying later) is left to the barrier of the next step."""
    with phase("drain"):
        if not _work_pending(engine, claim):
            return Paging(PagingEnd.DONE, claim, ())
        repository = WorkRepository(engine)

        def batch(claim: ReconciliationClaim) -> Page[ReconciliationClaim, WorkBatchResult]:
            done = process_due_batch(engine, batch_size, collection_id=claim.collection_id)
            if done.counts.claimed >= batch_size:
                # A full batch: more is likely due, and the next claim says so for free (an
                # empty one ends the walk below, after the same checks).
                return Page(done, claim, more=True)
            if done.counts.claimed > 0:
                return Page(done, claim, more=_work_pending(engine, claim))
            if done.inactive or not repository.collection_has_work_in_hand(claim.collection_id):
                return Page(done, claim, more=False)
            pause(OTHER_CLAIMERS_POLL_SECONDS)
            return Page(done, claim, more=_work_pending(engine, claim))

        return _walk(
            engine,
            claim,
            batch,
            budget,
            lease_seconds,
            progress,
            _sparse_renewal(engine, lease_seconds),
        )


def _sparse_renewal(
    engine: Engine, lease_seconds: int, clock: Callable[[], float] = time.monotonic
) -> Callable[[ReconciliationClaim], ReconciliationClaim | None]:
    """The drain's renewal between batches: the first one renews (the claim's last renewal
    is not known here), later ones only once a quarter of the lease went by since the last
    (a batch takes milliseconds: renewing after each was a write per batch for nothing). As
    for a work batch's leases, the process's clock only decides when to ask; whether the
    lease is still live and how far it extends is decided by the database in the renewal
    itself, which renews only past half the lease."""
    renewed_at: float | None = None

    def renew(held: ReconciliationClaim) -> ReconciliationClaim | None:
        nonlocal renewed_at
        if renewed_at is not None and clock() - renewed_at < lease_seconds / 4:
            return held
        renewed = steps.renew(engine, held, lease_seconds)
        renewed_at = clock()
        return renewed

    return renew


def _work_pending(engine: Engine, claim: ReconciliationClaim) -> bool:
    return steps.work_barrier(engine, claim).state is WorkBarrierState.PENDING


def _restarted(
    engine: Engine, claim: ReconciliationClaim, *, rescan: bool
) -> Page[ReconciliationClaim, PageOutcome]:
    """Restart the run from a fresh scan, which the walk pages on through when it is the
    scan (`rescan`); a refused restart ends the walk with its outcome."""
    restarted = steps.restart(engine, claim)
    if restarted.outcome is not ReconciliationOutcome.ADVANCED or restarted.claim is None:
        return Page(restarted.outcome, claim, more=False)
    return Page(ScanOutcome.RESTART_REQUIRED, restarted.claim, more=rescan)


def _walk(
    engine: Engine,
    claim: ReconciliationClaim,
    page: Callable[[ReconciliationClaim], Page],
    budget: Budget,
    lease_seconds: int,
    progress: Callable | None,
    renew: Callable[[ReconciliationClaim], ReconciliationClaim | None] | None = None,
) -> Paging:
    return page_until_done(
        claim,
        page,
        budget=budget,
        renew=renew or (lambda held: steps.renew(engine, held, lease_seconds)),
        release_now=lambda held: steps.release(engine, held, CONTINUE_DELAY_SECONDS),
        progress=progress,
    )
