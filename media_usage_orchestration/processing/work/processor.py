"""Durable per-entry media usage work (EmDash `work-processor.ts`), Dagster-free.

A job is claimed by leasing its exact `work_version`, refreshed, then completed (deleted),
retried with backoff, or failed. Every transition re-asserts (pk, work_version, lease_token,
live lease) in its own statement, so a job re-enqueued during processing is never acknowledged
(`superseded`: the row stays and is redelivered), and a job whose collection was deleted or
replaced is discarded without projecting anything (`obsolete`).

Three drivers share one post-claim step (`process_claimed`): EmDash's bounded tick
(`process_due_work`), the inline path after a content write (`process_work_after_write`), and
a batch path for jobs that claims several rows per statement (`process_due_batch`).

The batch path projects each collection's claimed jobs in bulk (`processing/work/batch_projection.py`):
a fixed number of statements per batch - one read transaction, the guarded writes (statements
of their own, removals in one transaction), one completion statement, one coverage update -
where one by one each job costs about 17; no transaction stays open across the batch's Python
work. It is equivalent to running `process_claimed` for every job:

- Same guards. Every row it writes carries, in the statement that writes it, the guard the
  single-row statement has: a write lease granted only while the registry identity is current;
  a source inserted only if still absent, or updated only while every observed column matches
  (NULL-safely), each under its own live write lease, the current identity and its content row
  still as snapshotted (version, `updated_at`, revision); a source deleted only while it is
  still the observed row, the identity is current and, for an entry whose content is gone, the
  content row stays absent; the registry row share-locked on PostgreSQL (by the guarded write
  itself); a job completed only by its own (pk, version, token) on a live lease. Rows are
  guarded independently, so each lands or not exactly as it would alone.
- Same outcomes. A job is completed in bulk only when everything its refresh would write
  landed (or nothing needed writing): the state a successful `refresh_content_for_work` leaves.
  A refused completion is `superseded`, and the collection records one incremental success
  per batch, after its completions, as the last of one-by-one successes would. Jobs of a
  collection that is not current are not touched in bulk at all.
- The rest goes one by one, through `process_claimed` itself, so its retries, failures, error
  codes and admission stay the only definition of those cases: a collection whose identity is
  not current (`obsolete`), a snapshot error, a refresh that a fresh claim's admission does not
  admit outright, an observed source that is not the entry's canonical row, a value the batch
  would not bind as the single-row statement does, any write of the batch that did not land (a
  lost guard, which one by one is a generation conflict), and a batch whose leases may be past
  half their life (renewed one by one first). A job that lost a bulk write has had nothing of
  it published beyond what a refresh finds unchanged, so `process_claimed` then runs exactly as
  it would have after the competing write.

The only difference is interleaving: one by one, job k completes before job k+1 is refreshed;
in bulk every refresh of a collection precedes its completions. Concurrent writers act between
statements either way, so each result is one a one-by-one run can produce.
"""

from __future__ import annotations

import operator
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, astuple, dataclass, field, replace
from enum import StrEnum

from media_usage_orchestration.processing.loop.retry_policy import WORK_RETRY
from media_usage_orchestration.processing.work.batch_projection import refresh_contents_for_work
from media_usage_orchestration.processing.work.projection import (
    RefreshErrorCode,
    refresh_content_for_work,
)
from media_usage_orchestration.store.core.engine import (
    Engine,
    read_transaction,
    single_statement,
)
from media_usage_orchestration.store.host import status as status_store
from media_usage_orchestration.store.host.activation import capture_active
from media_usage_orchestration.store.host.registry import read_collection_identity_exists
from media_usage_orchestration.store.work.records import WorkRecord
from media_usage_orchestration.store.work.repository import WorkRepository
from media_usage_orchestration.store.work.statements import complete_leases

CANDIDATES_PER_TICK = 4
JOBS_PER_TICK = 1
MAX_TICK_DURATION_SECONDS = 5.0
LEASE_DURATION_SECONDS = 60
ORDINARY_STATEMENTS_PER_JOB = 20

SNAPSHOT_FAILED = "MEDIA_USAGE_SNAPSHOT_FAILED"
GENERATION_CONFLICT = "MEDIA_USAGE_GENERATION_CONFLICT"
RESOURCE_LIMIT = "MEDIA_USAGE_RESOURCE_LIMIT"
PROCESSING_FAILED = "MEDIA_USAGE_PROCESSING_FAILED"

_WORK_ERROR_CODES = {
    RefreshErrorCode.DRAFT_REVISION_NOT_FOUND: SNAPSHOT_FAILED,
    RefreshErrorCode.DRAFT_REVISION_MISMATCH: SNAPSHOT_FAILED,
    RefreshErrorCode.DRAFT_REVISION_INVALID: SNAPSHOT_FAILED,
    RefreshErrorCode.GENERATION_CONFLICT: GENERATION_CONFLICT,
    RefreshErrorCode.RESOURCE_LIMIT: RESOURCE_LIMIT,
}


class WorkOutcome(StrEnum):
    INACTIVE = "inactive"
    NOT_DUE = "not_due"
    CLAIM_LOST = "claim_lost"
    COMPLETED = "completed"
    RETRY = "retry"
    FAILED = "failed"
    SUPERSEDED = "superseded"
    OBSOLETE = "obsolete"

    @property
    def claimed(self) -> bool:
        return self in _CLAIMED_OUTCOMES


_CLAIMED_OUTCOMES = frozenset(
    {
        WorkOutcome.COMPLETED,
        WorkOutcome.RETRY,
        WorkOutcome.FAILED,
        WorkOutcome.SUPERSEDED,
        WorkOutcome.OBSOLETE,
    }
)


@dataclass(frozen=True)
class WorkCounts:
    """What became of the jobs a tick, a batch or a drain handled; `as_dict` names them as run
    metadata and logs do."""

    claimed: int = 0
    completed: int = 0
    retry: int = 0
    failed: int = 0
    superseded: int = 0
    obsolete: int = 0
    claim_lost: int = 0

    @classmethod
    def of(cls, outcomes: Iterable[WorkOutcome]) -> WorkCounts:
        tally = Counter(outcomes)
        return cls(
            claimed=sum(n for outcome, n in tally.items() if outcome.claimed),
            completed=tally[WorkOutcome.COMPLETED],
            retry=tally[WorkOutcome.RETRY],
            failed=tally[WorkOutcome.FAILED],
            superseded=tally[WorkOutcome.SUPERSEDED],
            obsolete=tally[WorkOutcome.OBSOLETE],
            claim_lost=tally[WorkOutcome.CLAIM_LOST],
        )

    def __add__(self, other: WorkCounts) -> WorkCounts:
        return WorkCounts(*map(operator.add, astuple(self), astuple(other)))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class WorkTickResult:
    """One EmDash tick: inspect up to 4 due jobs, process until 1 is claimed or 5 s pass."""

    candidate_count: int = 0
    counts: WorkCounts = WorkCounts()
    duration_ms: int = 0
    admission_closed: bool = False


@dataclass(frozen=True)
class WorkBatchResult:
    """One batch: the rows claimed in one statement and what became of each."""

    inactive: bool = False
    counts: WorkCounts = WorkCounts()
    duration_ms: int = 0
    # (collection id, slug) -> items of that collection completed by this batch
    completed_by_collection: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # (collection id, slug) -> items of that collection this batch failed for good
    failed_by_collection: Mapping[tuple[str, str], int] = field(default_factory=dict)


# --- policy -----------------------------------------------------------------------------------


def work_error_code(refresh_code: RefreshErrorCode | str | None) -> str:
    return _WORK_ERROR_CODES.get(refresh_code, PROCESSING_FAILED)


def is_terminal(error_code: str, attempt_count: int) -> bool:
    """A resource limit will not shrink by retrying; anything else gets five attempts."""
    return error_code == RESOURCE_LIMIT or WORK_RETRY.is_terminal(attempt_count)


def capture_is_active(engine: Engine) -> bool:
    with read_transaction(engine) as connection:
        return capture_active(connection)


# --- one job ----------------------------------------------------------------------------------


def process_candidate(engine: Engine, candidate: WorkRecord) -> WorkOutcome:
    """Claim this exact version of the job, then process it."""
    claimed = WorkRepository(engine).claim_work(
        candidate.collection_id,
        candidate.content_id,
        candidate.work_version,
        LEASE_DURATION_SECONDS,
    )
    if claimed is None or claimed.lease is None:
        return WorkOutcome.CLAIM_LOST
    return process_claimed(engine, claimed)


def process_claimed(
    engine: Engine, claimed: WorkRecord, rng: Callable[[], float] = random.random
) -> WorkOutcome:
    """Everything after a successful claim; each write carries this claim's own lease."""
    repository = WorkRepository(engine)
    lease = claimed.lease
    if lease is None:
        raise ValueError("Only a leased work record can be processed")
    if not _identity_is_current(engine, claimed):
        return _discard(repository, claimed)
    refresh = refresh_content_for_work(
        engine, claimed.collection_id, claimed.collection_slug, claimed.content_id
    )
    if refresh.success:
        if not repository.complete_work(lease):
            return WorkOutcome.SUPERSEDED
        status_store.record_incremental_success(
            engine, claimed.collection_id, claimed.collection_slug
        )
        return WorkOutcome.COMPLETED
    if not _identity_is_current(engine, claimed):
        return _discard(repository, claimed)
    return _record_failure(engine, repository, claimed, work_error_code(refresh.error_code), rng)


def _identity_is_current(engine: Engine, claimed: WorkRecord) -> bool:
    return read_collection_identity_exists(engine, claimed.collection_id, claimed.collection_slug)


def _discard(repository: WorkRepository, claimed: WorkRecord) -> WorkOutcome:
    """The collection was deleted or replaced: the job is acknowledged without projecting."""
    if repository.complete_work(claimed.lease):
        return WorkOutcome.OBSOLETE
    return WorkOutcome.SUPERSEDED


def _record_failure(
    engine: Engine,
    repository: WorkRepository,
    claimed: WorkRecord,
    error_code: str,
    rng: Callable[[], float],
) -> WorkOutcome:
    lease = claimed.lease
    if not is_terminal(error_code, claimed.attempt_count):
        delay = WORK_RETRY.delay_seconds(claimed.attempt_count, rng)
        if repository.retry_work(lease, delay, error_code):
            return WorkOutcome.RETRY
        return WorkOutcome.SUPERSEDED
    if not repository.fail_work(lease, error_code):
        return WorkOutcome.SUPERSEDED
    with single_statement(engine) as connection:
        status_store.record_incremental_failure(
            connection,
            claimed.collection_id,
            claimed.collection_slug,
            claimed.content_id,
            claimed.work_version,
            error_code,
        )
    return WorkOutcome.FAILED


# --- drivers ----------------------------------------------------------------------------------


def process_work_after_write(engine: Engine, collection_slug: str, content_id: str) -> WorkOutcome:
    """The inline path after a content write: the trigger made the job due immediately."""
    if not capture_is_active(engine):
        return WorkOutcome.INACTIVE
    work = WorkRepository(engine).find_work_for_content(collection_slug, content_id)
    if work is None:
        return WorkOutcome.NOT_DUE
    return process_candidate(engine, work)


def process_due_work(engine: Engine, clock: Callable[[], float] = time.monotonic) -> WorkTickResult:
    """EmDash's tick. The wall clock only bounds how long this tick keeps admitting jobs."""
    started = clock()
    if not capture_is_active(engine):
        return WorkTickResult(duration_ms=_elapsed_ms(clock, started))
    candidates = WorkRepository(engine).find_due_work(CANDIDATES_PER_TICK)
    outcomes: list[WorkOutcome] = []
    admission_closed = False
    for candidate in candidates:
        claimed = sum(1 for outcome in outcomes if outcome.claimed)
        if claimed >= JOBS_PER_TICK or clock() - started >= MAX_TICK_DURATION_SECONDS:
            admission_closed = True
            break
        outcomes.append(process_candidate(engine, candidate))
    return WorkTickResult(
        candidate_count=len(candidates),
        counts=WorkCounts.of(outcomes),
        duration_ms=_elapsed_ms(clock, started),
        admission_closed=admission_closed,
    )


def process_due_batch(
    engine: Engine,
    batch_size: int,
    lease_seconds: int = LEASE_DURATION_SECONDS,
    collection_id: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    bulk: bool = True,
) -> WorkBatchResult:
    """Claim up to `batch_size` due jobs in one statement (optionally of one collection) and
    process them under their own leases: each collection's jobs in bulk (see the module
    docstring), what the bulk path defers one by one with `process_claimed`. `bulk=False`
    processes every job one by one, in due order.

    Leases were all taken at claim time, so before a job whose lease may be past half its
    life the lease is renewed (a guarded CAS); a job whose renewal fails is no longer ours and
    is left alone (`claim_lost`). A batch whose leases may be past half their life is
    processed one by one for that reason.
    """
    started = clock()
    repository = WorkRepository(engine)
    claimed = repository.claim_due_batch(
        batch_size, lease_seconds, collection_id, while_capture_active=True
    )
    if claimed is None:
        return WorkBatchResult(inactive=True, duration_ms=_elapsed_ms(clock, started))
    batch = _Batch(engine, repository, lease_seconds, clock, claimed_at=clock())
    outcomes = []
    completed_by_collection: Counter[tuple[str, str]] = Counter()
    failed_by_collection: Counter[tuple[str, str]] = Counter()
    for group in _by_collection(claimed):
        group_outcomes = batch.in_bulk(group) if bulk else batch.one_by_one(group)
        outcomes.extend(group_outcomes)
        identity = (group[0].collection_id, group[0].collection_slug)
        completed_by_collection[identity] += group_outcomes.count(WorkOutcome.COMPLETED)
        failed_by_collection[identity] += group_outcomes.count(WorkOutcome.FAILED)
    return WorkBatchResult(
        # Every claimed row counts, claim-lost ones included (they were claimed by this batch).
        counts=replace(WorkCounts.of(outcomes), claimed=len(claimed)),
        duration_ms=_elapsed_ms(clock, started),
        completed_by_collection={key: n for key, n in completed_by_collection.items() if n},
        failed_by_collection={key: n for key, n in failed_by_collection.items() if n},
    )


def _by_collection(records: Sequence[WorkRecord]) -> list[list[WorkRecord]]:
    """Claimed jobs grouped by the collection identity they were enqueued under, groups and
    jobs in due order."""
    groups: dict[tuple[str, str], list[WorkRecord]] = {}
    for record in records:
        groups.setdefault((record.collection_id, record.collection_slug), []).append(record)
    return list(groups.values())


@dataclass
class _Batch:
    engine: Engine
    repository: WorkRepository
    lease_seconds: int
    clock: Callable[[], float]
    claimed_at: float

    def aged(self) -> bool:
        return self.clock() - self.claimed_at >= self.lease_seconds / 2

    def one_by_one(self, records: Sequence[WorkRecord]) -> list[WorkOutcome]:
        outcomes = []
        for record in records:
            if self.aged() and not _renew(self.repository, record, self.lease_seconds):
                outcomes.append(WorkOutcome.CLAIM_LOST)
            else:
                outcomes.append(process_claimed(self.engine, record))
        return outcomes

    def in_bulk(self, records: Sequence[WorkRecord]) -> list[WorkOutcome]:
        """One collection's jobs: refresh in bulk, complete what was refreshed in one
        statement committed with the refresh's writes, and process what the bulk refresh
        deferred one by one."""
        if self.aged():
            return self.one_by_one(records)
        first = records[0]
        completed: set[tuple[str, str]] = set()

        def complete(connection, refreshed_ids: frozenset[str]) -> None:
            leases = [record.lease for record in records if record.content_id in refreshed_ids]
            completed.update(complete_leases(connection, leases))

        refresh = refresh_contents_for_work(
            self.engine,
            first.collection_id,
            first.collection_slug,
            [record.content_id for record in records],
            complete,
        )
        refreshed = [record for record in records if record.content_id in refresh.refreshed]
        deferred = [record for record in records if record.content_id not in refresh.refreshed]
        return self.succeeded(refreshed, completed) + self.one_by_one(deferred)

    def succeeded(
        self, records: Sequence[WorkRecord], completed: set[tuple[str, str]]
    ) -> list[WorkOutcome]:
        """`process_claimed`'s success branch for every refreshed job at once: the
        collection's incremental success once, when any was completed.

        In a transaction of its own: a capture trigger locks the status row before the work
        row, so a transaction holding completed work rows must not wait for the status row
        (a deadlock on PostgreSQL)."""
        if not records:
            return []
        if completed:
            first = records[0]
            status_store.record_incremental_success(
                self.engine, first.collection_id, first.collection_slug
            )
        return [
            WorkOutcome.COMPLETED
            if (record.collection_id, record.content_id) in completed
            else WorkOutcome.SUPERSEDED
            for record in records
        ]


def _renew(repository: WorkRepository, record: WorkRecord, lease_seconds: int) -> bool:
    return repository.renew_lease(record.lease, lease_seconds) is not None


def _elapsed_ms(clock: Callable[[], float], started: float) -> int:
    return int((clock() - started) * 1000)


__all__ = [
    "CANDIDATES_PER_TICK",
    "JOBS_PER_TICK",
    "LEASE_DURATION_SECONDS",
    "ORDINARY_STATEMENTS_PER_JOB",
    "WorkBatchResult",
    "WorkCounts",
    "WorkOutcome",
    "WorkTickResult",
    "capture_is_active",
    "is_terminal",
    "process_candidate",
    "process_claimed",
    "process_due_batch",
    "process_due_work",
    "process_work_after_write",
    "work_error_code",
]
