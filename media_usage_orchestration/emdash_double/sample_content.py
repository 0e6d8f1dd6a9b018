"""Deterministic content with media references of every shape EmDash stores.

Used by the demo, the benchmark and the end-to-end tests, so all three exercise the same
shapes: object and legacy bare-string images, local and non-local providers, an `external`
reference (skipped), a URL-like id (ignored), portable-text images by `_ref` and by `id`, and
repeater items with and without a mime type. `local_media` names the media ids a piece of
content references, which EmDash's media library holds; `UNUSED_UPLOADS` are uploads nothing
references.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from media_usage_orchestration.emdash_double.cms_writer import FieldSpec, SubField
from media_usage_orchestration.emdash_double.media_library import MediaFile

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


def edited_hero(entry_id: str) -> dict[str, Any]:
    """The new hero image an edit gives entry `entry_id`."""
    return {"id": f"{entry_id}-v2", "provider": "local", "mimeType": "image/webp"}


# --- the media library ------------------------------------------------------------------------

# A legacy bare-string image id, or an image object without a mime type: a JPEG upload.
IMAGE_MIME_DEFAULT = "image/jpeg"
# Uploads no content references (the library's leftovers), with the names they were uploaded as.
UNUSED_UPLOADS: tuple[MediaFile, ...] = tuple(
    MediaFile(f"lib-{index:03d}", mime, filename)
    for index, (mime, filename) in enumerate(
        (
            ("image/jpeg", "team-offsite-2023.jpg"),
            ("image/png", "logo-old.png"),
            ("image/svg+xml", "logo-outline.svg"),
            ("application/pdf", "brand-guidelines-v1.pdf"),
            ("video/mp4", "intro-video-draft.mp4"),
            ("audio/mpeg", "podcast-episode-03.mp3"),
            ("image/webp", "banner-summer-sale.webp"),
            ("application/zip", "press-kit-2022.zip"),
            ("image/jpeg", "IMG_4821.jpg"),
            ("image/jpeg", "IMG_4822.jpg"),
            ("image/gif", "loading-spinner.gif"),
            ("application/pdf", "price-list-2021.pdf"),
            ("image/png", "screenshot-2024-03-11.png"),
            ("text/plain; charset=utf-8", "robots-old.txt"),
            ("image/avif", "hero-homepage-v1.avif"),
        ),
        start=1,
    )
)


def local_media(data: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """(media id, mime type or None) of every local media item `data` references: an entry of
    the sample shape, a draft revision's data or an edit's values. External and other
    providers' assets and URL-like ids are not in EmDash's media library."""
    references: list[Any] = [data.get("hero"), data.get("attachment")]
    references += [block.get("asset") for block in data.get("body") or ()]
    references += [item.get("image") for item in data.get("gallery") or ()]
    found = (_local_reference(reference) for reference in references)
    return [reference for reference in found if reference is not None]


def _local_reference(value: Any) -> tuple[str, str | None] | None:
    if isinstance(value, str):
        return value, IMAGE_MIME_DEFAULT
    if not isinstance(value, Mapping) or value.get("provider", "local") != "local":
        return None
    media_id = value.get("_ref") or value.get("id")
    if not isinstance(media_id, str) or "://" in media_id:
        return None
    return media_id, value.get("mimeType")


def library_files(contents: Iterable[Mapping[str, Any]]) -> list[MediaFile]:
    """One upload per media id the contents reference (the first mime type named for it), in
    the order first referenced."""
    mimes: dict[str, str | None] = {}
    for data in contents:
        for media_id, mime in local_media(data):
            if mimes.get(media_id) is None:
                mimes[media_id] = mime
    return [MediaFile(media_id, mime or IMAGE_MIME_DEFAULT) for media_id, mime in mimes.items()]
