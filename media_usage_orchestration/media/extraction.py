"""Media references in one entry's field values (EmDash `extractor.ts`).

Values arrive already prepared (JSON text columns decoded, see `sources.columns_data`); the
extractor itself never parses strings, so a JSON-looking string is treated as a media id.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from media_usage_orchestration.media.canonical import js_trim
from media_usage_orchestration.media.fields import ExtractionField
from media_usage_orchestration.values.records import record_from_row

IMAGE_FIELD = "image_field"
FILE_FIELD = "file_field"
PORTABLE_TEXT_IMAGE = "portable_text_image"
LOCAL_PROVIDER = "local"
# `extractor.ts` treats "external" as a plain URL reference, not a managed asset.
EXTERNAL_PROVIDER = "external"
# `media/normalize.ts` INTERNAL_MEDIA_PREFIX: a served-file URL, not a media id.
INTERNAL_MEDIA_PREFIX = "/_emdash/api/media/file/"
# `URL_LIKE_RE = /^(?:[a-z][a-z0-9+.-]*:|\/\/)/i`. Spelled with both cases instead of
# IGNORECASE: Python would also fold U+017F and U+212A into the class; JS (non-unicode) does not.
_URL_LIKE_RE = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.\-]*:|//)")

_DOCUMENT_MIMES = frozenset(
    {
        "application/pdf",
        "application/msword",
        "application/rtf",
        "application/vnd.ms-excel",
        "application/vnd.ms-powerpoint",
    }
)
_ARCHIVE_MIMES = frozenset(
    {
        "application/zip",
        "application/gzip",
        "application/x-tar",
        "application/x-7z-compressed",
        "application/x-rar-compressed",
        "application/vnd.rar",
    }
)


@dataclass(frozen=True)
class MediaOccurrence:
    field_slug: str
    field_path: str
    occurrence_index: int
    reference_type: str
    media_id: str | None
    provider: str
    provider_asset_id: str
    media_kind: str | None
    mime_type: str | None

    def row_values(self) -> dict[str, Any]:
        """Column values for `_emdash_media_usage` (without id, generation and timestamps)."""
        # Every field is a scalar: a shallow copy is what `asdict` would return, far cheaper.
        return {name: getattr(self, name) for name in OCCURRENCE_COLUMNS}


# The value columns of an occurrence row (no id, source key, generation or timestamps).
OCCURRENCE_COLUMNS = tuple(MediaOccurrence.__dataclass_fields__)


def occurrences_from_rows(rows: Sequence[Mapping[str, Any]]) -> list[MediaOccurrence]:
    """Occurrences read back from `_emdash_media_usage` rows (extra columns ignored)."""
    return [record_from_row(MediaOccurrence, row) for row in rows]


@dataclass(frozen=True)
class _MediaRef:
    media_id: str | None
    provider: str
    provider_asset_id: str
    media_kind: str | None
    mime_type: str | None


def extract_occurrences(
    fields: Iterable[ExtractionField], data: Mapping[str, Any]
) -> list[MediaOccurrence]:
    """Every media reference in `data`, in field order, exact duplicates removed."""
    collector = _Collector()
    for field in fields:
        value = data.get(field.slug)
        if field.type == "image":
            collector.add_value(field.slug, field.slug, IMAGE_FIELD, value, "image")
        elif field.type == "file":
            collector.add_value(field.slug, field.slug, FILE_FIELD, value, None)
        elif field.type == "repeater":
            _extract_repeater(collector, field, value)
        elif field.type == "portableText":
            _extract_portable_text(collector, field.slug, value)
    return collector.occurrences


class _Collector:
    def __init__(self) -> None:
        self.occurrences: list[MediaOccurrence] = []
        self._seen: set[str] = set()

    def add_value(
        self, slug: str, path: str, reference_type: str, value: Any, fallback_kind: str | None
    ) -> None:
        self.add_ref(slug, path, reference_type, _read_media_ref(value, fallback_kind))

    def add_ref(self, slug: str, path: str, reference_type: str, ref: _MediaRef | None) -> None:
        if ref is None:
            return
        occurrence = MediaOccurrence(
            slug,
            path,
            0,
            reference_type,
            ref.media_id,
            ref.provider,
            ref.provider_asset_id,
            ref.media_kind,
            ref.mime_type,
        )
        key = _dedupe_key(occurrence)
        if key not in self._seen:
            self._seen.add(key)
            self.occurrences.append(occurrence)


def _dedupe_key(occurrence: MediaOccurrence) -> str:
    # EmDash joins the identity with NUL (media kind and mime are not part of it); joining,
    # not a tuple, keeps its collisions for values that themselves contain NUL.
    parts = (
        occurrence.field_slug,
        occurrence.field_path,
        str(occurrence.occurrence_index),
        occurrence.reference_type,
        occurrence.provider,
        occurrence.provider_asset_id,
        occurrence.media_id or "",
    )
    return "\0".join(parts)


def _extract_repeater(collector: _Collector, field: ExtractionField, value: Any) -> None:
    if not _is_array(value):
        return
    for item_index, item in enumerate(value):
        if not isinstance(item, Mapping):
            continue
        for sub_field in field.sub_fields:
            if sub_field.type != "image":
                continue
            path = f"{field.slug}[{item_index}].{sub_field.slug}"
            collector.add_value(field.slug, path, IMAGE_FIELD, item.get(sub_field.slug), "image")


def _extract_portable_text(collector: _Collector, slug: str, value: Any) -> None:
    if not _is_array(value):
        return
    for block_index, block in enumerate(value):
        if not isinstance(block, Mapping) or block.get("_type") != "image":
            continue
        asset = block.get("asset")
        if not isinstance(asset, Mapping):
            continue
        provider = _normalize_provider(asset.get("provider"))
        found = _portable_text_asset_id(asset, provider)
        if found is None:
            continue
        key, asset_id = found
        ref = _build_ref(asset_id, provider, _normalize_mime(asset.get("mimeType")), "image")
        collector.add_ref(slug, f"{slug}[{block_index}].asset.{key}", PORTABLE_TEXT_IMAGE, ref)


def _portable_text_asset_id(asset: Mapping[str, Any], provider: str) -> tuple[str, str] | None:
    """`_ref` wins over `id`; the key becomes the last segment of the field path."""
    normalize = _normalize_local_id if provider == LOCAL_PROVIDER else _normalize_stable_id
    for key in ("_ref", "id"):
        asset_id = normalize(asset.get(key))
        if asset_id:
            return key, asset_id
    return None


def _read_media_ref(value: Any, fallback_kind: str | None) -> _MediaRef | None:
    """A bare string is a legacy local media id; an object is `{id, provider?, mimeType?}`."""
    if isinstance(value, str):
        media_id = _normalize_local_id(value)
        return _build_ref(media_id, LOCAL_PROVIDER, None, fallback_kind) if media_id else None
    if not isinstance(value, Mapping):
        return None
    provider = _normalize_provider(value.get("provider"))
    normalize = _normalize_local_id if provider == LOCAL_PROVIDER else _normalize_stable_id
    media_id = normalize(value.get("id"))
    if not media_id:
        return None
    return _build_ref(media_id, provider, _normalize_mime(value.get("mimeType")), fallback_kind)


def _build_ref(
    asset_id: str, provider: str, mime_type: str | None, fallback_kind: str | None
) -> _MediaRef | None:
    if provider == EXTERNAL_PROVIDER:
        return None
    return _MediaRef(
        media_id=asset_id if provider == LOCAL_PROVIDER else None,
        provider=provider,
        provider_asset_id=asset_id,
        media_kind=media_kind(mime_type) or fallback_kind,
        mime_type=mime_type,
    )


def _normalize_provider(value: Any) -> str:
    provider = js_trim(value) if isinstance(value, str) else ""
    return provider or LOCAL_PROVIDER


def _normalize_local_id(value: Any) -> str | None:
    """Local media ids never contain `/` (a path is a URL or storage key, not an id)."""
    media_id = _normalize_stable_id(value)
    return media_id if media_id and "/" not in media_id else None


def _normalize_stable_id(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    trimmed = js_trim(value)
    if not trimmed or _URL_LIKE_RE.match(trimmed) or trimmed.startswith(INTERNAL_MEDIA_PREFIX):
        return None
    return trimmed


def _normalize_mime(value: Any) -> str | None:
    """`normalizeMime` (`media/mime.ts`): before `;`, trimmed, lowercased; must contain `/`."""
    if not isinstance(value, str):
        return None
    normalized = js_trim(value.split(";", 1)[0]).lower()
    return normalized if "/" in normalized else None


def media_kind(mime_type: str | None) -> str | None:
    """`mediaKindFromMime`: the kind a normalized mime type implies, or None without one."""
    if not mime_type:
        return None
    for prefix, kind in (("image/", "image"), ("video/", "video"), ("audio/", "audio")):
        if mime_type.startswith(prefix):
            return kind
    if mime_type.startswith(("font/", "application/font-")):
        return "font"
    if mime_type.startswith("text/"):
        return "text"
    if mime_type in _DOCUMENT_MIMES or mime_type.startswith(
        "application/vnd.openxmlformats-officedocument."
    ):
        return "document"
    if mime_type in _ARCHIVE_MIMES:
        return "archive"
    return "other"


def _is_array(value: Any) -> bool:
    return isinstance(value, list | tuple)
