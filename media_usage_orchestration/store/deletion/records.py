"""Tombstone rows and input: limits, phases, the guard's actions and outcomes, records read from rows, the operator's page and retry result, and the validation every method applies before any SQL."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Self

from media_usage_orchestration.store.core.clock import (
    validate_duration,
)
from media_usage_orchestration.store.core.leases import (
    LeaseState,
    bounded_limit,
    parse_choice,
    parse_lease_state,
)
from media_usage_orchestration.values.identifiers import (
    require_text,
    validate_identifier,
)
from media_usage_orchestration.values.records import record_from_record, record_from_row

ROWS_PER_BATCH = 50
MAX_PAGE_LIMIT = 100
DEFAULT_OPERATOR_LIMIT = 50
FTS_TABLE_PREFIX = "_emdash_fts_"
FTS_TRIGGER_SUFFIXES = ("insert", "update", "delete")


class DeletionPhase(StrEnum):
    FENCE = "fence"
    REGISTRY = "registry"
    TABLE = "table"
    WORK = "work"
    SOURCES = "sources"
    STATUS = "status"
    FINALIZE = "finalize"

    @property
    def is_front(self) -> bool:
        """Front phases run in the delete request (or one per background tick on resume)."""
        return self in _FRONT_PHASES


_FRONT_PHASES = frozenset({DeletionPhase.FENCE, DeletionPhase.REGISTRY, DeletionPhase.TABLE})


class GuardAction(StrEnum):
    FENCE = "fence"
    DROP = "drop"


class GuardOutcome(StrEnum):
    FENCED = "fenced"
    HAS_CONTENT = "has_content"
    STALE = "stale"
    DROPPED = "dropped"


@dataclass(frozen=True)
class DeletionRecord:
    collection_id: str
    collection_slug: str
    force_delete: bool
    state: LeaseState
    phase: DeletionPhase
    work_cursor: str | None
    source_key: str | None
    occurrence_cursor: str | None
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
class DeletionLease:
    """The identity a step needs to act: which tombstone, under which lease."""

    collection_id: str
    lease_token: str


@dataclass(frozen=True)
class DeletionClaim(DeletionRecord):
    lease_token: str

    @property
    def lease(self) -> DeletionLease:
        return DeletionLease(self.collection_id, self.lease_token)


@dataclass(frozen=True)
class OperatorDeletionItem:
    """What operators may see of a tombstone: never its lease token."""

    collection_id: str
    collection_slug: str
    state: LeaseState
    phase: DeletionPhase
    attempt_count: int
    next_attempt_at: str
    lease_expires_at: str | None
    last_error_code: str | None
    updated_at: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> OperatorDeletionItem:
        return record_from_record(cls, DeletionRecord.from_row(row))


@dataclass(frozen=True)
class DeletionPage:
    items: tuple[OperatorDeletionItem, ...]
    next_cursor: str | None = None


@dataclass(frozen=True)
class BatchResult:
    """The tombstone's position after one back-phase batch."""

    phase: DeletionPhase
    deleted: int
    work_cursor: str | None = None
    source_key: str | None = None
    occurrence_cursor: str | None = None
    source_deleted: bool = False


LeaseHolder = DeletionLease | DeletionClaim


# --- validation -------------------------------------------------------------------------------


def validated_identity(collection_id: object, collection_slug: object) -> tuple[str, str]:
    require_text(collection_id, "Collection deletion requires a collection ID")
    validate_identifier(collection_slug, "collection slug")
    return collection_id, collection_slug  # type: ignore[return-value]


def lease_identity(lease: LeaseHolder) -> DeletionLease:
    collection_id = getattr(lease, "collection_id", None)
    lease_token = getattr(lease, "lease_token", None)
    require_text(collection_id, "Collection deletion requires a collection ID")
    require_text(lease_token, "Collection deletion requires a lease token")
    return DeletionLease(collection_id, lease_token)  # type: ignore[arg-type]


def validated_phase(value: object) -> DeletionPhase:
    return parse_choice(DeletionPhase, value, "collection deletion phase")


_ROW_CONVERTERS = {
    "force_delete": bool,
    "state": functools.partial(parse_lease_state, label="collection deletion"),
    "phase": validated_phase,
}


def validated_lease_seconds(value: int) -> int:
    return validate_duration(value, "Collection deletion lease duration", allow_zero=False)


def validated_batch_size(value: int) -> int:
    return bounded_limit(
        value, 1, ROWS_PER_BATCH, f"Collection deletion batch must be from 1 to {ROWS_PER_BATCH}"
    )
