"""The field and projection fingerprints (EmDash `content-fields.ts`, `projection-fingerprint.ts`).

Both are `<prefix><sha256 hex of canonical JSON>`, and EmDash compares them with stored values,
so the payload shapes, defaults and orderings below are EmDash's, key for key. The projection
prefix is defined with the stored source row (`store.source_rows`), whose no-op check
recognises that format.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from media_usage_orchestration.media.canonical import (
    CanonicalText,
    canonical_json,
    sha256_hex,
    utf8_bytes,
    utf16_key,
)
from media_usage_orchestration.media.extraction import MediaOccurrence
from media_usage_orchestration.media.fields import ExtractionField, FieldDiscovery
from media_usage_orchestration.media.sources import CONTENT_SOURCE_SCHEMA_VERSION, ContentSource
from media_usage_orchestration.values.source_records import PROJECTION_FINGERPRINT_PREFIX

FINGERPRINT_VERSION = 1
FIELD_FINGERPRINT_PREFIX = "media-usage-fields:v1:sha256:"


@dataclass(frozen=True)
class Fingerprint:
    value: str
    byte_length: int  # UTF-8 length of the hashed payload; admission counts it as bytes


def field_fingerprint(discovery: FieldDiscovery) -> str:
    """Changes when a media field, a repeater image sub-field or title/name changes."""
    payload = {
        "fingerprintVersion": FINGERPRINT_VERSION,
        "contentSourceSchemaVersion": CONTENT_SOURCE_SCHEMA_VERSION,
        "extractionFields": extraction_schema(discovery.extraction_fields),
        "displayFieldSlugs": sorted(discovery.display_field_slugs, key=utf16_key),
    }
    return _fingerprint(FIELD_FINGERPRINT_PREFIX, payload).value


def projection_fingerprint(
    collection_id: str,
    discovery: FieldDiscovery,
    source: ContentSource,
    occurrences: Iterable[MediaOccurrence],
    *,
    source_completeness: str = "complete",
) -> Fingerprint:
    """The fingerprint of one source's projection (its descriptive columns and occurrences).

    Neither `source_updated_at` nor `source_version` is hashed: an edit that changes no
    projected value keeps the fingerprint, which is what makes a refresh a no-op.
    """
    if not collection_id:
        raise ValueError("Media usage projection fingerprints require a collection identity")
    payload = {
        "collectionId": collection_id,
        "extractionSchema": _extraction_schema_text(discovery.extraction_fields),
        "fingerprintVersion": FINGERPRINT_VERSION,
        "occurrences": _sorted_occurrence_texts(occurrences),
        "source": CanonicalText(canonical_json(_source_payload(source, source_completeness))),
    }
    return _fingerprint(PROJECTION_FINGERPRINT_PREFIX, payload)


def extraction_schema(fields: Sequence[ExtractionField]) -> list[dict[str, Any]]:
    """Fields as hashed: `{slug, type}`, repeaters with `subFields`, sorted by code units
    (the discovery list itself is in `localeCompare` order, which differs for `_`)."""
    entries = []
    for field in fields:
        entry: dict[str, Any] = {"slug": field.slug, "type": field.type}
        if field.type == "repeater":
            sub_fields = [{"slug": sub.slug, "type": sub.type} for sub in field.sub_fields]
            entry["subFields"] = sorted(sub_fields, key=lambda sub: utf16_key(sub["slug"]))
        entries.append(entry)
    return sorted(entries, key=lambda entry: utf16_key(entry["slug"]))


def _source_payload(source: ContentSource, source_completeness: str) -> dict[str, Any]:
    # Keys listed in output order (code units), as `canonical_json` writes them.
    return {
        "collectionSlug": source.collection_slug,
        "contentDeletedAt": source.content_deleted_at,
        "contentId": source.content_id,
        "contentScheduledAt": source.content_scheduled_at,
        "contentSlug": source.content_slug,
        "contentStatus": source.content_status,
        "contentTitle": source.content_title,
        "locale": source.locale,
        "revisionId": source.revision_id,
        "schemaVersion": 1 if source.schema_version is None else source.schema_version,
        "sourceCompleteness": source_completeness,
        "sourceKey": source.source_key,
        "sourceType": source.source_type,
        "sourceVariant": source.source_variant,
        "translationGroup": source.translation_group,
    }


@functools.lru_cache(maxsize=64)
def _extraction_schema_text(fields: tuple[ExtractionField, ...]) -> CanonicalText:
    """The schema part of every projection payload of a collection, serialized once."""
    return CanonicalText(canonical_json(extraction_schema(fields)))


def _sorted_occurrence_texts(occurrences: Iterable[MediaOccurrence]) -> list[CanonicalText]:
    """Sorted by each occurrence's own canonical JSON, compared by code units; that text is
    also what the payload holds, so it is serialized once."""
    texts = [canonical_json(payload) for payload in map(_occurrence_payload, occurrences)]
    texts.sort(key=utf16_key)
    return [CanonicalText(text) for text in texts]


def _occurrence_payload(occurrence: MediaOccurrence) -> dict[str, Any]:
    # Keys listed in output order (code units), as `canonical_json` writes them.
    return {
        "fieldPath": occurrence.field_path,
        "fieldSlug": occurrence.field_slug,
        "mediaId": occurrence.media_id,
        "mediaKind": occurrence.media_kind,
        "mimeType": occurrence.mime_type,
        "occurrenceIndex": occurrence.occurrence_index or 0,
        "provider": occurrence.provider,
        "providerAssetId": occurrence.provider_asset_id,
        "referenceType": occurrence.reference_type,
    }


def _fingerprint(prefix: str, payload: Any) -> Fingerprint:
    text = canonical_json(payload)
    return Fingerprint(f"{prefix}{sha256_hex(text)}", len(utf8_bytes(text)))
