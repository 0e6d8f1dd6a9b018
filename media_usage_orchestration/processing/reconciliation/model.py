"""Reconciliation's limits (spec 6.1), error codes and the outcomes its steps report."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from media_usage_orchestration.store.reconciliation.records import (
    DEFAULT_LEASE_SECONDS,
    ENTRY_FAILED_CODE,
    ReconciliationClaim,
)
from media_usage_orchestration.store.work.records import MAX_WORK_SELECTION_LIMIT

CANDIDATES_PER_TICK = 4
PAGE_SIZE = 50
LEASE_DURATION_SECONDS = DEFAULT_LEASE_SECONDS
MAX_QUERIES_PER_TICK = 20
WAIT_DELAY_SECONDS = 30
CONTINUE_DELAY_SECONDS = 0
# Not in the seed (EmDash processes one job at a time): the drain claims the batch claim's
# largest batch, which spreads each batch's fixed cost (claim, commit, completion) over two
# scan pages of entries.
DRAIN_BATCH_SIZE = MAX_WORK_SELECTION_LIMIT

RECONCILIATION_FAILED = "MEDIA_USAGE_RECONCILIATION_FAILED"
INVALID_SOURCE = "MEDIA_USAGE_RECONCILIATION_INVALID_SOURCE"
ENTRY_FAILED = ENTRY_FAILED_CODE


class ReconciliationOutcome(StrEnum):
    INACTIVE = "inactive"
    NOT_DUE = "not_due"
    CLAIM_LOST = "claim_lost"
    ADVANCED = "advanced"
    DEFERRED = "deferred"
    COMPLETED = "completed"
    # Nothing to do: coverage was already complete when the run asked (no forced request).
    ALREADY_COMPLETE = "already_complete"
    RETRY = "retry"
    FAILED = "failed"


class ScanOutcome(StrEnum):
    ADVANCED = "advanced"
    EXHAUSTED = "exhausted"
    DEFERRED = "deferred"
    RESTART_REQUIRED = "restart_required"


@dataclass(frozen=True)
class ReconciliationTickResult:
    outcome: ReconciliationOutcome
    collection_id: str | None = None


@dataclass(frozen=True)
class ClaimAttempt:
    """`claim` is set only for `advanced`; `reason` explains any other outcome to an operator."""

    outcome: ReconciliationOutcome
    claim: ReconciliationClaim | None
    reason: str


@dataclass(frozen=True)
class StepResult:
    """`claim` is the coordinator as the step left it, still leased by the caller; it is set
    only when the step advanced. `restarted` says the run went back to a fresh scan (the
    status epoch or the collection's fields moved), so the caller scans again."""

    outcome: ReconciliationOutcome
    claim: ReconciliationClaim | None = None
    restarted: bool = False
