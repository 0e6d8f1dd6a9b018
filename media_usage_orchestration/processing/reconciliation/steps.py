"""Reconciliation's steps for an op graph, one op per step (spec 6.3), Dagster-free:
`claim_collection` -> `prepare_run` -> `scan_page`* -> drain the collection's work ->
`enter_sources` -> `source_page`* -> `finalize`.

A step keeps the caller's lease after it succeeds, so an op may run several pages and `renew`
the lease between them (`walks.py`). A step hands the lease back only where the run must wait
(due in 30 s) or the row is not at the step asked for (due at once, so the next run resumes
from the row's checkpoints), and never writes once the lease is lost. `record_step_failure` is
what an op calls when a step raised.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from media_usage_orchestration.processing.loop.phases import phase
from media_usage_orchestration.processing.loop.retry_policy import RECONCILIATION_RETRY
from media_usage_orchestration.processing.reconciliation import machine
from media_usage_orchestration.processing.reconciliation.machine import RunFields
from media_usage_orchestration.processing.reconciliation.model import (
    CONTINUE_DELAY_SECONDS,
    LEASE_DURATION_SECONDS,
    RECONCILIATION_FAILED,
    ClaimAttempt,
    ReconciliationOutcome,
    ScanOutcome,
    StepResult,
)
from media_usage_orchestration.processing.work.processor import capture_is_active
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.core.leases import LeaseState
from media_usage_orchestration.store.reconciliation.records import (
    ReconciliationClaim,
    ReconciliationPhase,
    ReconciliationRecord,
    WorkBarrier,
)
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from media_usage_orchestration.values.identifiers import require_text


def _step_result(
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    outcome: ReconciliationOutcome,
    restarted: bool = False,
) -> StepResult:
    if outcome is not ReconciliationOutcome.ADVANCED:
        return StepResult(outcome, None, restarted)
    current = machine.current_record(repository, claim)
    if current is None:
        return StepResult(ReconciliationOutcome.CLAIM_LOST)
    return StepResult(outcome, machine.as_claim(current), restarted)


def _hand_back(repository: ReconciliationRepository, claim: ReconciliationRecord) -> StepResult:
    """The row is not at the step the caller asked for: hand the lease back due at once so
    the next run resumes from the row's own checkpoints."""
    machine.release_lease(repository, claim, CONTINUE_DELAY_SECONDS)
    return StepResult(ReconciliationOutcome.DEFERRED)


def _restarted(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
    fields_: RunFields | None = None,
) -> StepResult:
    """A step's restart: the fresh scan's claim once restarted, or why it did not."""
    outcome = machine.restart_run(engine, repository, claim, current, fields_)
    return _step_result(repository, claim, outcome, restarted=True)


def claim_collection(
    engine: Engine,
    collection_id: str,
    *,
    lease_seconds: int = LEASE_DURATION_SECONDS,
    force: bool = False,
    reopen: bool = False,
) -> ClaimAttempt:
    """Claim this collection's coordinator, seeding it if the collection needs one.

    `force` first makes trusted coverage untrusted (a full reconciliation is requested);
    `reopen` first reopens a failed, retrying or lease-expired coordinator, as an operator
    re-executing a failed run means to. A failed coordinator is settled the way the tick
    settles one (its failure published, or reset once the status epoch moved)."""
    require_text(collection_id, "Reconciliation claim requires a collection ID")
    if not capture_is_active(engine):
        return ClaimAttempt(ReconciliationOutcome.INACTIVE, None, "media usage capture is inactive")
    repository = ReconciliationRepository(engine)
    if reopen:
        repository.retry_failed_by_operator(collection_id)
    if force:
        repository.request_full_reconciliation(collection_id)
    record = _settled_or_seeded(repository, collection_id)
    if record is not None:
        claim = repository.claim(collection_id, record.run_token, lease_seconds)
        if claim is not None:
            return ClaimAttempt(ReconciliationOutcome.ADVANCED, claim, "claimed")
    return _unclaimable(repository, collection_id)


def reclaim(
    engine: Engine,
    claim: ReconciliationRecord,
    *,
    reopen: bool = False,
    lease_seconds: int = LEASE_DURATION_SECONDS,
) -> ClaimAttempt:
    """Claim a run again in the middle of the graph, after its lease lapsed or a failure was
    recorded: a plain claim keeps the row's checkpoints, so the step resumes where the run
    stopped. With `reopen` (an operator re-executing from the failed step) a retrying run is
    first made due now; only what no plain claim can take (a failed run) is reopened as a
    fresh scan."""
    if reopen:
        ReconciliationRepository(engine).resume_retry_now(claim.collection_id, claim.run_token)
    attempt = claim_collection(engine, claim.collection_id, lease_seconds=lease_seconds)
    if reopen and attempt.outcome is not ReconciliationOutcome.ADVANCED:
        attempt = claim_collection(
            engine, claim.collection_id, lease_seconds=lease_seconds, reopen=True
        )
    return attempt


def _settled_or_seeded(
    repository: ReconciliationRepository, collection_id: str
) -> ReconciliationRecord | None:
    record = repository.find_by_collection(collection_id)
    if record is not None and record.state is LeaseState.FAILED:
        machine.settle_failed(repository, record)
        record = repository.find_by_collection(collection_id)
    if record is None and repository.seed_collection(collection_id):
        record = repository.find_by_collection(collection_id)
    return record


def _unclaimable(repository: ReconciliationRepository, collection_id: str) -> ClaimAttempt:
    """Why a collection could not be claimed, read after the refused claim."""
    coverage = repository.find_coverage(collection_id)
    record = repository.find_by_collection(collection_id)
    outcome, reason = ReconciliationOutcome.NOT_DUE, "the collection has no media usage status"
    if coverage is not None and coverage.reconciliation_required == 0:
        outcome = ReconciliationOutcome.ALREADY_COMPLETE
        reason = f"coverage is {coverage.status}; force re-reconciles it"
    elif coverage is not None and coverage.capture_state != "active":
        reason = f"capture is {coverage.capture_state or 'not installed'} for this collection"
    elif coverage is not None and record is None:
        reason = "the collection identity is not current or a deletion is under way"
    elif record is not None:
        outcome, reason = _record_refusal(record)
    return ClaimAttempt(outcome, None, reason)


def _record_refusal(record: ReconciliationRecord) -> tuple[ReconciliationOutcome, str]:
    if record.state is LeaseState.LEASED:
        held = f"another run holds the lease until {record.lease_expires_at}"
        return ReconciliationOutcome.CLAIM_LOST, held
    if record.state is LeaseState.FAILED:
        failed = f"the last run failed ({record.last_error_code}); an operator retry reopens it"
        return ReconciliationOutcome.FAILED, failed
    return ReconciliationOutcome.NOT_DUE, f"next attempt at {record.next_attempt_at}"


def prepare_run(engine: Engine, claim: ReconciliationClaim) -> StepResult:
    """The first step of a claimed run, idempotent: begin the run if it has no epoch yet;
    restart it if its epoch or fields moved; otherwise nothing to do."""
    repository = ReconciliationRepository(engine)
    current = machine.current_record(repository, claim)
    if current is None:
        return StepResult(ReconciliationOutcome.CLAIM_LOST)
    if current.target_epoch is None:
        began = machine.begin_run(engine, repository, claim) is not None
        outcome = ReconciliationOutcome.ADVANCED if began else ReconciliationOutcome.DEFERRED
        return _step_result(repository, claim, outcome)
    fields_ = machine.load_run_fields(engine, claim)
    if machine.run_moved(repository, claim, current, fields_):
        return _restarted(engine, repository, claim, current, fields_)
    return StepResult(ReconciliationOutcome.ADVANCED, machine.as_claim(current))


@dataclass(frozen=True)
class PageStep:
    """A page's outcome; `claim` is the coordinator as the page left it and `fields` the run's
    fields, both for the walk's next page (`fields` is None when that page must read the row
    again, as the first page of an op does)."""

    outcome: ScanOutcome | ReconciliationOutcome
    claim: ReconciliationClaim
    fields: RunFields | None = None


# What a carried page that did not advance may have run into without writing anything (a
# lease taken over, an epoch moved, the walk's end): the row, read again, says which.
_UNWRITTEN = frozenset(
    {ScanOutcome.EXHAUSTED, ScanOutcome.DEFERRED, ReconciliationOutcome.CLAIM_LOST}
)


def scan_page(
    engine: Engine,
    claim: ReconciliationClaim,
    lease_seconds: int = LEASE_DURATION_SECONDS,
    fields_: RunFields | None = None,
) -> PageStep:
    """Enqueue and checkpoint one scan page (beginning the run first if `prepare_run` has
    not); the checkpoint renews the lease once past its half. `exhausted` once the scan is
    done or the run is already past it; `deferred` when the lease or the checkpoint was lost,
    or the run must wait.

    With `fields_` (the walk's previous page advanced) `claim` is the row as that page's
    checkpoint left it, and the page is written without reading the row first: its enqueue
    and checkpoint re-assert lease, run, status epoch and cursor, so a refused page changed
    nothing and is then judged from the row as it is now."""
    return _carried_or_read(
        engine, claim, lease_seconds, fields_, _carried_scan_page, _scan_page_read
    )


def _carried_scan_page(*args) -> machine.Paged:
    # Any page that does not advance (an empty one too) is taken again from the row.
    return machine.scan_next_page(*args, guarded_read=False)


def _carried_or_read(
    engine: Engine,
    claim: ReconciliationClaim,
    lease_seconds: int,
    fields_: RunFields | None,
    next_page: Callable[..., machine.Paged],
    read_page: Callable[..., PageStep],
) -> PageStep:
    """The page from the carried claim when `fields_` is given; from the row read first when
    not, or when the carried page wrote nothing (its guards only say that something moved)."""
    repository = ReconciliationRepository(engine)
    if fields_ is not None:
        paged = next_page(engine, repository, claim, claim, fields_, lease_seconds)
        if paged.outcome not in _UNWRITTEN:
            return PageStep(paged.outcome, machine.as_claim(paged.current), fields_)
    return read_page(engine, repository, claim, lease_seconds)


def _page_step(
    repository: ReconciliationRepository,
    claim: ReconciliationClaim,
    paged: machine.Paged,
    fields_: RunFields,
    lost: ScanOutcome | ReconciliationOutcome,
) -> PageStep:
    """A page taken from the row: an empty page is `lost` when the lease is gone (the guarded
    page read sees nothing then), not the walk's end."""
    if paged.outcome is ScanOutcome.EXHAUSTED and not repository.holds_live_claim(claim):
        return PageStep(lost, claim)
    return PageStep(paged.outcome, machine.as_claim(paged.current), fields_)


def _scan_page_read(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationClaim,
    lease_seconds: int,
) -> PageStep:
    current = machine.current_record(repository, claim)
    if current is None:
        return PageStep(ScanOutcome.DEFERRED, claim)
    if current.phase is not ReconciliationPhase.SCAN:
        return PageStep(ScanOutcome.EXHAUSTED, claim)
    if current.target_epoch is not None and not repository.owns_run(claim, current.target_epoch):
        return PageStep(ScanOutcome.RESTART_REQUIRED, claim)
    if current.target_epoch is None:
        fields_ = machine.begin_run(engine, repository, claim)
        current = machine.current_record(repository, claim) if fields_ else None
        if current is None:
            return PageStep(ScanOutcome.DEFERRED, claim)
    else:
        fields_ = machine.load_run_fields(engine, claim)
    paged = machine.scan_next_page(engine, repository, claim, current, fields_, lease_seconds)
    return _page_step(repository, claim, paged, fields_, ScanOutcome.DEFERRED)


def restart(engine: Engine, claim: ReconciliationClaim) -> StepResult:
    """Start the scan again at the status's current epoch with the current fields."""
    repository = ReconciliationRepository(engine)
    current = machine.current_record(repository, claim)
    if current is None:
        return StepResult(ReconciliationOutcome.CLAIM_LOST)
    return _restarted(engine, repository, claim, current)


def work_barrier(engine: Engine, claim: ReconciliationRecord) -> WorkBarrier:
    return ReconciliationRepository(engine).find_work_barrier(claim.collection_id)


def enter_sources(engine: Engine, claim: ReconciliationClaim) -> StepResult:
    """Move an exhausted scan to the source walk once no work remains; fail the run when an
    entry's work failed; wait (30 s) while work is pending. A run whose epoch or fields
    moved is restarted (`restarted`); one whose scan is not exhausted is handed back due at
    once (`deferred`)."""
    with phase("sources"):
        return _enter_sources(engine, claim)


def _enter_sources(engine: Engine, claim: ReconciliationClaim) -> StepResult:
    repository = ReconciliationRepository(engine)
    current = machine.current_record(repository, claim)
    if current is None:
        return StepResult(ReconciliationOutcome.CLAIM_LOST)
    if current.phase is ReconciliationPhase.SOURCES:
        return StepResult(ReconciliationOutcome.ADVANCED, machine.as_claim(current))
    if current.target_epoch is None:
        return _hand_back(repository, claim)
    fields_ = machine.load_run_fields(engine, claim)
    if machine.run_moved(repository, claim, current, fields_):
        return _restarted(engine, repository, claim, current, fields_)
    if repository.find_scan_page(current, 1):
        return _hand_back(repository, claim)
    return _step_result(
        repository, claim, machine.enter_sources_claimed(repository, claim, current)
    )


def source_page(
    engine: Engine,
    claim: ReconciliationClaim,
    lease_seconds: int = LEASE_DURATION_SECONDS,
    fields_: RunFields | None = None,
) -> PageStep:
    """Walk one page of canonical sources, enqueueing work for entries whose content is gone
    (every entry when the collection has no media fields); the checkpoint renews the lease
    once past its half. `deferred` when the run is not in its source walk. With `fields_`
    the page starts from `claim` as the previous page left it, as `scan_page` does."""
    return _carried_or_read(
        engine, claim, lease_seconds, fields_, machine.source_page_claimed, _source_page_read
    )


def _source_page_read(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationClaim,
    lease_seconds: int,
) -> PageStep:
    current = machine.current_record(repository, claim)
    if current is None:
        return PageStep(ReconciliationOutcome.CLAIM_LOST, claim)
    if current.phase is not ReconciliationPhase.SOURCES:
        return PageStep(ScanOutcome.DEFERRED, claim)
    if current.target_epoch is None or current.field_fingerprint is None:
        return PageStep(ReconciliationOutcome.CLAIM_LOST, claim)
    fields_ = machine.load_run_fields(engine, claim)
    if machine.run_moved(repository, claim, current, fields_):
        return PageStep(ScanOutcome.RESTART_REQUIRED, claim)
    paged = machine.source_page_claimed(engine, repository, claim, current, fields_, lease_seconds)
    return _page_step(repository, claim, paged, fields_, ReconciliationOutcome.CLAIM_LOST)


def finalize(engine: Engine, claim: ReconciliationClaim) -> StepResult:
    """Make coverage complete and delete the coordinator, once the source walk is done and
    no work remains (wait 30 s while work is pending; fail the run on failed work). A run
    whose epoch or fields moved is restarted (`restarted`); one whose source walk is not
    done is handed back due at once (`deferred`)."""
    with phase("finalize"):
        return _finalize(engine, claim)


def _finalize(engine: Engine, claim: ReconciliationClaim) -> StepResult:
    repository = ReconciliationRepository(engine)
    current = machine.current_record(repository, claim)
    if current is None:
        return StepResult(ReconciliationOutcome.CLAIM_LOST)
    if current.target_epoch is None or current.field_fingerprint is None:
        return _hand_back(repository, claim)
    fields_ = machine.load_run_fields(engine, claim)
    if machine.run_moved(repository, claim, current, fields_):
        return _restarted(engine, repository, claim, current, fields_)
    if current.phase is not ReconciliationPhase.SOURCES or repository.find_source_page(current, 1):
        return _hand_back(repository, claim)
    return StepResult(machine.finalize_claimed(repository, claim, current, fields_))


def record_step_failure(
    engine: Engine, claim: ReconciliationClaim, rng: Callable[[], float] = random.random
) -> ReconciliationOutcome:
    """What the tick does when a step raised: retry with backoff, or fail terminally at the
    fifth attempt and publish the failure. Pass the claim as last returned by a step
    (progress resets its attempt count)."""
    repository = ReconciliationRepository(engine)
    terminal = RECONCILIATION_RETRY.is_terminal(claim.attempt_count)
    delay = RECONCILIATION_RETRY.delay_seconds(claim.attempt_count, rng)
    if not repository.record_failure(
        claim.collection_id,
        claim.run_token,
        claim.lease_token,
        RECONCILIATION_FAILED,
        delay,
        terminal,
    ):
        return ReconciliationOutcome.CLAIM_LOST
    if not terminal:
        return ReconciliationOutcome.RETRY
    machine.publish_failure(repository, claim)
    return ReconciliationOutcome.FAILED


def reload(engine: Engine, claim: ReconciliationClaim) -> ReconciliationClaim | None:
    """The coordinator as the steps left it, while it still carries this claim's lease token
    (None once it moved on). A caller that ran several steps under one lease passes this to
    `record_step_failure`: a checkpoint reset the row's attempt count."""
    current = machine.current_record(ReconciliationRepository(engine), claim)
    return None if current is None else machine.as_claim(current)


def release(engine: Engine, claim: ReconciliationRecord, delay_seconds: int) -> bool:
    """Hand the lease back; the coordinator is due again after `delay_seconds`."""
    return machine.release_lease(ReconciliationRepository(engine), claim, delay_seconds)


def renew(
    engine: Engine, claim: ReconciliationClaim, lease_seconds: int = LEASE_DURATION_SECONDS
) -> ReconciliationClaim | None:
    """Extend a still-live lease; None once it expired or moved on."""
    expiry = ReconciliationRepository(engine).renew_lease(claim, lease_seconds)
    return None if expiry is None else replace(claim, lease_expires_at=expiry)
