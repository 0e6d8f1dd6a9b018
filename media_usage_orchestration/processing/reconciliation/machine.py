"""The coordinator's guarded transitions (spec 6.3), shared by EmDash's tick (`tick.py`) and
the graph's steps (`steps.py`).

Every write below is one repository statement that re-asserts the lease, the run token, the
epoch, the phase or the cursor itself; a refused write is reported as an outcome. None of
these hands the lease back after progress: that is the caller's choice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from media_usage_orchestration.media.fields import FieldDiscovery
from media_usage_orchestration.media.fingerprints import field_fingerprint
from media_usage_orchestration.media.sources import CONTENT_SOURCE_SCHEMA_VERSION, SOURCE_VARIANTS
from media_usage_orchestration.processing.reconciliation.model import (
    INVALID_SOURCE,
    LEASE_DURATION_SECONDS,
    PAGE_SIZE,
    WAIT_DELAY_SECONDS,
    ReconciliationOutcome,
    ScanOutcome,
)
from media_usage_orchestration.processing.work.content_reads import read_fields
from media_usage_orchestration.store.core.engine import (
    Connection,
    Engine,
    guarded_writes_together,
)
from media_usage_orchestration.store.reconciliation.records import (
    ReconciliationClaim,
    ReconciliationPhase,
    ReconciliationRecord,
    SourceCandidate,
    WorkBarrierState,
)
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from media_usage_orchestration.store.work.repository import WorkRepository
from media_usage_orchestration.values.records import record_from_record


@dataclass(frozen=True)
class RunFields:
    discovery: FieldDiscovery
    fingerprint: str

    @property
    def extracts(self) -> bool:
        return bool(self.discovery.extraction_fields)


def load_run_fields(engine: Engine, claim: ReconciliationRecord) -> RunFields:
    discovery = read_fields(engine, claim.collection_slug, claim.collection_id)
    return RunFields(discovery, field_fingerprint(discovery))


def current_record(
    repository: ReconciliationRepository, claim: ReconciliationRecord
) -> ReconciliationRecord | None:
    """The coordinator while it still carries this claim's lease token; whether the lease is
    still live is re-checked by every guarded write, as in EmDash."""
    record = repository.find_by_identity(claim.collection_id, claim.run_token)
    if record is None or record.lease_token != claim.lease_token:
        return None
    return record


def as_claim(record: ReconciliationRecord) -> ReconciliationClaim:
    return record_from_record(ReconciliationClaim, record)


def release_lease(
    repository: ReconciliationRepository, claim: ReconciliationRecord, delay: int
) -> bool:
    return repository.release(claim.collection_id, claim.run_token, claim.lease_token, delay)


def release_to_wait(repository: ReconciliationRepository, claim: ReconciliationRecord) -> None:
    release_lease(repository, claim, WAIT_DELAY_SECONDS)


def run_moved(
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
    fields_: RunFields,
) -> bool:
    """A captured write, schema change, operator retry or foreign owner moved the status
    epoch, or the collection's media fields changed since the run pinned them."""
    if current.target_epoch is None or not repository.owns_run(claim, current.target_epoch):
        return True
    return current.field_fingerprint != fields_.fingerprint


def _scan_upper_id(
    repository: ReconciliationRepository, claim: ReconciliationRecord, fields_: RunFields
) -> str | None:
    # Without media fields nothing is scanned, but canonical sources are still walked.
    return repository.find_scan_upper_id(claim) if fields_.extracts else None


def _enqueue(
    engine: Engine | Connection,
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


def begin_run(
    engine: Engine, repository: ReconciliationRepository, claim: ReconciliationRecord
) -> RunFields | None:
    """The first step of a run: take the coverage status, then pin the run's epoch, fields
    and scan bound on the coordinator. None when the run must wait."""
    epoch = repository.begin_run(claim)
    if epoch is None:
        # A manual repair (or another owner) runs coverage, or it is trusted again.
        release_to_wait(repository, claim)
        return None
    fields_ = load_run_fields(engine, claim)
    upper = _scan_upper_id(repository, claim, fields_)
    # Refused only if the lease or the status moved meanwhile; EmDash lets the lease expire.
    if not repository.initialize_scan(claim, epoch, fields_.fingerprint, upper):
        return None
    return fields_


def restart_run(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
    fields_: RunFields | None = None,
) -> ReconciliationOutcome:
    """EmDash's `restartReconciliation` without its final release."""
    if current.target_epoch is None:
        return ReconciliationOutcome.CLAIM_LOST
    fields_ = fields_ or load_run_fields(engine, claim)
    epoch = repository.restart_run(claim, current.target_epoch)
    if epoch is None:
        release_to_wait(repository, claim)
        return ReconciliationOutcome.DEFERRED
    upper = _scan_upper_id(repository, claim, fields_)
    if not repository.restart_scan(claim, current.target_epoch, epoch, fields_.fingerprint, upper):
        return ReconciliationOutcome.CLAIM_LOST
    return ReconciliationOutcome.ADVANCED


def scan_claimed(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
    lease_seconds: int = LEASE_DURATION_SECONDS,
) -> ScanOutcome:
    """EmDash's `processClaimedMediaUsageReconciliationScan` without any release; the page's
    checkpoint renews the lease past its half."""
    if current.phase is not ReconciliationPhase.SCAN:
        return ScanOutcome.DEFERRED
    fields_ = None
    if current.target_epoch is None:
        fields_ = begin_run(engine, repository, claim)
        current = current_record(repository, claim) if fields_ else None
        if current is None:
            return ScanOutcome.DEFERRED
    fields_ = fields_ or load_run_fields(engine, claim)
    return scan_next_page(engine, repository, claim, current, fields_, lease_seconds).outcome


@dataclass(frozen=True)
class Paged:
    """A page's outcome and the coordinator as the page's guarded checkpoint left it (`current`
    unchanged when nothing was checkpointed), so a walk's next page starts from it without
    reading the row again: every write of that page re-asserts lease, run, epoch and cursor."""

    outcome: ScanOutcome | ReconciliationOutcome
    current: ReconciliationRecord


def _checkpointed(current: ReconciliationRecord, expiry: str, **cursor: str) -> Paged:
    # The values the checkpoint statement set (attempts reset, lease renewed past its half).
    after = replace(
        current, attempt_count=0, last_error_code=None, lease_expires_at=expiry, **cursor
    )
    return Paged(ScanOutcome.ADVANCED, after)


def scan_next_page(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
    fields_: RunFields,
    lease_seconds: int,
    *,
    guarded_read: bool = True,
) -> Paged:
    """Enqueue the next scan page after `current.scan_cursor` and checkpoint it, together:
    a refused checkpoint enqueues nothing. When nothing was written, the page read says why:
    an empty page is the scan's end (`exhausted`), anything else a guard that refused
    (`deferred`). Without `guarded_read` that read is not guarded by the claim (a page seen
    after the lease was lost is still `deferred`, and the caller must not take an empty page
    for the scan's end without looking at the row)."""
    if current.field_fingerprint != fields_.fingerprint or current.target_epoch is None:
        return Paged(ScanOutcome.RESTART_REQUIRED, current)
    written = repository.write_scan_page(claim, current, PAGE_SIZE, lease_seconds)
    if written is not None:
        return _checkpointed(current, written.lease_expires_at, scan_cursor=written.cursor)
    if not repository.find_scan_page(current, 1, guarded=guarded_read):
        return Paged(ScanOutcome.EXHAUSTED, current)
    return Paged(ScanOutcome.DEFERRED, current)


def enter_sources_claimed(
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


def source_page_claimed(
    engine: Engine,
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
    fields_: RunFields,
    lease_seconds: int = LEASE_DURATION_SECONDS,
) -> Paged:
    """Walk the next page of canonical sources after `current.source_cursor` and checkpoint it."""
    if fields_.extracts:
        # The usual page: every entry still exists, so only its checkpoint is written.
        clean = repository.checkpoint_clean_source_page(
            claim, current, PAGE_SIZE, SOURCE_VARIANTS, lease_seconds
        )
        if clean is not None:
            return _checkpointed(current, clean.lease_expires_at, source_cursor=clean.cursor)
    page = repository.find_source_page(current, PAGE_SIZE)
    if not page:
        return Paged(ScanOutcome.EXHAUSTED, current)
    if any(_is_invalid_source(source) for source in page):
        return Paged(_fail_run(repository, claim, INVALID_SOURCE), current)
    content_ids = list(dict.fromkeys(source.content_id for source in page))
    # The page's enqueue and checkpoint commit together, as a scan page's do.
    with guarded_writes_together(engine) as connection:
        in_page = ReconciliationRepository(connection)
        # Without media fields every source is stale (its projection must become empty);
        # otherwise the scan already refreshed every existing entry, so only absent ones remain.
        if fields_.extracts:
            content_ids = in_page.find_missing_content_ids(claim.collection_slug, content_ids)
        if content_ids:
            _enqueue(connection, claim, current.target_epoch, "sources", content_ids)
        expiry = in_page.checkpoint_sources(
            claim, current.target_epoch, current.source_cursor, page[-1].source_key, lease_seconds
        )
        if expiry is None:
            connection.rollback()
            return Paged(ReconciliationOutcome.CLAIM_LOST, current)
    return _checkpointed(current, expiry, source_cursor=page[-1].source_key)


def finalize_claimed(
    repository: ReconciliationRepository,
    claim: ReconciliationRecord,
    current: ReconciliationRecord,
    fields_: RunFields,
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
        release_to_wait(repository, claim)
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
    publish_failure(repository, claim)
    return ReconciliationOutcome.FAILED


def publish_failure(repository: ReconciliationRepository, claim: ReconciliationRecord) -> None:
    if repository.finish_failed_coverage(claim.collection_id, claim.run_token):
        return
    # Nobody could publish it: the run never owned coverage, so the row has no target epoch
    # and EmDash would never reopen it. Pinning the current epoch lets the seed's own reset
    # reopen it once that epoch moves (a no-op when the row already has a target).
    repository.pin_stuck_failed_epoch(claim.collection_id, claim.run_token)


def settle_failed(
    repository: ReconciliationRepository, record: ReconciliationRecord
) -> ReconciliationOutcome | None:
    if repository.finish_failed_coverage(record.collection_id, record.run_token):
        return ReconciliationOutcome.FAILED
    if repository.reset_failed_for_new_epoch(record):
        return ReconciliationOutcome.ADVANCED
    return None
