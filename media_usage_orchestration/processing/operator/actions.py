"""What operators do by hand: read each collection's coverage, list and retry work, collection
deletions and reconciliations.

Dagster-free: the operator jobs and the `media-usage` command both call these functions, so
every rule is written once. Each retry is one of the store's guarded operator retries (every
write re-asserts its guard in the same statement, on the database clock, and never takes a
live lease); this module validates the input, resolves slugs, and reports the stores' one
outcome vocabulary (`store.outcomes`): `pending` (changed or not), `lease_active` (with the
expiry, never the token), `conflict` and `not_found` (which includes the work seed's
`collection_not_found`). Bad input raises `OperatorInputError` before anything is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.core.leases import LeaseState, bounded_limit
from media_usage_orchestration.store.deletion.records import DeletionPage, OperatorDeletionItem
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from media_usage_orchestration.store.host.registry import read_collection_id
from media_usage_orchestration.store.reads.coverage import CollectionCoverage, read_all_coverage
from media_usage_orchestration.store.reconciliation.records import (
    ReconciliationPhase,
    ReconciliationRecord,
)
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from media_usage_orchestration.store.work.records import OperatorPage, OperatorWorkItem
from media_usage_orchestration.store.work.repository import WorkRepository
from media_usage_orchestration.values.cursors import decode_cursor
from media_usage_orchestration.values.errors import InvalidCursorError, OperatorInputError
from media_usage_orchestration.values.identifiers import validate_identifier
from media_usage_orchestration.values.outcomes import REPORTED_RETRY_OUTCOMES, OperatorRetryOutcome
from media_usage_orchestration.values.records import record_from_record

DEFAULT_LIST_LIMIT = 50
MAX_LIMIT = 100
MAX_IDENTITY_LENGTH = 2048


@dataclass(frozen=True)
class ReconciliationItem:
    """A reconciliation as operators see it: never its run or lease token."""

    collection_id: str
    collection_slug: str
    state: LeaseState
    phase: ReconciliationPhase
    target_epoch: int | None
    attempt_count: int
    next_attempt_at: str
    lease_expires_at: str | None
    last_error_code: str | None
    updated_at: str


OperatorItem = OperatorWorkItem | OperatorDeletionItem | ReconciliationItem


@dataclass(frozen=True)
class RetryReport:
    """One retry: `changed` only with `pending`, `lease_expires_at` only with `lease_active`.
    `outcome` is always one of `REPORTED_RETRY_OUTCOMES`."""

    outcome: OperatorRetryOutcome
    changed: bool = False
    lease_expires_at: str | None = None
    item: OperatorItem | None = None

    @property
    def succeeded(self) -> bool:
        return self.outcome is OperatorRetryOutcome.PENDING

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"outcome": self.outcome.value, "changed": self.changed}
        if self.lease_expires_at is not None:
            found["lease_expires_at"] = self.lease_expires_at
        found["item"] = dataclasses.asdict(self.item) if self.item is not None else None
        return found


@dataclass(frozen=True)
class BulkRetryReport:
    """Every failed entry of a collection retried (at most one page): counts per outcome."""

    collection_slug: str
    counts: Mapping[str, int]
    changed: int
    more_failed: bool

    @classmethod
    def of(cls, slug: str, reports: Sequence[RetryReport], more_failed: bool) -> BulkRetryReport:
        counts = dict.fromkeys((outcome.value for outcome in REPORTED_RETRY_OUTCOMES), 0)
        for report in reports:
            counts[report.outcome.value] += 1
        changed = sum(1 for report in reports if report.changed)
        return cls(slug, counts, changed, more_failed)

    @property
    def attempted(self) -> int:
        return sum(self.counts.values())

    @property
    def succeeded(self) -> bool:
        return self.counts[OperatorRetryOutcome.PENDING.value] == self.attempted

    @property
    def outcome(self) -> str:
        """One word for the run tag: pending (all reopened), partial, or no_failed_work."""
        if self.attempted == 0:
            return "no_failed_work"
        return OperatorRetryOutcome.PENDING.value if self.succeeded else "partial"

    def as_dict(self) -> dict[str, Any]:
        return {
            "collection": self.collection_slug,
            "outcome": self.outcome,
            "counts": dict(self.counts),
            "changed": self.changed,
            "more_failed": self.more_failed,
        }


# A registry collection's coverage, index and work, as `media-usage status` shows it.
CollectionStatus = CollectionCoverage


# --- input ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _refused_as_input() -> Iterator[None]:
    """A failure of the store's own input checks, reported as an operator input error."""
    try:
        yield
    except ValueError as error:
        raise OperatorInputError(str(error)) from None


def _slug(value: object) -> str:
    with _refused_as_input():
        return validate_identifier(value, "collection slug")


def listing_limit(value: object) -> int:
    with _refused_as_input():
        return bounded_limit(
            value, 1, MAX_LIMIT, f"Limit must be a whole number from 1 to {MAX_LIMIT}"
        )


def _state(value: object) -> LeaseState:
    choices = ", ".join(state.value for state in LeaseState)
    try:
        return LeaseState(value)
    except ValueError:
        raise OperatorInputError(f"Invalid state {value!r}: expected one of {choices}") from None


def _check_cursor(cursor: str | None) -> None:
    if cursor is None:
        return
    try:
        decode_cursor(cursor)
    except InvalidCursorError:
        raise OperatorInputError(
            "Invalid cursor: pass the next cursor of a previous page unchanged", "INVALID_CURSOR"
        ) from None


def _text(value: object, what: str) -> str:
    """An identity as the spec's API takes it: 1 to 2048 characters."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_IDENTITY_LENGTH:
        raise OperatorInputError(f"A {what} is required (1 to {MAX_IDENTITY_LENGTH} characters)")
    return value


def _unknown_collection(slug: str) -> OperatorInputError:
    return OperatorInputError(f"Collection {slug!r} does not exist", "COLLECTION_NOT_FOUND")


def registered_collection_id(engine: Engine, collection: object) -> str:
    """The registry id of a collection slug; an unknown slug is bad input."""
    slug = _slug(collection)
    collection_id = read_collection_id(engine, slug)
    if collection_id is None:
        raise _unknown_collection(slug)
    return collection_id


# --- work -------------------------------------------------------------------------------------


def list_work(
    engine: Engine,
    collection: str,
    *,
    state: LeaseState | str | None = None,
    limit: int = DEFAULT_LIST_LIMIT,
    cursor: str | None = None,
) -> OperatorPage:
    """A page of a collection's work, newest first (spec 9.1)."""
    slug = _slug(collection)
    wanted = _state(state) if state is not None else None
    limit = listing_limit(limit)
    _check_cursor(cursor)
    page = WorkRepository(engine).find_operator_page(slug, state=wanted, limit=limit, cursor=cursor)
    if page is None:
        raise _unknown_collection(slug)
    return page


def retry_work_item(engine: Engine, collection: str, content_id: str) -> RetryReport:
    """Reopen (or create) one entry's work at a freshly invalidated coverage epoch."""
    content_id = _text(content_id, "content ID")
    collection_id = registered_collection_id(engine, collection)
    return _retry_work(WorkRepository(engine), collection_id, content_id)


def retry_entry_work(engine: Engine, collection_id: str, content_id: str) -> RetryReport:
    """`retry_work_item` for a collection named by its exact registry id (a caller that read
    the id holds it, and a collection replaced under the same slug since is not this one)."""
    return _retry_work(WorkRepository(engine), collection_id, _text(content_id, "content ID"))


def _retry_work(repository: WorkRepository, collection_id: str, content_id: str) -> RetryReport:
    result = repository.retry_operator_work(collection_id, content_id)
    return RetryReport(result.outcome.reported, result.changed, result.lease_expires_at, result.row)


def retry_failed_work(
    engine: Engine, collection: str, *, limit: int = MAX_LIMIT
) -> BulkRetryReport:
    """Retry the collection's failed work, at most `limit` entries (the newest failures);
    `more_failed` says another run has more to retry."""
    slug = _slug(collection)
    limit = listing_limit(limit)
    repository = WorkRepository(engine)
    page = repository.find_operator_page(slug, state=LeaseState.FAILED, limit=limit)
    if page is None:
        raise _unknown_collection(slug)
    reports = [_retry_work(repository, item.collection_id, item.content_id) for item in page.items]
    return BulkRetryReport.of(slug, reports, more_failed=page.next_cursor is not None)


# --- collection deletions ---------------------------------------------------------------------


def list_deletions(
    engine: Engine,
    *,
    state: LeaseState | str = LeaseState.FAILED,
    limit: int = DEFAULT_LIST_LIMIT,
    cursor: str | None = None,
) -> DeletionPage:
    """A page of deletion tombstones in one state (failed by default, as in the spec)."""
    wanted = _state(state)
    limit = listing_limit(limit)
    _check_cursor(cursor)
    return DeletionRepository(engine).find_operator_page(wanted, limit, cursor)


def retry_deletion(
    engine: Engine, *, collection_id: str | None = None, collection: str | None = None
) -> RetryReport:
    """Reopen a failed, backing-off or abandoned tombstone in its phase (spec 9.3), named by
    exactly one of its collection id or its slug (the tombstone keeps the slug after the
    registry row is gone)."""
    if (collection_id is None) == (collection is None):
        raise OperatorInputError("Name the deletion by exactly one of collection id or slug")
    repository = DeletionRepository(engine)
    if collection is not None:
        record = repository.find_by_slug(_slug(collection))
        if record is None:
            return RetryReport(OperatorRetryOutcome.NOT_FOUND)
        collection_id = record.collection_id
    result = repository.retry_operator_deletion(_text(collection_id, "collection ID"))
    return RetryReport(result.outcome.reported, result.changed, result.lease_expires_at, result.row)


# --- reconciliations --------------------------------------------------------------------------


def _reconciliation_item(record: ReconciliationRecord) -> ReconciliationItem:
    return record_from_record(ReconciliationItem, record)


def list_reconciliations(engine: Engine) -> tuple[ReconciliationItem, ...]:
    """Every collection's reconciliation (at most one each), by slug."""
    records = ReconciliationRepository(engine).find_all()
    return tuple(_reconciliation_item(record) for record in records)


def retry_reconciliation(engine: Engine, collection: str) -> RetryReport:
    """Reopen a collection's failed, retrying or abandoned (lease expired) reconciliation as a
    fresh scan; a pending one is already queued (conflict), a live lease is never taken."""
    collection_id = registered_collection_id(engine, collection)
    result = ReconciliationRepository(engine).retry_failed_by_operator(collection_id)
    item = _reconciliation_item(result.row) if result.row is not None else None
    return RetryReport(result.outcome.reported, result.changed, result.lease_expires_at, item)


# --- coverage ---------------------------------------------------------------------------------


def collection_statuses(engine: Engine) -> tuple[CollectionStatus, ...]:
    """Every registry collection with its coverage row, index and work counts, by slug."""
    return read_all_coverage(engine)


__all__ = [
    "DEFAULT_LIST_LIMIT",
    "MAX_LIMIT",
    "BulkRetryReport",
    "CollectionStatus",
    "ReconciliationItem",
    "RetryReport",
    "collection_statuses",
    "list_deletions",
    "list_reconciliations",
    "list_work",
    "registered_collection_id",
    "retry_deletion",
    "retry_entry_work",
    "retry_failed_work",
    "retry_reconciliation",
    "retry_work_item",
]
