"""Collection deletion (spec section 7), Dagster-free.

Three entry points share one set of phase functions:

- the request path, EmDash's `SchemaRegistry.deleteCollection`
  (`request_collection_deletion`): refuse a non-empty collection without force, then either
  detach an activated collection through its front phases (`delete_activated_collection`,
  EmDash's `deleteActivatedMediaUsageCollection`) or, while capture is not activated, drop
  everything synchronously in one transaction;
- EmDash's background tick (`process_due_deletions`): claim one due tombstone, run one phase
  or one batch, hand it back (or finalize it), and record a failure with backoff;
- per-phase steps for an op graph (`fence_step` ... `finalize_step`, `run_phase_step`): each
  does exactly one phase or batch under a lease the caller holds and keeps that lease, so a
  caller may loop and renew (`renew_deletion_lease`) between batches.

The tombstone's UNIQUE slug is the slug lock: it is written before anything is removed and
deleted last, so the slug cannot be reused until every row of the old identity is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from media_usage_orchestration.processing.loop.retry_policy import DELETION_RETRY
from media_usage_orchestration.store.core.capture_triggers import (
    CaptureIdentity,
    verify_capture_triggers,
)
from media_usage_orchestration.store.core.engine import Connection, Engine, read_transaction
from media_usage_orchestration.store.core.leases import LeaseState, bounded_limit, require_flag
from media_usage_orchestration.store.deletion.local_guard import (
    delete_collection_synchronously,
    execute_local_deletion_guard,
    read_capture_state,
    table_has_live_content,
)
from media_usage_orchestration.store.deletion.records import (
    ROWS_PER_BATCH,
    DeletionClaim,
    DeletionLease,
    DeletionPhase,
    DeletionRecord,
    GuardAction,
    GuardOutcome,
)
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from media_usage_orchestration.store.host.activation import (
    read_activation_state,
    writable_activation_state,
)
from media_usage_orchestration.store.host.registry import (
    collection_identity_exists,
    read_collection_id,
)
from media_usage_orchestration.values.errors import (
    CollectionHasContentError,
    CollectionNotFoundError,
    DeletionConflictError,
    DeletionError,
    DeletionIdentityConflict,
    DeletionLeaseLost,
    DeletionNotReady,
)
from media_usage_orchestration.values.identifiers import content_table_name, validate_identifier

logger = logging.getLogger(__name__)

CANDIDATES_PER_TICK = 4
DELETIONS_PER_TICK = 1
LEASE_DURATION_SECONDS = 5 * 60
MAX_QUERIES_PER_TICK = 30
REQUEST_FRONT_PHASE_LIMIT = 3
BACKGROUND_FRONT_PHASE_LIMIT = 1
DELETION_FAILED = DeletionError.code

LeaseHolder = DeletionLease | DeletionClaim


# --- outcomes and errors ----------------------------------------------------------------------


class FrontPhaseOutcome(StrEnum):
    """EmDash's `ActivatedCollectionDeletionOutcome`."""

    INACTIVE = "inactive"
    NOT_FOUND = "not_found"
    IN_PROGRESS = "in_progress"
    ADVANCED = "advanced"
    DELETED = "deleted"
    HAS_CONTENT = "has_content"


class DeletionTickOutcome(StrEnum):
    IDLE = "idle"
    PROGRESS = "progress"
    FINALIZED = "finalized"
    RETRY = "retry"
    FAILED = "failed"
    CLAIM_LOST = "claim_lost"


class PhaseStepOutcome(StrEnum):
    """What one step did; the lease stays held unless the tombstone is gone."""

    ADVANCED = "advanced"  # the tombstone moved on to `phase`
    REPEAT = "repeat"  # one batch done, rows remain: run the same phase again
    HAS_CONTENT = "has_content"  # the fence found live content: tombstone cancelled, kept
    FINALIZED = "finalized"  # the tombstone is deleted and the slug is free
    SKIPPED = "skipped"  # the tombstone is in another phase (`phase`); nothing done


class RequestOutcome(StrEnum):
    DELETED = "deleted"  # capture not activated: everything removed in one transaction
    DETACHED = "detached"  # registry and table gone; the background finishes the cleanup
    # Tombstone written, front phases left to the background (only with a front-phase limit
    # below 3; the request path runs all three).
    ACCEPTED = "accepted"


@dataclass(frozen=True)
class PhaseStepResult:
    outcome: PhaseStepOutcome
    phase: DeletionPhase | None  # the tombstone's phase after the step; None once it is gone
    deleted: int = 0  # rows removed by a work or sources batch


@dataclass(frozen=True)
class DeletionTickResult:
    candidate_count: int
    claimed_count: int
    outcome: DeletionTickOutcome


@dataclass(frozen=True)
class RequestResult:
    outcome: RequestOutcome
    collection_slug: str
    collection_id: str | None


# --- the request path -------------------------------------------------------------------------


def request_collection_deletion(
    engine: Engine, collection_slug: str, *, force: bool
) -> RequestResult:
    """EmDash's `SchemaRegistry.deleteCollection(slug, {force})`."""
    validate_identifier(collection_slug, "collection slug")
    force = require_flag(force, "force")
    collection_id = read_collection_id(engine, collection_slug)
    if collection_id is not None and not force and has_live_content(engine, collection_slug):
        raise CollectionHasContentError(collection_slug)
    outcome = delete_activated_collection(
        engine, collection_slug, collection_id=collection_id, force_delete=force
    )
    if outcome is FrontPhaseOutcome.HAS_CONTENT:
        raise CollectionHasContentError(collection_slug)
    if outcome is FrontPhaseOutcome.IN_PROGRESS:
        raise DeletionConflictError(
            f'Collection "{collection_slug}" deletion is already in progress'
        )
    if outcome in (FrontPhaseOutcome.DELETED, FrontPhaseOutcome.ADVANCED):
        return _detached(engine, collection_slug, collection_id, outcome)
    if collection_id is None:
        raise CollectionNotFoundError(collection_slug)
    _delete_legacy_collection(engine, collection_id, collection_slug)
    return RequestResult(RequestOutcome.DELETED, collection_slug, collection_id)


def _detached(
    engine: Engine, collection_slug: str, collection_id: str | None, outcome: FrontPhaseOutcome
) -> RequestResult:
    # A repeated request finds no registry row: report the identity the tombstone holds.
    tombstone = DeletionRepository(engine).find_by_slug(collection_slug)
    identity = tombstone.collection_id if tombstone else collection_id
    if outcome is FrontPhaseOutcome.ADVANCED:
        return RequestResult(RequestOutcome.ACCEPTED, collection_slug, identity)
    return RequestResult(RequestOutcome.DETACHED, collection_slug, identity)


def delete_activated_collection(
    engine: Engine,
    collection_slug: str,
    *,
    collection_id: str | None = None,
    force_delete: bool,
    front_phase_limit: int = REQUEST_FRONT_PHASE_LIMIT,
    claimed: DeletionClaim | None = None,
) -> FrontPhaseOutcome:
    """EmDash's `deleteActivatedMediaUsageCollection`: write (or find) the tombstone, claim it
    in its phase and run front phases up to the limit, then hand it back as pending.

    An exception leaves the lease held and unrecorded: after it expires the background
    processor takes the tombstone over and resumes from its checkpointed phase."""
    bounded_limit(
        front_phase_limit,
        1,
        REQUEST_FRONT_PHASE_LIMIT,
        "Collection deletion front-phase limit must be from 1 to 3",
    )
    validate_identifier(collection_slug, "collection slug")
    force_delete = require_flag(force_delete, "force_delete")
    repository = DeletionRepository(engine)
    deletion = repository.find_by_slug(collection_slug)
    if deletion is not None and collection_id and deletion.collection_id != collection_id:
        raise DeletionIdentityConflict("Collection deletion tombstone identity conflict")
    if deletion is None:
        if claimed is not None:
            # A held claim on a tombstone that no longer exists must not write a new one.
            raise DeletionLeaseLost("Collection deletion lease was lost")
        state = read_activation_state(engine)
        if state is None or state == "expanded":
            return FrontPhaseOutcome.INACTIVE
        if state != "active":
            raise DeletionNotReady(
                "Media usage activation must be active before collection deletion"
            )
        if not collection_id:
            return FrontPhaseOutcome.NOT_FOUND
        _assert_deletion_ready(engine, collection_id, collection_slug)
        deletion = repository.create_tombstone(collection_id, collection_slug, force_delete)
    if not deletion.phase.is_front:
        return FrontPhaseOutcome.DELETED
    claim = claimed or repository.claim(
        deletion.collection_id, deletion.phase, LEASE_DURATION_SECONDS
    )
    if claim is None:
        return FrontPhaseOutcome.IN_PROGRESS
    if claim.collection_id != deletion.collection_id or claim.phase is not deletion.phase:
        raise DeletionIdentityConflict("Collection deletion claim identity conflict")
    return _run_front_phases(engine, repository, claim, front_phase_limit)


def _run_front_phases(
    engine: Engine, repository: DeletionRepository, claim: DeletionClaim, limit: int
) -> FrontPhaseOutcome:
    phase, processed = claim.phase, 0
    while phase.is_front:
        next_phase = _FRONT_PHASES[phase](engine, claim, claim.lease)
        if next_phase is None:
            return FrontPhaseOutcome.HAS_CONTENT
        phase, processed = next_phase, processed + 1
        if phase.is_front and processed >= limit:
            _require(repository.release(claim.lease), "Collection deletion lost its handoff")
            return FrontPhaseOutcome.ADVANCED
    _require(repository.release(claim.lease), "Collection deletion lost its cleanup handoff")
    return FrontPhaseOutcome.DELETED


# --- front phases (shared by the request path, the tick and the op steps) ---------------------


def _fence(engine: Engine, record: DeletionRecord, lease: DeletionLease) -> DeletionPhase | None:
    """Stop capture for the collection (or cancel the tombstone if it still has content)."""
    capture_state = _capture_state(engine, record.collection_id, record.collection_slug)
    if capture_state not in ("active", "deleting"):
        raise DeletionNotReady("Activated collection deletion requires a fenced capture lifecycle")
    if not _triggers_verify(engine, record.collection_id, record.collection_slug):
        raise DeletionNotReady(
            "Activated collection deletion requires the exact capture trigger set"
        )
    repository = DeletionRepository(engine)
    # `deleting` means an earlier owner fenced and crashed before its checkpoint.
    if capture_state == "active":
        outcome = execute_local_deletion_guard(
            engine,
            GuardAction.FENCE,
            record.collection_id,
            record.collection_slug,
            lease.lease_token,
            record.force_delete,
        )
        if outcome is GuardOutcome.HAS_CONTENT:
            _require(
                repository.cancel_fence(lease),
                "Collection deletion lost its fence while preserving content",
            )
            return None
        if outcome is not GuardOutcome.FENCED:
            raise DeletionError("Collection deletion lost its fence")
    _require(
        repository.checkpoint(lease, DeletionPhase.FENCE, DeletionPhase.REGISTRY),
        "Collection deletion lost its fence checkpoint",
    )
    return DeletionPhase.REGISTRY


def _registry(engine: Engine, record: DeletionRecord, lease: DeletionLease) -> DeletionPhase:
    _require(
        DeletionRepository(engine).delete_registry_and_checkpoint(lease, record.collection_slug),
        "Collection deletion lost its registry checkpoint",
    )
    return DeletionPhase.TABLE


def _table(engine: Engine, record: DeletionRecord, lease: DeletionLease) -> DeletionPhase:
    outcome = execute_local_deletion_guard(
        engine, GuardAction.DROP, record.collection_id, record.collection_slug, lease.lease_token
    )
    if outcome is not GuardOutcome.DROPPED:
        raise DeletionError("Collection deletion lost its table fence")
    _require(
        DeletionRepository(engine).checkpoint(lease, DeletionPhase.TABLE, DeletionPhase.WORK),
        "Collection deletion lost its table checkpoint",
    )
    return DeletionPhase.WORK


_FRONT_PHASES: dict[
    DeletionPhase, Callable[[Engine, DeletionRecord, DeletionLease], DeletionPhase | None]
] = {
    DeletionPhase.FENCE: _fence,
    DeletionPhase.REGISTRY: _registry,
    DeletionPhase.TABLE: _table,
}


# --- per-phase steps (one phase or one batch under a held lease; the lease stays held) --------


def claim_due_deletion(engine: Engine, collection_id: str) -> DeletionClaim | None:
    """Claim the tombstone in its current phase for 300 s, if it is due (pending or retry and
    due, or leased with an expired lease); None otherwise. An operator retry makes a failed
    tombstone due again."""
    repository = DeletionRepository(engine)
    record = repository.find(collection_id)
    if record is None:
        return None
    return repository.claim(collection_id, record.phase, LEASE_DURATION_SECONDS)


def renew_deletion_lease(engine: Engine, lease: LeaseHolder) -> str | None:
    """Extend a live lease by 300 s; None when it was lost (stop: another owner may act)."""
    return DeletionRepository(engine).renew_lease(_as_lease(lease), LEASE_DURATION_SECONDS)


def release_deletion_lease(engine: Engine, lease: LeaseHolder) -> bool:
    """Hand the tombstone back as pending and due now; False when the lease was lost."""
    return DeletionRepository(engine).release(_as_lease(lease))


def run_phase_step(engine: Engine, lease: LeaseHolder) -> PhaseStepResult:
    """Run exactly one phase or batch of whatever phase the tombstone is in."""
    record = _held_record(engine, lease)
    return _STEPS[record.phase](engine, record, _as_lease(lease))


def run_front_phase(engine: Engine, lease: LeaseHolder) -> PhaseStepResult:
    """Run the one front phase (fence, registry or table) the tombstone is in."""
    record = _held_record(engine, lease)
    if not record.phase.is_front:
        return PhaseStepResult(PhaseStepOutcome.SKIPPED, record.phase)
    return _front_step(engine, record, _as_lease(lease))


def fence_step(engine: Engine, lease: LeaseHolder) -> PhaseStepResult:
    return _step_in(engine, lease, DeletionPhase.FENCE)


def registry_step(engine: Engine, lease: LeaseHolder) -> PhaseStepResult:
    return _step_in(engine, lease, DeletionPhase.REGISTRY)


def table_step(engine: Engine, lease: LeaseHolder) -> PhaseStepResult:
    return _step_in(engine, lease, DeletionPhase.TABLE)


def delete_work_step(engine: Engine, lease: LeaseHolder) -> PhaseStepResult:
    """One batch of at most 50 work rows; REPEAT while more remain."""
    return _step_in(engine, lease, DeletionPhase.WORK)


def delete_sources_step(engine: Engine, lease: LeaseHolder) -> PhaseStepResult:
    """One batch of at most 50 occurrences of one canonical source (and the source once it is
    empty); REPEAT until no canonical source of the collection remains."""
    return _step_in(engine, lease, DeletionPhase.SOURCES)


def delete_status_step(engine: Engine, lease: LeaseHolder) -> PhaseStepResult:
    """Remove the reconciliation and status rows; refuses (raises) while work or sources remain."""
    return _step_in(engine, lease, DeletionPhase.STATUS)


def finalize_step(engine: Engine, lease: LeaseHolder) -> PhaseStepResult:
    """Delete the tombstone once nothing of the collection is left; this frees the slug."""
    return _step_in(engine, lease, DeletionPhase.FINALIZE)


def record_phase_failure(
    engine: Engine, lease: LeaseHolder, error: BaseException | None = None
) -> DeletionTickOutcome:
    """Record a failed step: retry after `min(900, 30 * 2^attempt_count)` s, or `failed` at the
    fifth consecutive failure; `claim_lost` when the lease is no longer held."""
    lease = _as_lease(lease)
    repository = DeletionRepository(engine)
    record = repository.find(lease.collection_id)
    if not _is_held(record, lease):
        return DeletionTickOutcome.CLAIM_LOST
    terminal = DELETION_RETRY.is_terminal(record.attempt_count)
    delay = DELETION_RETRY.delay_seconds(record.attempt_count)
    if not repository.record_failure(lease, DELETION_FAILED, terminal, delay):
        return DeletionTickOutcome.CLAIM_LOST
    logger.error(
        "Collection deletion of %s failed in phase %s (attempt %d)",
        record.collection_slug,
        record.phase.value,
        record.attempt_count + 1,
        exc_info=error,
    )
    return DeletionTickOutcome.FAILED if terminal else DeletionTickOutcome.RETRY


def _step_in(engine: Engine, lease: LeaseHolder, phase: DeletionPhase) -> PhaseStepResult:
    record = _held_record(engine, lease)
    if record.phase is not phase:
        return PhaseStepResult(PhaseStepOutcome.SKIPPED, record.phase)
    return _STEPS[phase](engine, record, _as_lease(lease))


def _front_step(engine: Engine, record: DeletionRecord, lease: DeletionLease) -> PhaseStepResult:
    next_phase = _FRONT_PHASES[record.phase](engine, record, lease)
    if next_phase is None:
        return PhaseStepResult(PhaseStepOutcome.HAS_CONTENT, None)
    return PhaseStepResult(PhaseStepOutcome.ADVANCED, next_phase)


def _work_step(engine: Engine, _record: DeletionRecord, lease: DeletionLease) -> PhaseStepResult:
    batch = DeletionRepository(engine).delete_work_batch(lease, ROWS_PER_BATCH)
    return _batch_result(DeletionPhase.WORK, batch.phase, batch.deleted)


def _sources_step(engine: Engine, _record: DeletionRecord, lease: DeletionLease) -> PhaseStepResult:
    batch = DeletionRepository(engine).delete_sources_batch(lease, ROWS_PER_BATCH)
    return _batch_result(DeletionPhase.SOURCES, batch.phase, batch.deleted)


def _status_step(engine: Engine, _record: DeletionRecord, lease: DeletionLease) -> PhaseStepResult:
    DeletionRepository(engine).delete_status(lease)
    return PhaseStepResult(PhaseStepOutcome.ADVANCED, DeletionPhase.FINALIZE)


def _finalize_step(
    engine: Engine, _record: DeletionRecord, lease: DeletionLease
) -> PhaseStepResult:
    DeletionRepository(engine).finalize(lease)
    return PhaseStepResult(PhaseStepOutcome.FINALIZED, None)


def _batch_result(phase: DeletionPhase, after: DeletionPhase, deleted: int) -> PhaseStepResult:
    outcome = PhaseStepOutcome.REPEAT if after is phase else PhaseStepOutcome.ADVANCED
    return PhaseStepResult(outcome, after, deleted)


_STEPS: dict[DeletionPhase, Callable[[Engine, DeletionRecord, DeletionLease], PhaseStepResult]] = {
    DeletionPhase.FENCE: _front_step,
    DeletionPhase.REGISTRY: _front_step,
    DeletionPhase.TABLE: _front_step,
    DeletionPhase.WORK: _work_step,
    DeletionPhase.SOURCES: _sources_step,
    DeletionPhase.STATUS: _status_step,
    DeletionPhase.FINALIZE: _finalize_step,
}


# --- the background tick ----------------------------------------------------------------------


def process_due_deletions(engine: Engine) -> DeletionTickResult:
    """EmDash's `processDueMediaUsageCollectionDeletions`: inspect up to 4 due tombstones, claim
    the first that can be claimed, run one phase or batch, then hand it back (or finalize).

    There is no activation check: a tombstone exists only because capture was active, and its
    cleanup must finish whatever the activation row says now."""
    repository = DeletionRepository(engine)
    candidates = repository.find_due(CANDIDATES_PER_TICK)
    if not candidates:
        return DeletionTickResult(0, 0, DeletionTickOutcome.IDLE)
    claim = _claim_first(repository, candidates)
    if claim is None:
        return DeletionTickResult(len(candidates), 0, DeletionTickOutcome.CLAIM_LOST)
    return DeletionTickResult(len(candidates), 1, _process_claimed(engine, repository, claim))


def _claim_first(
    repository: DeletionRepository, candidates: list[DeletionRecord]
) -> DeletionClaim | None:
    for candidate in candidates:
        claim = repository.claim(candidate.collection_id, candidate.phase, LEASE_DURATION_SECONDS)
        if claim is not None:
            return claim
    return None


def _process_claimed(
    engine: Engine, repository: DeletionRepository, claim: DeletionClaim
) -> DeletionTickOutcome:
    try:
        if claim.phase.is_front:
            # Releases (or cancels) the tombstone itself, as EmDash's front-phase call does.
            delete_activated_collection(
                engine,
                claim.collection_slug,
                collection_id=claim.collection_id,
                force_delete=claim.force_delete,
                front_phase_limit=BACKGROUND_FRONT_PHASE_LIMIT,
                claimed=claim,
            )
            return DeletionTickOutcome.PROGRESS
        result = _STEPS[claim.phase](engine, claim, claim.lease)
        if result.outcome is PhaseStepOutcome.FINALIZED:
            return DeletionTickOutcome.FINALIZED
        if not repository.release(claim.lease):
            return DeletionTickOutcome.CLAIM_LOST
        return DeletionTickOutcome.PROGRESS
    except Exception as error:
        return record_phase_failure(engine, claim, error)


# --- the legacy synchronous delete (capture not activated) ------------------------------------


def _delete_legacy_collection(engine: Engine, collection_id: str, collection_slug: str) -> None:
    """Drop the FTS table, the content table, the registry row and fields, the collection's
    sources (by slug) with their occurrences and its status row, in one transaction."""
    content_table_name(collection_slug)  # a bad slug fails before any SQL
    with engine.begin() as connection:
        _require_capture_not_activated(connection)
        if not collection_identity_exists(connection, collection_id, collection_slug):
            raise CollectionNotFoundError(collection_slug)
        delete_collection_synchronously(connection, collection_id, collection_slug)


def _require_capture_not_activated(connection: Connection) -> None:
    """The decision to delete synchronously was read outside this transaction; the share lock
    keeps activation from starting until it commits (as for any other schema change)."""
    if writable_activation_state(connection, share_lock=True) != "expanded":
        raise DeletionConflictError("Media usage capture was activated during the delete; retry")


# --- reads ------------------------------------------------------------------------------------


def has_live_content(engine: Engine, collection_slug: str) -> bool:
    """Trashed rows (deleted_at set) are not content; a missing table has none."""
    table_name = content_table_name(collection_slug)
    with read_transaction(engine) as connection:
        if not connection.dialect.has_table(connection, table_name):
            return False
        return table_has_live_content(connection, table_name)


def _capture_state(engine: Engine, collection_id: str, collection_slug: str) -> str | None:
    with read_transaction(engine) as connection:
        return read_capture_state(connection, collection_id, collection_slug)


def _triggers_verify(engine: Engine, collection_id: str, collection_slug: str) -> bool:
    with read_transaction(engine) as connection:
        return verify_capture_triggers(connection, CaptureIdentity(collection_id, collection_slug))


def _assert_deletion_ready(engine: Engine, collection_id: str, collection_slug: str) -> None:
    """Before a tombstone is written: capture must be active with its exact triggers, so the
    fence can stop every writer."""
    if _capture_state(engine, collection_id, collection_slug) != "active":
        raise DeletionNotReady("Activated collection deletion requires an active capture lifecycle")
    if not _triggers_verify(engine, collection_id, collection_slug):
        raise DeletionNotReady(
            "Activated collection deletion requires the exact capture trigger set"
        )


def _held_record(engine: Engine, lease: LeaseHolder) -> DeletionRecord:
    """The tombstone as its holder sees it. Advisory: every write re-asserts the live lease."""
    lease = _as_lease(lease)
    record = DeletionRepository(engine).find(lease.collection_id)
    if not _is_held(record, lease):
        raise DeletionLeaseLost("Collection deletion lease was lost")
    return record


def _is_held(record: DeletionRecord | None, lease: DeletionLease) -> bool:
    return (
        record is not None
        and record.state is LeaseState.LEASED
        and record.lease_token == lease.lease_token
    )


# --- small helpers ----------------------------------------------------------------------------


def _as_lease(lease: LeaseHolder) -> DeletionLease:
    if isinstance(lease, DeletionClaim):
        return lease.lease
    if isinstance(lease, DeletionLease):
        return lease
    raise TypeError("A collection deletion step needs a DeletionLease or a DeletionClaim")


def _require(held: bool, message: str) -> None:
    if not held:
        raise DeletionLeaseLost(message)


__all__ = [
    "BACKGROUND_FRONT_PHASE_LIMIT",
    "CANDIDATES_PER_TICK",
    "DELETIONS_PER_TICK",
    "DELETION_FAILED",
    "LEASE_DURATION_SECONDS",
    "MAX_QUERIES_PER_TICK",
    "REQUEST_FRONT_PHASE_LIMIT",
    "ROWS_PER_BATCH",
    "DeletionTickOutcome",
    "DeletionTickResult",
    "FrontPhaseOutcome",
    "PhaseStepOutcome",
    "PhaseStepResult",
    "RequestOutcome",
    "RequestResult",
    "claim_due_deletion",
    "delete_activated_collection",
    "delete_sources_step",
    "delete_status_step",
    "delete_work_step",
    "fence_step",
    "finalize_step",
    "process_due_deletions",
    "record_phase_failure",
    "registry_step",
    "release_deletion_lease",
    "renew_deletion_lease",
    "request_collection_deletion",
    "run_front_phase",
    "run_phase_step",
    "table_step",
]
