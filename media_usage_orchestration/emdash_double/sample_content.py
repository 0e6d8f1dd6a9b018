"""Deterministic content with media references of every shape EmDash stores.

Used by the demo, the benchmark and the end-to-end tests, so all three exercise the same
shapes: object and legacy bare-string images, local and non-local providers, an `external`
reference (skipped), a URL-like id (ignored), portable-text images by `_ref` and by `id`, and
repeater items with and without a mime type.
"""

from __future__ import annotations

from typing import Any

from media_usage_orchestration.emdash_double.cms_writer import FieldSpec, SubField

MEDIA_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("title", "string"),
    FieldSpec("hero", "image"),
    FieldSpec("attachment", "file"),
    FieldSpec("body", "portableText"),
    FieldSpec(
        "gallery",
        "repeater",
        sub_fields=(SubField("caption", "string"), SubField("image", "image")),
    ),
)

_MIME_BY_KIND = (
    ("application/pdf", "doc"),
    ("video/mp4", "vid"),
    ("audio/mpeg", "aud"),
    ("application/zip", "zip"),
    ("text/plain; charset=utf-8", "txt"),
)


def _hero(prefix: str, index: int) -> Any:
    if index % 7 == 3:
        return f"{prefix}-img-{index:05d}"  # legacy bare-string media id
    if index % 11 == 5:
        return {"id": f"{prefix}-ext-{index}", "provider": "external"}  # skipped by extraction
    return {"id": f"{prefix}-img-{index:05d}", "provider": "local", "mimeType": "image/jpeg"}


def _attachment(prefix: str, index: int) -> Any:
    if index % 5 == 4:
        return None
    mime, kind = _MIME_BY_KIND[index % len(_MIME_BY_KIND)]
    return {"id": f"{prefix}-{kind}-{index:05d}", "provider": "local", "mimeType": mime}


def _body(prefix: str, index: int) -> list[dict[str, Any]]:
    return [
        {
            "_type": "block",
            "_key": f"b{index}a",
            "style": "normal",
            "markDefs": [],
            "children": [{"_type": "span", "_key": f"s{index}", "text": f"Text {index}"}],
        },
        {
            "_type": "image",
            "_key": f"b{index}b",
            "asset": {
                "_ref": f"{prefix}-pt-{index:05d}",
                "provider": "local",
                "mimeType": "image/png",
            },
        },
        {
            "_type": "image",
            "_key": f"b{index}c",
            "asset": {
                "id": f"cdn-{index % 97}",
                "provider": "cloudinary",
                "mimeType": "image/webp",
            },
        },
        {"_type": "image", "_key": f"b{index}d", "asset": {"id": "https://example.test/x.png"}},
    ]


def _gallery(prefix: str, index: int) -> list[dict[str, Any]]:
    items = [
        {"caption": "first", "image": {"id": f"{prefix}-gal-{index:05d}", "mimeType": "image/gif"}},
        {"caption": "second", "image": {"id": f"{prefix}-gal-{index + 1:05d}"}},
    ]
    return items[: 1 + index % 2]


def sample_entry(prefix: str, index: int) -> dict[str, Any]:
    """Entry `index` of a collection whose ids start with `prefix`."""
    return {
        "id": f"{prefix}-e{index:05d}",
        "slug": f"entry-{index}",
        "status": "published" if index % 2 == 0 else "draft",
        "title": f"{prefix} entry {index}",
        "hero": _hero(prefix, index),
        "attachment": _attachment(prefix, index),
        "body": _body(prefix, index),
        "gallery": _gallery(prefix, index),
    }


def sample_entries(prefix: str, count: int, start: int = 0) -> list[dict[str, Any]]:
    return [sample_entry(prefix, index) for index in range(start, start + count)]


def draft_revision_data(entry: dict[str, Any]) -> dict[str, Any]:
    """A draft revision of `entry` as EmDash stores it: field values plus `_`-prefixed meta
    keys (ignored by the overlay), with a different hero image."""
    fields = {spec.slug: entry.get(spec.slug) for spec in MEDIA_FIELDS}
    fields["hero"] = {"id": f"{entry['id']}-draft", "provider": "local", "mimeType": "image/avif"}
    fields["_slug"] = f"{entry['slug']}-draft"
    return fields
