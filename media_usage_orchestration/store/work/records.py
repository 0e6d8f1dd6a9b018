"""Work rows and input: limits, leases, records read from rows, the operator's page and retry result, and the validation every method applies before any SQL."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Text,
)

from media_usage_orchestration.store.core.clock import (
    validate_duration,
)
from media_usage_orchestration.store.core.json_rows import JsonRows
from media_usage_orchestration.store.core.leases import (
    LeaseState,
    bounded_limit,
    non_negative_whole,
    parse_lease_state,
    positive_whole,
)
from media_usage_orchestration.store.core.schema import (
    work,
)
from media_usage_orchestration.values.identifiers import require_text, validate_error_code
from media_usage_orchestration.values.records import record_from_record, record_from_row

MAX_WORK_SELECTION_LIMIT = 100
OPERATOR_DEFAULT_LIMIT = 50
OPERATOR_MAX_LIMIT = 100
RECONCILIATION_PAGE_LIMIT = 50
RECONCILIATION_PHASES = ("scan", "sources")
PAGE_ROWS = JsonRows.of("page", {"content_id": Text()})

PENDING_VALUE = LeaseState.PENDING.value
_RETRY = LeaseState.RETRY.value
LEASED_VALUE = LeaseState.LEASED.value
DUE_STATES = (LeaseState.PENDING, LeaseState.RETRY, LeaseState.LEASED)
WORK_COLUMNS = tuple(work.c.keys())


# --- records ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkLease:
    """What a claimer must present to complete, retry, fail or renew its work."""

    collection_id: str
    content_id: str
    work_version: int
    lease_token: str


@dataclass(frozen=True)
class WorkRecord:
    collection_id: str
    collection_slug: str
    content_id: str
    change_epoch: int
    work_version: int
    state: LeaseState
    attempt_count: int
    next_attempt_at: str
    lease_token: str | None
    lease_expires_at: str | None
    last_attempted_at: str | None
    last_error_code: str | None
    created_at: str
    updated_at: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> WorkRecord:
        return record_from_row(cls, row, **_ROW_CONVERTERS)

    @property
    def lease(self) -> WorkLease | None:
        """The lease this record carries, when it is a leased row."""
        if self.state is not LeaseState.LEASED or not self.lease_token:
            return None
        return WorkLease(self.collection_id, self.content_id, self.work_version, self.lease_token)

    @property
    def due_at(self) -> str:
        """When the row becomes (or became) claimable: the seed's `dueTimestamp`."""
        if self.state is not LeaseState.LEASED:
            return self.next_attempt_at
        if not self.lease_expires_at:
            raise ValueError("Due leased media usage work must have a lease expiry")
        return self.lease_expires_at


_ROW_CONVERTERS = {
    "change_epoch": int,
    "work_version": int,
    "state": functools.partial(parse_lease_state, label="media usage work"),
    "attempt_count": int,
}


@dataclass(frozen=True)
class OperatorWorkItem:
    """A work row as operators see it: never its version, epoch or lease token."""

    collection_id: str
    collection_slug: str
    content_id: str
    state: LeaseState
    attempt_count: int
    next_attempt_at: str
    lease_expires_at: str | None
    last_attempted_at: str | None
    last_error_code: str | None
    updated_at: str

    @classmethod
    def from_record(cls, record: WorkRecord) -> OperatorWorkItem:
        return record_from_record(cls, record)


@dataclass(frozen=True)
class OperatorPage:
    items: tuple[OperatorWorkItem, ...]
    next_cursor: str | None = None


def is_pending_under(record: WorkRecord | None, collection_slug: str) -> bool:
    return (
        record is not None
        and record.state is LeaseState.PENDING
        and record.collection_slug == collection_slug
    )


def records_of(rows: Iterable[Any]) -> list[WorkRecord]:
    return [WorkRecord.from_row(row._mapping) for row in rows]


def due_order_key(record: WorkRecord) -> tuple[str, str, str, str]:
    """The seed's `compareDueWork` (its `localeCompare` on these ASCII values is code-point order)."""
    return (record.due_at, record.updated_at, record.collection_id, record.content_id)


def operator_order_key(item: OperatorWorkItem) -> tuple[str, str]:
    return (item.updated_at, item.content_id)


# --- validation -------------------------------------------------------------------------------


def validated_identity(collection_id: object, content_id: object) -> tuple[str, str]:
    message = "Media usage work identity must include collection and content IDs"
    return require_text(collection_id, message), require_text(content_id, message)


def validated_work_version(value: int | str) -> int:
    try:
        return positive_whole(value, "Media usage work identity work version")
    except ValueError:
        raise ValueError("Media usage work identity must include a work version") from None


def validated_lease(lease: WorkLease) -> WorkLease:
    if not isinstance(lease, WorkLease):
        raise ValueError("Media usage work lease must be a WorkLease")
    collection_id, content_id = validated_identity(lease.collection_id, lease.content_id)
    version = validated_work_version(lease.work_version)
    token = require_text(lease.lease_token, "Media usage work lease token must not be empty")
    return WorkLease(collection_id, content_id, version, token)


def validated_change_epoch(value: int | str) -> int:
    return non_negative_whole(value, "Media usage work change epoch")


def validated_lease_seconds(value: int) -> int:
    return validate_duration(value, "Media usage work lease duration", allow_zero=False)


def validated_error_code(value: str) -> str:
    return validate_error_code(value, "Media usage work error code")


def due_limit(value: int) -> int:
    return bounded_limit(
        value,
        1,
        MAX_WORK_SELECTION_LIMIT,
        f"Media usage due-work limit must be a whole number from 1 to {MAX_WORK_SELECTION_LIMIT}",
    )


def operator_limit(value: int | None) -> int:
    if value is None:
        return OPERATOR_DEFAULT_LIMIT
    return bounded_limit(
        value,
        1,
        OPERATOR_MAX_LIMIT,
        f"Media usage operator limit must be a whole number from 1 to {OPERATOR_MAX_LIMIT}",
    )


def operator_state(value: LeaseState | str | None) -> LeaseState | None:
    if value is None:
        return None
    try:
        return LeaseState(value)
    except ValueError:
        raise ValueError("Media usage work listing requires a valid state") from None


def page_content_ids(content_ids: Sequence[str]) -> list[str]:
    if isinstance(content_ids, str):
        raise ValueError("Reconciliation enqueue content IDs must be a sequence of IDs")
    unique = list(dict.fromkeys(content_ids))
    if not 1 <= len(unique) <= RECONCILIATION_PAGE_LIMIT:
        raise ValueError(
            f"Reconciliation enqueue requires from 1 to {RECONCILIATION_PAGE_LIMIT} content IDs"
        )
    for content_id in unique:
        require_text(content_id, "Reconciliation enqueue content IDs must not be empty")
    return unique
