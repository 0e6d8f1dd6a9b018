"""EmDash's reconciliation tick (`processDueMediaUsageReconciliation`, spec 6.3): settle one
obsolete or failed coordinator, seed one, claim one due coordinator and run one step of it
(`process_claimed_reconciliation`), handing the lease back after every step (due at once
after progress, in 30 s when the run must wait).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from media_usage_orchestration.processing.reconciliation import machine
from media_usage_orchestration.processing.reconciliation.model import (
    CANDIDATES_PER_TICK,
    CONTINUE_DELAY_SECONDS,
    LEASE_DURATION_SECONDS,
    ReconciliationOutcome,
    ReconciliationTickResult,
    ScanOutcome,
)
from media_usage_orchestration.processing.reconciliation.steps import record_step_failure
from media_usage_orchestration.processing.work.processor import capture_is_active
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.reconciliation.records import (
    ReconciliationClaim,
    ReconciliationPhase,
    ReconciliationRecord,
)
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository

logger = logging.getLogger(__name__)


def process_due_reconciliation(
    engine: Engine, rng: Callable[[], float] = random.random
) -> ReconciliationTickResult:
    """EmDash's `processDueMediaUsageReconciliation`: at most one settled, seeded and claimed
    coordinator, and one step of it."""
    if not capture_is_active(engine):
        return ReconciliationTickResult(ReconciliationOutcome.INACTIVE)
    repository = ReconciliationRepository(engine)
    obsolete = repository.delete_one_obsolete_collection()
    if obsolete is not None:
        return ReconciliationTickResult(ReconciliationOutcome.COMPLETED, obsolete)
    settled = _settle_one_failed(repository)
    if settled is not None:
        return settled
    repository.seed_next_candidate()
    candidates = repository.find_due(CANDIDATES_PER_TICK)
    claim = _claim_first(repository, candidates)
    if claim is None:
        lost = ReconciliationOutcome.CLAIM_LOST if candidates else ReconciliationOutcome.NOT_DUE
        return ReconciliationTickResult(lost)
    try:
        outcome = process_claimed_reconciliation(engine, claim)
    except Exception:
        logger.exception("Media usage reconciliation of %s failed", claim.collection_slug)
        outcome = record_step_failure(engine, claim, rng)
    return ReconciliationTickResult(outcome, claim.collection_id)


def _settle_one_failed(repository: ReconciliationRepository) -> ReconciliationTickResult | None:
    for record in repository.find_failed(1):
        outcome = machine.settle_failed(repository, record)
        if outcome is not None:
            return ReconciliationTickResult(outcome, record.collection_id)
    return None


def _claim_first(
    repository: ReconciliationRepository, candidates: list[ReconciliationRecord]
) -> ReconciliationClaim | None:
    for candidate in candidates:
        claim = repository.claim(
            candidate.collection_id, candidate.run_token, LEASE_DURATION_SECONDS
        )
        if claim is not None:
            return claim
    return None


def process_claimed_reconciliation(
    engine: Engine, claim: ReconciliationClaim
) -> ReconciliationOutcome:
    """One EmDash step of a claimed coordinator, with EmDash's releases: due at once after a
    step that advanced, in 30 s when the run waits."""
    repository = ReconciliationRepository(engine)
    current = machine.current_record(repository, claim)
    if current is None:
        return ReconciliationOutcome.CLAIM_LOST
    if current.target_epoch is not None and not repository.owns_run(claim, current.target_epoch):
        return _continue(repository, claim, machine.restart_run(engine, repository, claim, current))
    if current.phase is ReconciliationPhase.SCAN:
        return _tick_scan(engine, repository, claim, current)
    return _tick_sources(engine, repository, claim, current)


def _continue(
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    outcome: ReconciliationOutcome,
    lost: ReconciliationOutcome = ReconciliationOutcome.CLAIM_LOST,
) -> ReconciliationOutcome:
    if outcome is not ReconciliationOutcome.ADVANCED:
        return outcome
    if not machine.release_lease(repository, claim, CONTINUE_DELAY_SECONDS):
        return lost
    return ReconciliationOutcome.ADVANCED


def _tick_scan(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
) -> ReconciliationOutcome:
    scanned = machine.scan_claimed(engine, repository, claim, current)
    if scanned is ScanOutcome.RESTART_REQUIRED:
        current = repository.find_by_identity(claim.collection_id, claim.run_token) or current
        return _continue(repository, claim, machine.restart_run(engine, repository, claim, current))
    if scanned is ScanOutcome.ADVANCED:
        # EmDash reports a refused hand-back after a scan page as `deferred`.
        lost = ReconciliationOutcome.DEFERRED
        return _continue(repository, claim, ReconciliationOutcome.ADVANCED, lost)
    if scanned is ScanOutcome.DEFERRED:
        return ReconciliationOutcome.DEFERRED
    current = repository.find_by_identity(claim.collection_id, claim.run_token) or current
    return _continue(repository, claim, machine.enter_sources_claimed(repository, claim, current))


def _tick_sources(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
) -> ReconciliationOutcome:
    if current.target_epoch is None or current.field_fingerprint is None:
        return ReconciliationOutcome.CLAIM_LOST
    fields_ = machine.load_run_fields(engine, claim)
    if fields_.fingerprint != current.field_fingerprint:
        return _continue(
            repository, claim, machine.restart_run(engine, repository, claim, current, fields_)
        )
    paged = machine.source_page_claimed(engine, repository, claim, current, fields_).outcome
    if paged is ScanOutcome.ADVANCED:
        return _continue(repository, claim, ReconciliationOutcome.ADVANCED)
    if paged is not ScanOutcome.EXHAUSTED:
        return paged
    return machine.finalize_claimed(repository, claim, current, fields_)
