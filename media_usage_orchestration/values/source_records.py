"""The source rows both write protocols share, as values: the stored row, the projection a
writer publishes, and the identity and fingerprint rules they are judged by. No SQL here, so
`media/` can build and compare them."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from media_usage_orchestration.values.records import optional, record_from_row

GENERATION_WRITE_LEASE_SECONDS = 60 * 60
COMPLETE = "complete"
SOURCE_TYPE_CONTENT = "content"
CANONICAL_IDENTITY_VERSION = 1
REVISION_COLUMN_BY_VARIANT = {"columns": "live_revision_id", "draft_overlay": "draft_revision_id"}
PROJECTION_FINGERPRINT_PREFIX = "media-usage-projection:v1:sha256:"
# EmDash's `isMediaUsageProjectionFingerprint`: only a v1 projection fingerprint proves a no-op.
_PROJECTION_FINGERPRINT = re.compile(re.escape(PROJECTION_FINGERPRINT_PREFIX) + "[a-f0-9]{64}")

# The columns a writer's compare-and-swap re-asserts; the first two are never NULL.
SOURCE_MATCH_COLUMNS = (
    "current_generation",
    "source_completeness",
    "collection_id",
    "updated_at",
    "source_fingerprint",
    "source_updated_at",
    "source_version",
    "identity_version",
    "revision_id",
    "last_attempted_at",
    "last_error_code",
)
NEVER_NULL_MATCH_COLUMNS = frozenset({"current_generation", "source_completeness"})


# --- records ----------------------------------------------------------------------------------


class OccurrenceValues(Protocol):
    def row_values(self) -> dict[str, Any]:
        """Occurrence columns without id, source key, generation and timestamps."""
        ...


class SourceProjection(Protocol):
    """A computed source (`media.sources.ContentSource`): its descriptive columns, fingerprint
    and occurrences. The store only needs these members, not the domain type."""

    source_key: str
    source_type: str
    collection_id: str | None
    collection_slug: str
    identity_version: int | None
    source_fingerprint: str | None
    occurrences: Sequence[OccurrenceValues]

    def row_values(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class SourceRow:
    """One `_emdash_media_usage_sources` row as stored (EmDash's `MediaUsageSource`).

    Fields keep `MediaUsageSource`'s order: admission charges a deletion by the length of that
    record's JSON, whose member order follows it."""

    source_key: str
    source_type: str
    collection_id: str | None
    collection_slug: str | None
    content_id: str | None
    source_variant: str
    locale: str | None
    translation_group: str | None
    content_slug: str | None
    content_title: str | None
    content_status: str | None
    content_scheduled_at: str | None
    content_deleted_at: str | None
    revision_id: str | None
    current_generation: str
    schema_version: int
    source_updated_at: str | None
    source_version: int | None
    source_fingerprint: str | None
    identity_version: int | None
    source_completeness: str
    last_attempted_at: str | None
    last_error_code: str | None
    indexed_at: str
    created_at: str | None
    updated_at: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> SourceRow:
        return record_from_row(
            cls,
            row,
            schema_version=optional(int),
            source_version=optional(int),
            identity_version=optional(int),
        )


@dataclass(frozen=True)
class DeletionMeasurement:
    occurrence_count: int
    occurrence_bytes: int
    exceeds_occurrence_limit: bool


def is_projection_fingerprint(value: object) -> bool:
    """`PROJECTION_FINGERPRINT_PREFIX` and 64 lowercase hex digits."""
    return isinstance(value, str) and _PROJECTION_FINGERPRINT.fullmatch(value) is not None


def projection_is_unchanged(source: SourceProjection, expected: SourceRow) -> bool:
    """The observed row already publishes exactly this projection: a v1 projection
    fingerprint equal to the computed one, complete, without an error."""
    fingerprint = source.source_fingerprint
    return (
        is_projection_fingerprint(fingerprint)
        and expected.source_fingerprint == fingerprint
        and expected.source_completeness == COMPLETE
        and expected.last_error_code is None
    )


def published_values(source: SourceProjection, generation: str, now: str) -> dict[str, Any]:
    """Every column a successful replacement writes (EmDash's `buildSourceRow`)."""
    values = source.row_values()
    values.update(
        current_generation=generation,
        schema_version=values["schema_version"] if values["schema_version"] is not None else 1,
        source_completeness=COMPLETE,
        last_attempted_at=now,
        last_error_code=None,
        indexed_at=now,
        updated_at=now,
    )
    return values


def occurrence_rows(
    source_key: str,
    generation: str,
    items: Sequence[OccurrenceValues],
    now: str,
    ids: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """The rows of `items` under `generation`, with fresh ids (or `ids`, one per item)."""
    if ids is None:
        ids = new_ulids(len(items))
    rows = []
    for occurrence, occurrence_id in zip(items, ids, strict=True):
        row = occurrence.row_values()
        row.update(id=occurrence_id, source_key=source_key, generation=generation, created_at=now)
        row["occurrence_index"] = row["occurrence_index"] or 0
        rows.append(row)
    return rows


# --- identifiers --------------------------------------------------------------------------------

_RANDOM_BITS = 80
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Two digits per lookup: the top digit holds 3 bits, then 12 pairs of 10 bits, then 5 bits.
_DIGIT_PAIRS = tuple(high + low for high in _CROCKFORD for low in _CROCKFORD)
_PAIR_SHIFTS = tuple(range(115, 4, -10))


def new_ulids(count: int) -> list[str]:
    """`count` distinct ULIDs, ascending: the current millisecond and 80 random bits, then
    that value plus one, two, ... (drawn again if it would overflow the random part). One
    block costs one clock read and one `urandom` call, where generating each id apart costs
    a lock, a clock read and a random draw each."""
    if count <= 0:
        return []
    randomness = int.from_bytes(os.urandom(_RANDOM_BITS // 8), "big")
    while randomness + count > 1 << _RANDOM_BITS:
        randomness = int.from_bytes(os.urandom(_RANDOM_BITS // 8), "big")
    first = (time.time_ns() // 1_000_000) << _RANDOM_BITS | randomness
    return [ulid_text(first + offset) for offset in range(count)]


def ulid_text(value: int) -> str:
    """The 26-character Crockford base32 text of a 128-bit ULID value."""
    pairs = "".join([_DIGIT_PAIRS[(value >> shift) & 1023] for shift in _PAIR_SHIFTS])
    return _CROCKFORD[value >> 125] + pairs + _CROCKFORD[value & 31]


__all__ = [
    "CANONICAL_IDENTITY_VERSION",
    "COMPLETE",
    "GENERATION_WRITE_LEASE_SECONDS",
    "NEVER_NULL_MATCH_COLUMNS",
    "PROJECTION_FINGERPRINT_PREFIX",
    "REVISION_COLUMN_BY_VARIANT",
    "SOURCE_MATCH_COLUMNS",
    "SOURCE_TYPE_CONTENT",
    "DeletionMeasurement",
    "OccurrenceValues",
    "SourceProjection",
    "SourceRow",
    "is_projection_fingerprint",
    "new_ulids",
    "occurrence_rows",
    "projection_is_unchanged",
    "published_values",
    "ulid_text",
]
