"""`run_to_completion`: one collection's reconciliation driven in one call by the steps and
walks the op graph runs, in the graph's order (prepare, scan pages, drain, enter sources,
source pages, finalize), sharing one step budget.

Where the graph ends a run and leaves the rest to the next one, the driver goes on: after a
source walk or a finalize that restarted the run it scans again, and it drains the work the
source walk enqueued before finalizing.
"""

from __future__ import annotations

import logging
from enum import StrEnum

from media_usage_orchestration.processing.loop.run_loop import Budget, Paging, PagingEnd
from media_usage_orchestration.processing.reconciliation import steps, walks
from media_usage_orchestration.processing.reconciliation.model import (
    DRAIN_BATCH_SIZE,
    LEASE_DURATION_SECONDS,
    ReconciliationOutcome,
    ScanOutcome,
)
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.reconciliation.records import ReconciliationClaim

logger = logging.getLogger(__name__)

DEFAULT_MAX_STEPS = 10_000


def run_to_completion(
    engine: Engine,
    collection_id: str,
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    force: bool = False,
    reopen: bool = False,
    work_batch_size: int = DRAIN_BATCH_SIZE,
    lease_seconds: int = LEASE_DURATION_SECONDS,
) -> ReconciliationOutcome:
    """Claim one collection and drive its run as the op graph does, renewing the lease
    between pages. When `max_steps` pages or batches are spent the lease is handed back due
    at once (`advanced`); a step that raised is recorded as the tick records it (`retry`,
    `failed` or `claim_lost`)."""
    attempt = steps.claim_collection(
        engine, collection_id, lease_seconds=lease_seconds, force=force, reopen=reopen
    )
    if attempt.outcome is not ReconciliationOutcome.ADVANCED:
        return attempt.outcome
    run = _Run(engine, attempt.claim, Budget(max_steps), work_batch_size, lease_seconds)
    try:
        return run.to_completion()
    except Exception:
        logger.exception("Media usage reconciliation of %s failed", collection_id)
        return steps.record_step_failure(engine, steps.reload(engine, run.claim) or run.claim)


class _Flow(StrEnum):
    NEXT = "next"
    RESCAN = "rescan"


class _Run:
    def __init__(
        self,
        engine: Engine,
        claim: ReconciliationClaim,
        budget: Budget,
        batch_size: int,
        lease_seconds: int,
    ) -> None:
        self.engine = engine
        self.claim = claim
        self.budget = budget
        self.batch_size = batch_size
        self.lease_seconds = lease_seconds

    def to_completion(self) -> ReconciliationOutcome:
        prepared = steps.prepare_run(self.engine, self.claim)
        if prepared.outcome is not ReconciliationOutcome.ADVANCED:
            return prepared.outcome
        self.claim = prepared.claim
        while True:
            flow = self._through_sources()
            if flow is _Flow.RESCAN:
                continue
            if flow is not _Flow.NEXT:
                return flow
            finalized = steps.finalize(self.engine, self.claim)
            if not finalized.restarted or finalized.claim is None:
                return finalized.outcome
            self.claim = finalized.claim

    def _through_sources(self) -> _Flow | ReconciliationOutcome:
        for stage in (self._scan, self._drain, self._enter_sources, self._sources, self._drain):
            flow = stage()
            if flow is not _Flow.NEXT:
                return flow
        return _Flow.NEXT

    def _scan(self) -> _Flow | ReconciliationOutcome:
        return self._walked(
            walks.scan_pages(self.engine, self.claim, self.budget, self.lease_seconds)
        )

    def _drain(self) -> _Flow | ReconciliationOutcome:
        drained = walks.drain_collection_work(
            self.engine, self.claim, self.budget, self.batch_size, self.lease_seconds
        )
        return self._stopped(drained) or _Flow.NEXT

    def _enter_sources(self) -> _Flow | ReconciliationOutcome:
        entered = steps.enter_sources(self.engine, self.claim)
        if entered.outcome is not ReconciliationOutcome.ADVANCED:
            return entered.outcome
        self.claim = entered.claim
        return _Flow.RESCAN if entered.restarted else _Flow.NEXT

    def _sources(self) -> _Flow | ReconciliationOutcome:
        return self._walked(
            walks.source_pages(self.engine, self.claim, self.budget, self.lease_seconds)
        )

    def _walked(self, paging: Paging) -> _Flow | ReconciliationOutcome:
        stopped = self._stopped(paging)
        if stopped is not None:
            return stopped
        if paging.last is ScanOutcome.EXHAUSTED:
            return _Flow.NEXT
        if paging.last is ScanOutcome.RESTART_REQUIRED:
            return _Flow.RESCAN
        return ReconciliationOutcome(paging.last.value)

    def _stopped(self, paging: Paging) -> ReconciliationOutcome | None:
        """Take the walk's claim; the outcome of a walk that did not end on its own."""
        self.claim = paging.lease
        if paging.end is PagingEnd.CLAIM_LOST:
            return ReconciliationOutcome.CLAIM_LOST
        if paging.end is PagingEnd.BUDGET_SPENT:
            # Handed back due at once: the next run resumes from the checkpoints.
            released = paging.released
            return ReconciliationOutcome.ADVANCED if released else ReconciliationOutcome.CLAIM_LOST
        return None
