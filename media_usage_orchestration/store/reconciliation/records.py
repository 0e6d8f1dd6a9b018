"""The coordinator's rows and input: limits, error codes, phases, records read from rows, and the validation every method applies before any SQL."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Self

from media_usage_orchestration.store.core.leases import (
    LeaseState,
    bounded_limit,
    non_negative_whole,
)
from media_usage_orchestration.values.identifiers import (
    require_text,
)
from media_usage_orchestration.values.records import optional, record_from_row

MAX_CANDIDATES = 100
MAX_PAGE_SIZE = 50
# EmDash's reconciliation lease (spec 6.1).
DEFAULT_LEASE_SECONDS = 60
ENTRY_FAILED_CODE = "MEDIA_USAGE_RECONCILIATION_ENTRY_FAILED"
PROCESSING_FAILED_CODE = "MEDIA_USAGE_PROCESSING_FAILED"
NON_TERMINAL_ATTEMPT_CEILING = 4

IDENTITY_MESSAGE = "Reconciliation requires an exact collection and run token"
LIFECYCLE_MESSAGE = "Invalid media usage reconciliation lifecycle"


class ReconciliationPhase(StrEnum):
    SCAN = "scan"
    SOURCES = "sources"


class WorkBarrierState(StrEnum):
    EMPTY = "empty"
    PENDING = "pending"
    FAILED = "failed"


@dataclass(frozen=True)
class ReconciliationRecord:
    collection_id: str
    collection_slug: str
    run_token: str
    target_epoch: int | None
    field_fingerprint: str | None
    state: LeaseState
    phase: ReconciliationPhase
    scan_cursor: str | None
    scan_upper_id: str | None
    source_cursor: str | None
    source_upper_key: str | None
    attempt_count: int
    next_attempt_at: str
    lease_token: str | None
    lease_expires_at: str | None
    last_error_code: str | None
    created_at: str
    updated_at: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        return record_from_row(cls, row, **_ROW_CONVERTERS)


@dataclass(frozen=True)
class ReconciliationClaim(ReconciliationRecord):
    """A record returned by `claim`: its lease token is the caller's proof of ownership."""

    lease_token: str


@dataclass(frozen=True)
class SourceCandidate:
    source_key: str
    content_id: str | None
    source_variant: str


@dataclass(frozen=True)
class PageCheckpoint:
    """What a page written in one go left on the coordinator (its cursor and lease expiry)
    and how many work rows it inserted or reopened."""

    cursor: str
    lease_expires_at: str
    enqueued: int = 0


@dataclass(frozen=True)
class WorkBarrier:
    state: WorkBarrierState
    error_code: str | None = None


@dataclass(frozen=True)
class Coverage:
    """The parts of a collection's status row that decide whether it can be reconciled."""

    status: str
    capture_state: str | None
    reconciliation_required: int
    cursor: str | None
    change_epoch: int


# --- rows and input ----------------------------------------------------------------------------


def _lifecycle(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        try:
            return parse(value)
        except ValueError:
            raise ValueError(LIFECYCLE_MESSAGE) from None

    return convert


def _attempt_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(LIFECYCLE_MESSAGE)
    return value


# A row in a state, phase or attempt count the lifecycle does not know is refused.
_ROW_CONVERTERS = {
    "state": _lifecycle(LeaseState),
    "phase": _lifecycle(ReconciliationPhase),
    "attempt_count": _attempt_count,
    "target_epoch": optional(int),
}


def require_identity(collection_id: object, run_token: object) -> None:
    require_text(collection_id, IDENTITY_MESSAGE)
    require_text(run_token, IDENTITY_MESSAGE)


def require_claim(claim: ReconciliationRecord) -> None:
    """A claim names its exact coordinator row, collection slug and lease."""
    if not isinstance(claim, ReconciliationRecord):
        raise ValueError("Reconciliation requires a claimed reconciliation record")
    require_identity(claim.collection_id, claim.run_token)
    require_text(claim.collection_slug, "Reconciliation requires an exact collection slug")
    require_text(claim.lease_token, "Reconciliation requires a lease token")


def validated_epoch(value: int | str, label: str = "Reconciliation target epoch") -> int:
    return non_negative_whole(value, label)


def candidate_limit(limit: int) -> int:
    return bounded_limit(
        limit, 1, MAX_CANDIDATES, "Reconciliation candidate limit must be from 1 to 100"
    )


def page_limit(limit: int, kind: str) -> int:
    return bounded_limit(
        limit, 1, MAX_PAGE_SIZE, f"Reconciliation {kind} page limit must be from 1 to 50"
    )


def validated_cursor(value: object, label: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"Reconciliation {label} must be text or None")
    return value or None


def require_lease_identity(collection_id: str, run_token: str, lease_token: str) -> None:
    require_identity(collection_id, run_token)
    require_text(lease_token, "Reconciliation requires a lease token")


def unique_content_ids(content_ids: Iterable[str]) -> list[str]:
    message = "Reconciliation source page has invalid content identity"
    if isinstance(content_ids, str) or not isinstance(content_ids, Iterable):
        raise ValueError(message)
    content_ids = list(content_ids)
    if any(not isinstance(content_id, str) or not content_id for content_id in content_ids):
        raise ValueError(message)
    unique = list(dict.fromkeys(content_ids))
    if len(unique) > MAX_PAGE_SIZE:
        raise ValueError(message)
    return unique
