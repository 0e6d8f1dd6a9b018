"""Source keys and the content source record (EmDash `source-key.ts`).

A `ContentSource` is one variant of one entry as the sources table stores it, with its
occurrences and projection fingerprint; `media.snapshots` builds them from content rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from media_usage_orchestration.media.extraction import MediaOccurrence

COLUMNS = "columns"
DRAFT_OVERLAY = "draft_overlay"
SOURCE_VARIANTS = (COLUMNS, DRAFT_OVERLAY)
CONTENT_SOURCE_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ContentSource:
    source_key: str
    source_type: str
    collection_id: str | None
    collection_slug: str
    content_id: str
    source_variant: str
    locale: str | None = None
    translation_group: str | None = None
    content_slug: str | None = None
    content_title: str | None = None
    content_status: str | None = None
    content_scheduled_at: str | None = None
    content_deleted_at: str | None = None
    revision_id: str | None = None
    schema_version: int = CONTENT_SOURCE_SCHEMA_VERSION
    source_updated_at: str | None = None
    source_version: int | float | None = None
    identity_version: int | None = None
    source_fingerprint: str | None = None
    occurrences: tuple[MediaOccurrence, ...] = field(default=(), repr=False)
    projection_byte_length: int = 0

    def row_values(self) -> dict[str, Any]:
        """The descriptive columns of `_emdash_media_usage_sources` (no generation, completeness,
        error or timestamps: the writer owns those)."""
        # Every column is a scalar: a shallow copy is what `asdict` would give, without
        # deep-copying the occurrences it would then drop.
        return {name: getattr(self, name) for name in SOURCE_COLUMNS}


# The descriptive columns of a source, in `ContentSource` order.
SOURCE_COLUMNS = tuple(
    name
    for name in ContentSource.__dataclass_fields__
    if name not in ("occurrences", "projection_byte_length")
)


def is_source_variant(value: object) -> bool:
    return isinstance(value, str) and value in SOURCE_VARIANTS


def source_key(collection_id: str, content_id: str, variant: str) -> str:
    """`content:<collectionId>:<contentId>:<variant>`, the canonical (identity 1) key."""
    if not collection_id:
        raise ValueError("Canonical media usage source keys require a collection identity")
    return f"content:{collection_id}:{content_id}:{_checked_variant(variant)}"


def legacy_source_key(collection_slug: str, content_id: str, variant: str) -> str:
    """`content:<slug>:<contentId>:<variant>`, the key of sources written before 063."""
    return f"content:{collection_slug}:{content_id}:{_checked_variant(variant)}"


def _checked_variant(variant: str) -> str:
    if not is_source_variant(variant):
        raise ValueError(f"Unknown media usage source variant {variant!r}")
    return variant
