"""Collection reconciliation (spec 6.3), Dagster-free.

Two drivers share one set of guarded steps:

- EmDash's tick (`process_due_reconciliation`): settle one obsolete or failed coordinator,
  seed one, claim one due coordinator and run one step of it
  (`process_claimed_reconciliation`), handing the lease back after every step (due at once
  after progress, in 30 s when the run must wait).
- Step functions for an op graph, one op per step: `claim_collection` -> `prepare_run` ->
  `scan_page`* -> drain the collection's work -> `enter_sources` -> `source_page`* ->
  `finalize`. A step keeps the caller's lease after it succeeds, so an op may run several
  pages and `renew` the lease between them. A step hands the lease back only where the run
  must wait (due in 30 s) or the row is not at the step asked for (due at once, so the next
  run resumes from the row's checkpoints), and never writes once the lease is lost.
  `record_step_failure` is what an op calls when a step raised. `run_to_completion` drives
  the steps exactly as the graph does.

Every write below is one repository statement that re-asserts the lease, the run token, the
epoch, the phase or the cursor itself; a refused write is reported as an outcome.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum

from sqlalchemy import Engine

from ..media.fields import FieldDiscovery
from ..media.fingerprints import field_fingerprint
from ..media.sources import CONTENT_SOURCE_SCHEMA_VERSION
from ..store.engine import read_transaction
from ..store.identifiers import require_text
from ..store.leases import LeaseState, non_negative_whole
from ..store.reconciliations import (
    ENTRY_FAILED_CODE,
    ReconciliationClaim,
    ReconciliationPhase,
    ReconciliationRecord,
    ReconciliationRepository,
    SourceCandidate,
    WorkBarrier,
    WorkBarrierState,
)
from ..store.work import WorkRepository
from .content_reads import load_fields
from .work import capture_is_active, process_due_batch
from .work import retry_delay_seconds as _work_retry_delay_seconds

logger = logging.getLogger(__name__)

CANDIDATES_PER_TICK = 4
PAGE_SIZE = 50
LEASE_DURATION_SECONDS = 60
MAX_ATTEMPTS = 5
RETRY_BASE_SECONDS = 30
RETRY_MAX_SECONDS = 15 * 60
RETRY_JITTER_RATIO = 0.25
MAX_QUERIES_PER_TICK = 20
WAIT_DELAY_SECONDS = 30
CONTINUE_DELAY_SECONDS = 0
SETTLE_LIMIT = 100
DEFAULT_MAX_STEPS = 10_000

RECONCILIATION_FAILED = "MEDIA_USAGE_RECONCILIATION_FAILED"
INVALID_SOURCE = "MEDIA_USAGE_RECONCILIATION_INVALID_SOURCE"
ENTRY_FAILED = ENTRY_FAILED_CODE
SOURCE_VARIANTS = frozenset({"columns", "draft_overlay"})


class ReconciliationOutcome(StrEnum):
    INACTIVE = "inactive"
    NOT_DUE = "not_due"
    CLAIM_LOST = "claim_lost"
    ADVANCED = "advanced"
    DEFERRED = "deferred"
    COMPLETED = "completed"
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


SETTLE_COUNTS = ("obsolete_deleted", "failed_published", "failed_reset", "stuck_pinned", "seeded")


@dataclass(frozen=True)
class SettleResult:
    counts: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(SETTLE_COUNTS, 0))
    inactive: bool = False


# --- policy -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RandomSource:
    """A `random.random`-like callable in the `rng.random()` shape the work processor takes."""

    draw: Callable[[], float]

    def random(self) -> float:
        return self.draw()


def retry_delay_seconds(attempt_count: int, rng: Callable[[], float] = random.random) -> int:
    """The work processor's backoff, which spec 6.1 shares: min(900, exp + floor(exp * 0.25 *
    rng())) with exp = min(900, 30 * 2^attempt_count), the count before this failure."""
    attempt_count = non_negative_whole(attempt_count, "Reconciliation attempt count")
    return _work_retry_delay_seconds(attempt_count, _RandomSource(rng))


def is_terminal(attempt_count: int) -> bool:
    return attempt_count + 1 >= MAX_ATTEMPTS


# --- shared pieces ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fields:
    discovery: FieldDiscovery
    fingerprint: str

    @property
    def extracts(self) -> bool:
        return bool(self.discovery.extraction_fields)


def _load_fields(engine: Engine, claim: ReconciliationRecord) -> _Fields:
    with read_transaction(engine) as connection:
        discovery = load_fields(connection, claim.collection_slug, claim.collection_id)
    return _Fields(discovery, field_fingerprint(discovery))


def _current(
    repository: ReconciliationRepository, claim: ReconciliationRecord
) -> ReconciliationRecord | None:
    """The coordinator while it still carries this claim's lease token; whether the lease is
    still live is re-checked by every guarded write, as in EmDash."""
    record = repository.find_by_identity(claim.collection_id, claim.run_token)
    if record is None or record.lease_token != claim.lease_token:
        return None
    return record


def _as_claim(record: ReconciliationRecord) -> ReconciliationClaim:
    return ReconciliationClaim(**{each.name: getattr(record, each.name) for each in fields(record)})


def _release(repository: ReconciliationRepository, claim: ReconciliationRecord, delay: int) -> bool:
    return repository.release(claim.collection_id, claim.run_token, claim.lease_token, delay)


def _wait(repository: ReconciliationRepository, claim: ReconciliationRecord) -> None:
    _release(repository, claim, WAIT_DELAY_SECONDS)


def _run_moved(
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
    fields_: _Fields,
) -> bool:
    """A captured write, schema change, operator retry or foreign owner moved the status
    epoch, or the collection's media fields changed since the run pinned them."""
    if current.target_epoch is None or not repository.owns_run(claim, current.target_epoch):
        return True
    return current.field_fingerprint != fields_.fingerprint


def _scan_upper_id(
    repository: ReconciliationRepository, claim: ReconciliationRecord, fields_: _Fields
) -> str | None:
    # Without media fields nothing is scanned, but canonical sources are still walked.
    return repository.find_scan_upper_id(claim) if fields_.extracts else None


def _enqueue(
    engine: Engine,
    claim: ReconciliationRecord,
    target_epoch: int,
    phase: str,
    content_ids: list[str],
) -> None:
    WorkRepository(engine).enqueue_reconciliation_page(
        collection_id=claim.collection_id,
        collection_slug=claim.collection_slug,
        run_token=claim.run_token,
        lease_token=claim.lease_token,
        change_epoch=target_epoch,
        phase=phase,
        content_ids=content_ids,
    )


def _step_result(
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    outcome: ReconciliationOutcome,
    restarted: bool = False,
) -> StepResult:
    if outcome is not ReconciliationOutcome.ADVANCED:
        return StepResult(outcome, None, restarted)
    current = _current(repository, claim)
    if current is None:
        return StepResult(ReconciliationOutcome.CLAIM_LOST)
    return StepResult(outcome, _as_claim(current), restarted)


def _hand_back(repository: ReconciliationRepository, claim: ReconciliationRecord) -> StepResult:
    """The row is not at the step the caller asked for: hand the lease back due at once so
    the next run resumes from the row's own checkpoints."""
    _release(repository, claim, CONTINUE_DELAY_SECONDS)
    return StepResult(ReconciliationOutcome.DEFERRED)


# --- the state machine's steps ----------------------------------------------------------------


def _begin_run(
    engine: Engine, repository: ReconciliationRepository, claim: ReconciliationRecord
) -> _Fields | None:
    """The first step of a run: take the coverage status, then pin the run's epoch, fields
    and scan bound on the coordinator. None when the run must wait."""
    epoch = repository.begin_run(claim)
    if epoch is None:
        # A manual repair (or another owner) runs coverage, or it is trusted again.
        _wait(repository, claim)
        return None
    fields_ = _load_fields(engine, claim)
    upper = _scan_upper_id(repository, claim, fields_)
    # Refused only if the lease or the status moved meanwhile; EmDash lets the lease expire.
    if not repository.initialize_scan(claim, epoch, fields_.fingerprint, upper):
        return None
    return fields_


def _restart(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
    fields_: _Fields | None = None,
) -> ReconciliationOutcome:
    """EmDash's `restartReconciliation` without its final release."""
    if current.target_epoch is None:
        return ReconciliationOutcome.CLAIM_LOST
    fields_ = fields_ or _load_fields(engine, claim)
    epoch = repository.restart_run(claim, current.target_epoch)
    if epoch is None:
        _wait(repository, claim)
        return ReconciliationOutcome.DEFERRED
    upper = _scan_upper_id(repository, claim, fields_)
    if not repository.restart_scan(claim, current.target_epoch, epoch, fields_.fingerprint, upper):
        return ReconciliationOutcome.CLAIM_LOST
    return ReconciliationOutcome.ADVANCED


def _restarted(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
    fields_: _Fields | None = None,
) -> StepResult:
    """A step's restart: the fresh scan's claim once restarted, or why it did not."""
    outcome = _restart(engine, repository, claim, current, fields_)
    return _step_result(repository, claim, outcome, restarted=True)


def _scan_claimed(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
) -> ScanOutcome:
    """EmDash's `processClaimedMediaUsageReconciliationScan` without any release."""
    if current.phase is not ReconciliationPhase.SCAN:
        return ScanOutcome.DEFERRED
    fields_ = None
    if current.target_epoch is None:
        fields_ = _begin_run(engine, repository, claim)
        current = _current(repository, claim) if fields_ else None
        if current is None:
            return ScanOutcome.DEFERRED
    return _scan_next_page(engine, repository, claim, current, fields_)


def _scan_next_page(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
    fields_: _Fields | None,
) -> ScanOutcome:
    fields_ = fields_ or _load_fields(engine, claim)
    if current.field_fingerprint != fields_.fingerprint or current.target_epoch is None:
        return ScanOutcome.RESTART_REQUIRED
    content_ids = repository.find_scan_page(current, PAGE_SIZE)
    if not content_ids:
        return ScanOutcome.EXHAUSTED
    _enqueue(engine, claim, current.target_epoch, "scan", content_ids)
    if not repository.checkpoint_scan(
        claim, current.target_epoch, current.scan_cursor, content_ids[-1]
    ):
        return ScanOutcome.DEFERRED
    return ScanOutcome.ADVANCED


def _enter_sources_claimed(
    repository: ReconciliationRepository, claim: ReconciliationRecord, current: ReconciliationRecord
) -> ReconciliationOutcome:
    """After an exhausted scan: wait for every work row, then walk the canonical sources."""
    blocked = _blocked_by_work(repository, claim)
    if blocked is not None:
        return blocked
    if current.target_epoch is None or current.field_fingerprint is None:
        return ReconciliationOutcome.CLAIM_LOST
    upper = repository.find_source_upper_key(claim, current.target_epoch)
    if not repository.transition_to_sources(
        claim, current.target_epoch, current.field_fingerprint, upper
    ):
        return ReconciliationOutcome.CLAIM_LOST
    return ReconciliationOutcome.ADVANCED


def _is_invalid_source(source: SourceCandidate) -> bool:
    return not source.content_id or source.source_variant not in SOURCE_VARIANTS


def _source_page_claimed(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
    fields_: _Fields,
) -> ScanOutcome | ReconciliationOutcome:
    page = repository.find_source_page(current, PAGE_SIZE)
    if not page:
        return ScanOutcome.EXHAUSTED
    if any(_is_invalid_source(source) for source in page):
        return _fail_run(repository, claim, INVALID_SOURCE)
    content_ids = list(dict.fromkeys(source.content_id for source in page))
    # Without media fields every source is stale (its projection must become empty);
    # otherwise the scan already refreshed every existing entry, so only absent ones remain.
    if fields_.extracts:
        content_ids = repository.find_missing_content_ids(claim.collection_slug, content_ids)
    if content_ids:
        _enqueue(engine, claim, current.target_epoch, "sources", content_ids)
    if not repository.checkpoint_sources(
        claim, current.target_epoch, current.source_cursor, page[-1].source_key
    ):
        return ReconciliationOutcome.CLAIM_LOST
    return ScanOutcome.ADVANCED


def _finalize_claimed(
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
    fields_: _Fields,
) -> ReconciliationOutcome:
    blocked = _blocked_by_work(repository, claim)
    if blocked is not None:
        return blocked
    if not repository.finalize_coverage(
        claim, current.target_epoch, fields_.fingerprint, CONTENT_SOURCE_SCHEMA_VERSION
    ):
        return ReconciliationOutcome.CLAIM_LOST
    if not repository.delete_finalized(claim):
        return ReconciliationOutcome.CLAIM_LOST
    return ReconciliationOutcome.COMPLETED


def _blocked_by_work(
    repository: ReconciliationRepository, claim: ReconciliationRecord
) -> ReconciliationOutcome | None:
    """The work barrier: failed work fails the run, pending work makes it wait (30 s); None
    once no work of the collection remains."""
    barrier = repository.find_work_barrier(claim.collection_id)
    if barrier.state is WorkBarrierState.FAILED:
        return _fail_run(repository, claim)
    if barrier.state is WorkBarrierState.PENDING:
        _wait(repository, claim)
        return ReconciliationOutcome.DEFERRED
    return None


def _fail_run(
    repository: ReconciliationRepository, claim: ReconciliationRecord, error_code: str | None = None
) -> ReconciliationOutcome:
    """A terminal failure: failed entry work (no code) or an invalid source."""
    if error_code is None:
        recorded = repository.record_entry_failure(claim)
    else:
        recorded = repository.record_failure(
            claim.collection_id, claim.run_token, claim.lease_token, error_code, 0, True
        )
    if not recorded:
        return ReconciliationOutcome.CLAIM_LOST
    _publish_failure(repository, claim)
    return ReconciliationOutcome.FAILED


def _publish_failure(repository: ReconciliationRepository, claim: ReconciliationRecord) -> None:
    if repository.finish_failed_coverage(claim.collection_id, claim.run_token):
        return
    # Nobody could publish it: the run never owned coverage, so the row has no target epoch
    # and EmDash would never reopen it. Pinning the current epoch lets the seed's own reset
    # reopen it once that epoch moves (a no-op when the row already has a target).
    repository.pin_stuck_failed_epoch(claim.collection_id, claim.run_token)


def _settle_failed(
    repository: ReconciliationRepository, record: ReconciliationRecord
) -> ReconciliationOutcome | None:
    if repository.finish_failed_coverage(record.collection_id, record.run_token):
        return ReconciliationOutcome.FAILED
    if repository.reset_failed_for_new_epoch(record):
        return ReconciliationOutcome.ADVANCED
    return None


# --- EmDash's tick ----------------------------------------------------------------------------


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
        outcome = _settle_failed(repository, record)
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
    current = _current(repository, claim)
    if current is None:
        return ReconciliationOutcome.CLAIM_LOST
    if current.target_epoch is not None and not repository.owns_run(claim, current.target_epoch):
        return _continue(repository, claim, _restart(engine, repository, claim, current))
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
    if not _release(repository, claim, CONTINUE_DELAY_SECONDS):
        return lost
    return ReconciliationOutcome.ADVANCED


def _tick_scan(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
) -> ReconciliationOutcome:
    scanned = _scan_claimed(engine, repository, claim, current)
    if scanned is ScanOutcome.RESTART_REQUIRED:
        current = repository.find_by_identity(claim.collection_id, claim.run_token) or current
        return _continue(repository, claim, _restart(engine, repository, claim, current))
    if scanned is ScanOutcome.ADVANCED:
        # EmDash reports a refused hand-back after a scan page as `deferred`.
        lost = ReconciliationOutcome.DEFERRED
        return _continue(repository, claim, ReconciliationOutcome.ADVANCED, lost)
    if scanned is ScanOutcome.DEFERRED:
        return ReconciliationOutcome.DEFERRED
    current = repository.find_by_identity(claim.collection_id, claim.run_token) or current
    return _continue(repository, claim, _enter_sources_claimed(repository, claim, current))


def _tick_sources(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
) -> ReconciliationOutcome:
    if current.target_epoch is None or current.field_fingerprint is None:
        return ReconciliationOutcome.CLAIM_LOST
    fields_ = _load_fields(engine, claim)
    if fields_.fingerprint != current.field_fingerprint:
        return _continue(repository, claim, _restart(engine, repository, claim, current, fields_))
    paged = _source_page_claimed(engine, repository, claim, current, fields_)
    if paged is ScanOutcome.ADVANCED:
        return _continue(repository, claim, ReconciliationOutcome.ADVANCED)
    if paged is not ScanOutcome.EXHAUSTED:
        return paged
    return _finalize_claimed(repository, claim, current, fields_)


# --- steps for an op graph --------------------------------------------------------------------


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
        _settle_failed(repository, record)
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
        outcome, reason = ReconciliationOutcome.COMPLETED, f"coverage is {coverage.status}"
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
    current = _current(repository, claim)
    if current is None:
        return StepResult(ReconciliationOutcome.CLAIM_LOST)
    if current.target_epoch is None:
        began = _begin_run(engine, repository, claim) is not None
        outcome = ReconciliationOutcome.ADVANCED if began else ReconciliationOutcome.DEFERRED
        return _step_result(repository, claim, outcome)
    fields_ = _load_fields(engine, claim)
    if _run_moved(repository, claim, current, fields_):
        return _restarted(engine, repository, claim, current, fields_)
    return StepResult(ReconciliationOutcome.ADVANCED, _as_claim(current))


def scan_page(engine: Engine, claim: ReconciliationClaim) -> ScanOutcome:
    """Enqueue and checkpoint one scan page (beginning the run first if `prepare_run` has
    not). `exhausted` once the scan is done or the run is already past it; `deferred` when
    the lease or the checkpoint was lost, or the run must wait."""
    repository = ReconciliationRepository(engine)
    current = _current(repository, claim)
    if current is None:
        return ScanOutcome.DEFERRED
    if current.phase is not ReconciliationPhase.SCAN:
        return ScanOutcome.EXHAUSTED
    if current.target_epoch is not None and not repository.owns_run(claim, current.target_epoch):
        return ScanOutcome.RESTART_REQUIRED
    scanned = _scan_claimed(engine, repository, claim, current)
    if scanned is ScanOutcome.EXHAUSTED and not repository.holds_live_claim(claim):
        return ScanOutcome.DEFERRED
    return scanned


def restart(engine: Engine, claim: ReconciliationClaim) -> StepResult:
    """Start the scan again at the status's current epoch with the current fields."""
    repository = ReconciliationRepository(engine)
    current = _current(repository, claim)
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
    repository = ReconciliationRepository(engine)
    current = _current(repository, claim)
    if current is None:
        return StepResult(ReconciliationOutcome.CLAIM_LOST)
    if current.phase is ReconciliationPhase.SOURCES:
        return StepResult(ReconciliationOutcome.ADVANCED, _as_claim(current))
    if current.target_epoch is None:
        return _hand_back(repository, claim)
    fields_ = _load_fields(engine, claim)
    if _run_moved(repository, claim, current, fields_):
        return _restarted(engine, repository, claim, current, fields_)
    if repository.find_scan_page(current, 1):
        return _hand_back(repository, claim)
    return _step_result(repository, claim, _enter_sources_claimed(repository, claim, current))


def source_page(engine: Engine, claim: ReconciliationClaim) -> ScanOutcome | ReconciliationOutcome:
    """Walk one page of canonical sources, enqueueing work for entries whose content is gone
    (every entry when the collection has no media fields). `deferred` when the run is not in
    its source walk."""
    repository = ReconciliationRepository(engine)
    current = _current(repository, claim)
    if current is None:
        return ReconciliationOutcome.CLAIM_LOST
    if current.phase is not ReconciliationPhase.SOURCES:
        return ScanOutcome.DEFERRED
    if current.target_epoch is None or current.field_fingerprint is None:
        return ReconciliationOutcome.CLAIM_LOST
    fields_ = _load_fields(engine, claim)
    if _run_moved(repository, claim, current, fields_):
        return ScanOutcome.RESTART_REQUIRED
    paged = _source_page_claimed(engine, repository, claim, current, fields_)
    if paged is ScanOutcome.EXHAUSTED and not repository.holds_live_claim(claim):
        return ReconciliationOutcome.CLAIM_LOST
    return paged


def finalize(engine: Engine, claim: ReconciliationClaim) -> StepResult:
    """Make coverage complete and delete the coordinator, once the source walk is done and
    no work remains (wait 30 s while work is pending; fail the run on failed work). A run
    whose epoch or fields moved is restarted (`restarted`); one whose source walk is not
    done is handed back due at once (`deferred`)."""
    repository = ReconciliationRepository(engine)
    current = _current(repository, claim)
    if current is None:
        return StepResult(ReconciliationOutcome.CLAIM_LOST)
    if current.target_epoch is None or current.field_fingerprint is None:
        return _hand_back(repository, claim)
    fields_ = _load_fields(engine, claim)
    if _run_moved(repository, claim, current, fields_):
        return _restarted(engine, repository, claim, current, fields_)
    if current.phase is not ReconciliationPhase.SOURCES or repository.find_source_page(current, 1):
        return _hand_back(repository, claim)
    return StepResult(_finalize_claimed(repository, claim, current, fields_))


def record_step_failure(
    engine: Engine, claim: ReconciliationClaim, rng: Callable[[], float] = random.random
) -> ReconciliationOutcome:
    """What the tick does when a step raised: retry with backoff, or fail terminally at the
    fifth attempt and publish the failure. Pass the claim as last returned by a step
    (progress resets its attempt count)."""
    repository = ReconciliationRepository(engine)
    terminal = is_terminal(claim.attempt_count)
    delay = retry_delay_seconds(claim.attempt_count, rng)
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
    _publish_failure(repository, claim)
    return ReconciliationOutcome.FAILED


def reload(engine: Engine, claim: ReconciliationClaim) -> ReconciliationClaim | None:
    """The coordinator as the steps left it, while it still carries this claim's lease token
    (None once it moved on). A caller that ran several steps under one lease passes this to
    `record_step_failure`: a checkpoint reset the row's attempt count."""
    current = _current(ReconciliationRepository(engine), claim)
    return None if current is None else _as_claim(current)


def release(engine: Engine, claim: ReconciliationRecord, delay_seconds: int) -> bool:
    """Hand the lease back; the coordinator is due again after `delay_seconds`."""
    return _release(ReconciliationRepository(engine), claim, delay_seconds)


def renew(
    engine: Engine, claim: ReconciliationClaim, lease_seconds: int = LEASE_DURATION_SECONDS
) -> ReconciliationClaim | None:
    """Extend a still-live lease; None once it expired or moved on."""
    expiry = ReconciliationRepository(engine).renew_lease(claim, lease_seconds)
    return None if expiry is None else replace(claim, lease_expires_at=expiry)


# --- maintenance ------------------------------------------------------------------------------


def settle_reconciliations(engine: Engine, limit: int = SETTLE_LIMIT) -> SettleResult:
    """The maintenance half of the tick, for every coordinator at once (each loop bounded by
    `limit`): delete obsolete coordinators, publish or reset failed ones, pin stuck failures,
    seed every collection that needs a run."""
    if not capture_is_active(engine):
        return SettleResult(inactive=True)
    repository = ReconciliationRepository(engine)
    counts = dict.fromkeys(SETTLE_COUNTS, 0)
    counts["obsolete_deleted"] = _repeat(repository.delete_one_obsolete, limit)
    for record in repository.find_failed(limit):
        outcome = _settle_failed(repository, record)
        if outcome is ReconciliationOutcome.FAILED:
            counts["failed_published"] += 1
        elif outcome is ReconciliationOutcome.ADVANCED:
            counts["failed_reset"] += 1
    for record in repository.find_stuck_failed(limit):
        if repository.pin_stuck_failed_epoch(record.collection_id, record.run_token) is not None:
            counts["stuck_pinned"] += 1
    counts["seeded"] = _repeat(repository.seed_next_candidate, limit)
    return SettleResult(counts)


def _repeat(action: Callable[[], bool], limit: int) -> int:
    done = 0
    while done < limit and action():
        done += 1
    return done


# --- a driver shaped like the op graph --------------------------------------------------------


def run_to_completion(
    engine: Engine,
    collection_id: str,
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    force: bool = False,
    reopen: bool = False,
    work_batch_size: int = PAGE_SIZE,
    lease_seconds: int = LEASE_DURATION_SECONDS,
) -> ReconciliationOutcome:
    """Claim one collection and drive its run with the step functions, as the op graph does:
    prepare, scan pages, drain the collection's work, enter sources, source pages, drain,
    finalize, renewing the lease between pages. When `max_steps` pages or batches are spent
    the lease is handed back due at once (`advanced`); a step that raised is recorded as the
    tick records it (`retry`, `failed` or `claim_lost`)."""
    attempt = claim_collection(
        engine, collection_id, lease_seconds=lease_seconds, force=force, reopen=reopen
    )
    if attempt.outcome is not ReconciliationOutcome.ADVANCED:
        return attempt.outcome
    driver = _Driver(engine, attempt.claim, max_steps, work_batch_size, lease_seconds)
    try:
        return driver.run()
    except Exception:
        logger.exception("Media usage reconciliation of %s failed", collection_id)
        return record_step_failure(engine, reload(engine, driver.claim) or driver.claim)


class _Flow(StrEnum):
    NEXT = "next"
    RESCAN = "rescan"


class _Driver:
    def __init__(
        self,
        engine: Engine,
        claim: ReconciliationClaim,
        max_steps: int,
        batch_size: int,
        lease_seconds: int,
    ) -> None:
        self.engine = engine
        self.claim = claim
        self.steps_left = max_steps
        self.batch_size = batch_size
        self.lease_seconds = lease_seconds

    def run(self) -> ReconciliationOutcome:
        prepared = prepare_run(self.engine, self.claim)
        if prepared.outcome is not ReconciliationOutcome.ADVANCED:
            return prepared.outcome
        self.claim = prepared.claim
        while True:
            flow = self._through_sources()
            if flow is _Flow.RESCAN:
                continue
            if flow is not _Flow.NEXT:
                return flow
            finalized = finalize(self.engine, self.claim)
            if not finalized.restarted:
                return finalized.outcome
            self.claim = finalized.claim

    def _through_sources(self) -> _Flow | ReconciliationOutcome:
        for stage in (self._scan, self._drain, self._enter_sources, self._sources, self._drain):
            flow = stage()
            if flow is not _Flow.NEXT:
                return flow
        return _Flow.NEXT

    def _scan(self) -> _Flow | ReconciliationOutcome:
        while self._spend():
            scanned = scan_page(self.engine, self.claim)
            if scanned is ScanOutcome.EXHAUSTED:
                return _Flow.NEXT
            if scanned is ScanOutcome.DEFERRED:
                return ReconciliationOutcome.DEFERRED
            if scanned is ScanOutcome.RESTART_REQUIRED:
                flow = self._restart()
                if flow is not _Flow.RESCAN:
                    return flow
            elif not self._renew():
                return ReconciliationOutcome.CLAIM_LOST
        return self._pause()

    def _drain(self) -> _Flow | ReconciliationOutcome:
        """Process the collection's due work; what cannot run now (retrying, leased
        elsewhere) is left to the barrier of the next step."""
        while work_barrier(self.engine, self.claim).state is WorkBarrierState.PENDING:
            if not self._spend():
                return self._pause()
            batch = process_due_batch(
                self.engine, self.batch_size, collection_id=self.claim.collection_id
            )
            if not self._renew():
                return ReconciliationOutcome.CLAIM_LOST
            if batch.claimed_count == 0:
                break
        return _Flow.NEXT

    def _enter_sources(self) -> _Flow | ReconciliationOutcome:
        entered = enter_sources(self.engine, self.claim)
        if entered.outcome is not ReconciliationOutcome.ADVANCED:
            return entered.outcome
        self.claim = entered.claim
        return _Flow.RESCAN if entered.restarted else _Flow.NEXT

    def _sources(self) -> _Flow | ReconciliationOutcome:
        while self._spend():
            paged = source_page(self.engine, self.claim)
            if paged is ScanOutcome.EXHAUSTED:
                return _Flow.NEXT
            if paged is ScanOutcome.RESTART_REQUIRED:
                return self._restart()
            if paged is ScanOutcome.DEFERRED:
                return ReconciliationOutcome.DEFERRED
            if paged is not ScanOutcome.ADVANCED:
                return paged
            if not self._renew():
                return ReconciliationOutcome.CLAIM_LOST
        return self._pause()

    def _restart(self) -> _Flow | ReconciliationOutcome:
        restarted = restart(self.engine, self.claim)
        if restarted.outcome is not ReconciliationOutcome.ADVANCED:
            return restarted.outcome
        self.claim = restarted.claim
        return _Flow.RESCAN

    def _spend(self) -> bool:
        self.steps_left -= 1
        return self.steps_left >= 0

    def _renew(self) -> bool:
        renewed = renew(self.engine, self.claim, self.lease_seconds)
        if renewed is None:
            return False
        self.claim = renewed
        return True

    def _pause(self) -> ReconciliationOutcome:
        """The step budget is spent: hand the lease back due at once; the next run resumes
        from the checkpoints."""
        if release(self.engine, self.claim, CONTINUE_DELAY_SECONDS):
            return ReconciliationOutcome.ADVANCED
        return ReconciliationOutcome.CLAIM_LOST


__all__ = [
    "CANDIDATES_PER_TICK",
    "ENTRY_FAILED",
    "INVALID_SOURCE",
    "LEASE_DURATION_SECONDS",
    "MAX_ATTEMPTS",
    "PAGE_SIZE",
    "RECONCILIATION_FAILED",
    "ClaimAttempt",
    "ReconciliationOutcome",
    "ReconciliationTickResult",
    "ScanOutcome",
    "SettleResult",
    "StepResult",
    "claim_collection",
    "enter_sources",
    "finalize",
    "prepare_run",
    "process_claimed_reconciliation",
    "process_due_reconciliation",
    "reclaim",
    "record_step_failure",
    "release",
    "reload",
    "renew",
    "restart",
    "retry_delay_seconds",
    "run_to_completion",
    "scan_page",
    "settle_reconciliations",
    "source_page",
    "work_barrier",
]
