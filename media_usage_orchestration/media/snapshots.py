"""An entry's snapshots, built from rows already read (EmDash `content-snapshots.ts`): the
`columns` source from the content row itself, then the `draft_overlay` source from the row
overlaid with its draft revision when the row names one - or the reason none can be built.

Functions take plain mappings (a content row read by `store.content`, a `revisions` row), so
any reader can feed them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from media_usage_orchestration.media.canonical import js_trim
from media_usage_orchestration.media.extraction import extract_occurrences
from media_usage_orchestration.media.fields import DISPLAY_FIELD_SLUGS, FieldDiscovery
from media_usage_orchestration.media.fingerprints import projection_fingerprint
from media_usage_orchestration.media.sources import (
    COLUMNS,
    CONTENT_SOURCE_SCHEMA_VERSION,
    DRAFT_OVERLAY,
    ContentSource,
    legacy_source_key,
    source_key,
)
from media_usage_orchestration.values.errors import DraftRevisionError
from media_usage_orchestration.values.identifiers import COLLECTION_ID_RESULT, validate_identifier
from media_usage_orchestration.values.json_text import parse_json
from media_usage_orchestration.values.source_records import (
    CANONICAL_IDENTITY_VERSION,
    SOURCE_TYPE_CONTENT,
)

DRAFT_REVISION_NOT_FOUND = "DRAFT_REVISION_NOT_FOUND"
DRAFT_REVISION_INVALID = "DRAFT_REVISION_INVALID"
DRAFT_REVISION_MISMATCH = "DRAFT_REVISION_MISMATCH"

# `Number(string)` for `version` read as text: decimal, or 0x/0o/0b integer literals.
_JS_DECIMAL_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_JS_RADIX_RE = re.compile(r"0([xX][0-9a-fA-F]+|[oO][0-7]+|[bB][01]+)")


class SnapshotError(StrEnum):
    CONTENT_NOT_FOUND = "CONTENT_NOT_FOUND"
    DRAFT_REVISION_NOT_FOUND = "DRAFT_REVISION_NOT_FOUND"
    DRAFT_REVISION_INVALID = "DRAFT_REVISION_INVALID"
    DRAFT_REVISION_MISMATCH = "DRAFT_REVISION_MISMATCH"


@dataclass(frozen=True)
class SnapshotResult:
    """`snapshots` in order (columns, then draft overlay), or `error`. On a draft revision
    error, `attempted_source` is the draft source that could not be built."""

    snapshots: tuple[ContentSource, ...] = ()
    error: SnapshotError | None = None
    attempted_source: ContentSource | None = None

    @property
    def success(self) -> bool:
        return self.error is None


def build_content_snapshots(
    collection_id: str,
    collection_slug: str,
    discovery: FieldDiscovery,
    row: Mapping[str, Any],
    revision: Mapping[str, Any] | None,
) -> SnapshotResult:
    """Snapshots of a content row read by `store.content`, with its draft revision row
    (None when the row has no draft or the revision does not exist)."""
    read_collection_id = row.get(COLLECTION_ID_RESULT)
    if not isinstance(read_collection_id, str) or not read_collection_id:
        raise ValueError("Media usage snapshot query did not return a collection identity")
    columns = build_columns_source(read_collection_id, collection_slug, discovery, row)
    if not row.get("draft_revision_id"):
        return SnapshotResult(snapshots=(columns,))
    try:
        draft = build_draft_overlay_source(
            read_collection_id, collection_slug, discovery, row, revision
        )
    except DraftRevisionError as error:
        return SnapshotResult(
            snapshots=(columns,), error=SnapshotError(error.code), attempted_source=error.source
        )
    return SnapshotResult(snapshots=(columns, draft))


def build_columns_source(
    collection_id: str,
    collection_slug: str,
    discovery: FieldDiscovery,
    row: Mapping[str, Any],
    *,
    canonical: bool = True,
) -> ContentSource:
    """The `columns` source: the entry as stored in `ec_<slug>`, its live revision as id.

    `canonical=False` gives the legacy slug-keyed identity (no collection id or identity
    version in the row); the fingerprint is bound to `collection_id` either way.
    """
    described = _describe(
        collection_id,
        collection_slug,
        row,
        variant=COLUMNS,
        revision_id=_nullable_string(row.get("live_revision_id")),
        display_data=_display_data(row, discovery),
        canonical=canonical,
    )
    return _project(described, collection_id, discovery, columns_data(row, discovery))


def build_draft_overlay_source(
    collection_id: str,
    collection_slug: str,
    discovery: FieldDiscovery,
    row: Mapping[str, Any],
    revision: Mapping[str, Any] | None,
    *,
    canonical: bool = True,
) -> ContentSource:
    """The `draft_overlay` source: row values overlaid with the draft revision's data.

    `revision` is the `revisions` row (`id`, `collection`, `entry_id`, `data`) named by
    `row["draft_revision_id"]`, or None when it does not exist.
    """
    revision_id = _nullable_string(row.get("draft_revision_id"))
    if not revision_id:
        raise ValueError("The content row has no draft revision to overlay")
    display = _display_data(row, discovery)
    attempted = _describe(
        collection_id,
        collection_slug,
        row,
        variant=DRAFT_OVERLAY,
        revision_id=revision_id,
        display_data=display,
        canonical=canonical,
    )
    revision_data = _checked_revision_data(revision, collection_slug, row, attempted)
    overlay = _strip_revision_metadata(revision_data)
    draft_display = {**display, **{slug: overlay[slug] for slug in display if slug in overlay}}
    # `_slug` names the draft's slug; a missing or non-string one falls back to the row's.
    content_slug = _nullable_string(revision_data.get("_slug"))
    described = _describe(
        collection_id,
        collection_slug,
        row,
        variant=DRAFT_OVERLAY,
        revision_id=revision_id,
        display_data=draft_display,
        canonical=canonical,
        content_slug=content_slug,
    )
    # Revision values are used as decoded from the revision JSON, not re-parsed per field.
    data = {**columns_data(row, discovery), **overlay}
    return _project(described, collection_id, discovery, data)


def columns_data(row: Mapping[str, Any], discovery: FieldDiscovery) -> dict[str, Any]:
    """Extraction field values of a content row, with JSON text decoded."""
    return {
        field.slug: deserialize_column_value(row.get(field.slug))
        for field in discovery.extraction_fields
    }


def deserialize_column_value(value: Any) -> Any:
    """A string starting with `{` or `[` is JSON (kept raw if it does not parse); anything
    else, including values a driver already decoded (PostgreSQL `json`), is used as-is."""
    if isinstance(value, str) and value.startswith(("{", "[")):
        try:
            return parse_json(value)
        except ValueError:
            return value
    return value


def content_title(
    display_data: Mapping[str, Any], content_slug: str | None, content_id: str
) -> str | None:
    """First non-blank `title`/`name` string, untrimmed; else the slug (even an empty one);
    else the id."""
    for slug in DISPLAY_FIELD_SLUGS:
        value = display_data.get(slug)
        if isinstance(value, str) and js_trim(value):
            return value
    return content_slug if content_slug is not None else content_id


def _describe(
    collection_id: str,
    collection_slug: str,
    row: Mapping[str, Any],
    *,
    variant: str,
    revision_id: str | None,
    display_data: Mapping[str, Any],
    canonical: bool,
    content_slug: str | None = None,
) -> ContentSource:
    validate_identifier(collection_slug, "collection slug")
    content_id = row.get("id") if isinstance(row.get("id"), str) else ""
    if content_slug is None:
        content_slug = _nullable_string(row.get("slug"))
    if canonical:
        key = source_key(collection_id, content_id, variant)
    else:
        key = legacy_source_key(collection_slug, content_id, variant)
    return ContentSource(
        source_key=key,
        source_type=SOURCE_TYPE_CONTENT,
        collection_id=collection_id if canonical else None,
        collection_slug=collection_slug,
        content_id=content_id,
        source_variant=variant,
        locale=_nullable_string(row.get("locale")),
        translation_group=_nullable_string(row.get("translation_group")),
        content_slug=content_slug,
        content_title=content_title(display_data, content_slug, content_id),
        content_status=_nullable_string(row.get("status")),
        content_scheduled_at=_nullable_string(row.get("scheduled_at")),
        content_deleted_at=_nullable_string(row.get("deleted_at")),
        revision_id=revision_id,
        schema_version=CONTENT_SOURCE_SCHEMA_VERSION,
        source_updated_at=_nullable_string(row.get("updated_at")),
        source_version=_js_number_or_none(row.get("version")),
        identity_version=CANONICAL_IDENTITY_VERSION if canonical else None,
    )


def _project(
    source: ContentSource, collection_id: str, discovery: FieldDiscovery, data: Mapping[str, Any]
) -> ContentSource:
    occurrences = tuple(extract_occurrences(discovery.extraction_fields, data))
    fingerprint = projection_fingerprint(collection_id, discovery, source, occurrences)
    # The described source has no fingerprint or occurrences yet: its columns are all the rest
    # (cheaper than `dataclasses.replace`, which inspects the fields on every call).
    values = source.row_values()
    values["source_fingerprint"] = fingerprint.value
    return ContentSource(
        **values, occurrences=occurrences, projection_byte_length=fingerprint.byte_length
    )


def _display_data(row: Mapping[str, Any], discovery: FieldDiscovery) -> dict[str, Any]:
    # Display values are read raw: a JSON-looking title stays a string.
    return {slug: row.get(slug) for slug in discovery.display_field_slugs}


def _checked_revision_data(
    revision: Mapping[str, Any] | None,
    collection_slug: str,
    row: Mapping[str, Any],
    attempted: ContentSource,
) -> dict[str, Any]:
    if revision is None:
        raise DraftRevisionError(
            DRAFT_REVISION_NOT_FOUND, "The draft revision does not exist", attempted
        )
    data = _revision_data(revision.get("data"))
    if data is None:
        raise DraftRevisionError(
            DRAFT_REVISION_INVALID, "The draft revision data is not a JSON object", attempted
        )
    if revision.get("collection") != collection_slug or revision.get("entry_id") != row.get("id"):
        raise DraftRevisionError(
            DRAFT_REVISION_MISMATCH, "The draft revision belongs to another entry", attempted
        )
    return data


def _revision_data(value: Any) -> dict[str, Any] | None:
    if isinstance(value, str):
        try:
            value = parse_json(value)
        except ValueError:
            return None
    return dict(value) if isinstance(value, Mapping) else None


def _strip_revision_metadata(data: Mapping[str, Any]) -> dict[str, Any]:
    """Keys starting with `_` (`_slug`, `_status`, ...) are revision metadata, not fields."""
    return {key: value for key, value in data.items() if not key.startswith("_")}


def _nullable_string(value: Any) -> str | None:
    """EmDash's `readNullableString`: a non-string value reads as NULL."""
    return value if isinstance(value, str) else None


def _js_number_or_none(value: Any) -> int | float | None:
    """EmDash's `readNumber` for `version`: a finite number, or a numeric string as `Number()`
    reads it (drivers may return integers as text)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return _integral(value) if math.isfinite(value) else None
    if isinstance(value, str) and value:
        return _js_string_to_number(value)
    return None


def _js_string_to_number(text: str) -> int | float | None:
    trimmed = js_trim(text)
    if not trimmed:
        return 0
    radix = _JS_RADIX_RE.fullmatch(trimmed)
    if radix:
        return int(radix.group(1)[1:], {"x": 16, "o": 8, "b": 2}[radix.group(1)[0].lower()])
    if _JS_DECIMAL_RE.fullmatch(trimmed):
        number = float(trimmed)
        return _integral(number) if math.isfinite(number) else None
    return None


def _integral(number: float) -> int | float:
    return int(number) if number.is_integer() else number


__all__ = [
    "SnapshotError",
    "SnapshotResult",
    "build_columns_source",
    "build_content_snapshots",
    "build_draft_overlay_source",
    "columns_data",
    "content_title",
    "deserialize_column_value",
]
