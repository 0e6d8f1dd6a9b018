"""Extraction rules; the first tests port EmDash's `usage-extractor.test.ts`."""

from __future__ import annotations

import pytest

from media_usage_orchestration.media.extraction import (
    MediaOccurrence,
    extract_occurrences,
    media_kind,
    occurrences_from_rows,
)
from media_usage_orchestration.media.fields import ExtractionField, SubFieldSpec


def field(slug: str, field_type: str, *image_sub_fields: str, file_sub_fields=()):
    subs = tuple(SubFieldSpec(sub, "image") for sub in image_sub_fields)
    subs += tuple(SubFieldSpec(sub, "file") for sub in file_sub_fields)
    return ExtractionField(slug, field_type, subs)


def occurrence(
    slug: str,
    path: str,
    reference_type: str,
    asset_id: str,
    *,
    provider: str = "local",
    kind: str | None = "image",
    mime: str | None = None,
) -> MediaOccurrence:
    media_id = asset_id if provider == "local" else None
    return MediaOccurrence(slug, path, 0, reference_type, media_id, provider, asset_id, kind, mime)


def test_top_level_image_and_file_fields():
    occurrences = extract_occurrences(
        [field("hero", "image"), field("attachment", "file"), field("title", "string")],
        {
            "hero": {
                "id": "media-hero",
                "provider": "local",
                "mimeType": "Image/JPEG; charset=utf-8",
            },
            "attachment": {"id": "media-file", "provider": "local", "mimeType": "application/pdf"},
            "title": "media-title",
        },
    )
    assert occurrences == [
        occurrence("hero", "hero", "image_field", "media-hero", mime="image/jpeg"),
        occurrence(
            "attachment",
            "attachment",
            "file_field",
            "media-file",
            kind="document",
            mime="application/pdf",
        ),
    ]


def test_legacy_bare_ids_and_skipped_urls_or_internal_routes():
    fields = [
        field(slug, "image")
        for slug in ("external", "protocol", "root", "relative", "internal", "blank")
    ]
    occurrences = extract_occurrences(
        [field("hero", "image"), field("attachment", "file"), *fields],
        {
            "hero": "media-hero",
            "attachment": "media-file",
            "external": "https://example.com/photo.jpg",
            "protocol": "//cdn.example.com/photo.jpg",
            "root": "/images/photo.jpg",
            "relative": "images/photo.jpg",
            "internal": "/_emdash/api/media/file/uploads/photo.jpg",
            "blank": "   ",
        },
    )
    assert occurrences == [
        occurrence("hero", "hero", "image_field", "media-hero"),
        occurrence("attachment", "attachment", "file_field", "media-file", kind=None),
    ]


def test_structured_external_provider_references_have_no_media_id():
    occurrences = extract_occurrences(
        [field("hero", "image"), field("video", "file")],
        {
            "hero": {
                "id": "folder/cf-image-1",
                "provider": "cloudflare-images",
                "mimeType": "image/png",
            },
            "video": {"id": "mux-video-1", "provider": "mux", "mimeType": "video/mp4"},
        },
    )
    assert occurrences == [
        occurrence(
            "hero",
            "hero",
            "image_field",
            "folder/cf-image-1",
            provider="cloudflare-images",
            mime="image/png",
        ),
        occurrence(
            "video",
            "video",
            "file_field",
            "mux-video-1",
            provider="mux",
            kind="video",
            mime="video/mp4",
        ),
    ]


def test_repeater_image_sub_fields_have_stable_paths():
    occurrences = extract_occurrences(
        [field("sections", "repeater", "image")],
        {
            "sections": [
                {"image": {"id": "image-1", "mimeType": "image/webp"}},
                {"image": "image-2"},
            ]
        },
    )
    assert occurrences == [
        occurrence("sections", "sections[0].image", "image_field", "image-1", mime="image/webp"),
        occurrence("sections", "sections[1].image", "image_field", "image-2"),
    ]


def test_repeater_file_sub_fields_are_ignored():
    occurrences = extract_occurrences(
        [field("sections", "repeater", file_sub_fields=("download",))],
        {
            "sections": [
                {"download": {"id": "file-1", "mimeType": "application/zip"}},
                {"download": {"id": "video-1", "provider": "mux", "mimeType": "video/mp4"}},
            ]
        },
    )
    assert occurrences == []


def test_portable_text_image_block_asset_refs():
    occurrences = extract_occurrences(
        [field("body", "portableText")],
        {
            "body": [
                {"_type": "block", "_key": "p1", "children": []},
                {
                    "_type": "image",
                    "_key": "img1",
                    "asset": {
                        "_ref": "local-image",
                        "url": "/_emdash/api/media/file/local-image.jpg",
                    },
                },
                {
                    "_type": "image",
                    "_key": "img2",
                    "asset": {
                        "id": "cf-image",
                        "provider": "cloudflare-images",
                        "mimeType": "image/avif",
                    },
                },
                {"_type": "image", "_key": "img3", "asset": {"url": "https://example.com/cat.jpg"}},
                {"_type": "image", "_key": "img4"},
            ]
        },
    )
    assert occurrences == [
        occurrence("body", "body[1].asset._ref", "portable_text_image", "local-image"),
        occurrence(
            "body",
            "body[2].asset.id",
            "portable_text_image",
            "cf-image",
            provider="cloudflare-images",
            mime="image/avif",
        ),
    ]


def test_url_only_and_malformed_values_are_skipped():
    occurrences = extract_occurrences(
        [
            field("hero", "image"),
            field("src_only", "image"),
            field("external_provider", "image"),
            field("bad_id", "file"),
            field("pt", "portableText"),
        ],
        {
            "hero": {"id": "https://example.com/photo.jpg", "provider": "local"},
            "src_only": {"src": "https://example.com/photo.jpg"},
            "external_provider": {"provider": "external", "id": "", "src": "https://x.test/p.jpg"},
            "bad_id": {"id": 123, "provider": "local"},
            "pt": [{"_type": "image", "asset": {"_ref": "/_emdash/api/media/file/uploads/p.jpg"}}],
        },
    )
    assert occurrences == []


def test_exact_duplicates_are_removed_but_repeated_uses_are_kept():
    occurrences = extract_occurrences(
        [
            field("hero", "image"),
            field("hero", "image"),
            field("sections", "repeater", "image"),
            field("body", "portableText"),
        ],
        {
            "hero": {"id": "shared-media"},
            "sections": [{"image": {"id": "shared-media"}}],
            "body": [{"_type": "image", "asset": {"_ref": "shared-media"}}],
        },
    )
    assert occurrences == [
        occurrence("hero", "hero", "image_field", "shared-media"),
        occurrence("sections", "sections[0].image", "image_field", "shared-media"),
        occurrence("body", "body[0].asset._ref", "portable_text_image", "shared-media"),
    ]


# --- rules beyond the upstream examples ------------------------------------------------------


def test_a_repeated_sub_field_yields_one_occurrence():
    both = extract_occurrences(
        [field("gallery", "repeater", "image", "image")],
        {"gallery": [{"image": {"id": "m", "mimeType": "image/png"}}]},
    )
    assert both == [occurrence("gallery", "gallery[0].image", "image_field", "m", mime="image/png")]


def test_the_duplicate_key_is_joined_with_nul_as_emdash_joins_it():
    # ("a\0b", "c") and ("a", "b\0c") join to the same key, so EmDash keeps only the first.
    occurrences = extract_occurrences(
        [field("body", "portableText")],
        {
            "body": [
                {"_type": "image", "asset": {"id": "c", "provider": "a\0b"}},
                {"_type": "image", "asset": {"id": "b\0c", "provider": "a"}},
            ]
        },
    )
    assert [item.field_path for item in occurrences] == ["body[0].asset.id", "body[1].asset.id"]
    same_path = extract_occurrences(
        [field("hero", "image"), field("hero", "image")],
        {"hero": {"id": "c", "provider": "a\0b"}},
    )
    assert len(same_path) == 1


def test_ids_and_providers_are_trimmed_and_blank_provider_is_local():
    occurrences = extract_occurrences(
        [field("hero", "image"), field("cover", "image")],
        {
            "hero": {"id": "\u00a0 media-1\n", "provider": "  "},
            "cover": {"id": " asset/1 ", "provider": " cloudinary "},
        },
    )
    assert occurrences == [
        occurrence("hero", "hero", "image_field", "media-1"),
        occurrence("cover", "cover", "image_field", "asset/1", provider="cloudinary"),
    ]


def test_non_string_provider_is_local():
    occurrences = extract_occurrences(
        [field("hero", "image")], {"hero": {"id": "m", "provider": 7}}
    )
    assert occurrences == [occurrence("hero", "hero", "image_field", "m")]


@pytest.mark.parametrize(
    "media_id",
    [
        "http://x",
        "HTTPS://x",
        "data:image/png;base64,xx",
        "mailto:someone",
        "a+b.c-d:rest",
        "//host/path",
        "/_emdash/api/media/file/k",
    ],
)
def test_url_like_ids_are_refused_for_every_provider(media_id):
    data = {"hero": {"id": media_id, "provider": "cloudinary"}}
    assert extract_occurrences([field("hero", "image")], data) == []


@pytest.mark.parametrize("media_id", ["1http:x", "\u017fttp:x", "\u212aey:x", "-a:b", "ab"])
def test_ids_that_only_look_like_urls_are_kept(media_id):
    # A scheme starts with an ASCII letter: JS's case-insensitive /[a-z]/ does not fold the
    # long s or Kelvin sign into it (Python's IGNORECASE would).
    data = {"hero": {"id": media_id, "provider": "cloudinary"}}
    assert [
        item.provider_asset_id for item in extract_occurrences([field("hero", "image")], data)
    ] == [media_id]


def test_local_ids_with_a_slash_are_refused_but_other_providers_keep_them():
    fields = [field("hero", "image")]
    assert extract_occurrences(fields, {"hero": {"id": "a/b"}}) == []
    assert extract_occurrences(fields, {"hero": "a/b"}) == []
    kept = extract_occurrences(fields, {"hero": {"id": "a/b", "provider": "mux"}})
    assert [item.provider_asset_id for item in kept] == ["a/b"]


def test_external_provider_is_skipped_even_with_a_valid_id():
    fields = [field("hero", "image"), field("body", "portableText")]
    data = {
        "hero": {"id": "photo-1", "provider": " external "},
        "body": [{"_type": "image", "asset": {"_ref": "photo-2", "provider": "external"}}],
    }
    assert extract_occurrences(fields, data) == []


def test_portable_text_falls_back_from_an_invalid_ref_to_the_id():
    occurrences = extract_occurrences(
        [field("body", "portableText")],
        {"body": [{"_type": "image", "asset": {"_ref": "https://x/y", "id": "media-3"}}]},
    )
    assert occurrences == [occurrence("body", "body[0].asset.id", "portable_text_image", "media-3")]


def test_portable_text_needs_an_image_block_with_an_object_asset():
    body = [
        {"_type": "Image", "asset": {"_ref": "a"}},
        {"_type": "image", "asset": "b"},
        {"_type": "image", "asset": ["c"]},
        "image",
    ]
    assert extract_occurrences([field("body", "portableText")], {"body": body}) == []
    assert extract_occurrences([field("body", "portableText")], {"body": {"_type": "image"}}) == []


def test_repeaters_skip_non_object_items_and_non_array_values():
    fields = [field("gallery", "repeater", "image")]
    value = ["image-0", None, {"image": "image-2"}, ["image-3"]]
    assert [item.field_path for item in extract_occurrences(fields, {"gallery": value})] == [
        "gallery[2].image"
    ]
    assert extract_occurrences(fields, {"gallery": {"image": "x"}}) == []


def test_json_strings_are_not_parsed_by_the_extractor():
    # Column values are decoded before extraction; a string here is an id candidate.
    occurrences = extract_occurrences([field("hero", "image")], {"hero": '{"id":"m-1"}'})
    assert [item.media_id for item in occurrences] == ['{"id":"m-1"}']
    assert extract_occurrences([field("hero", "image")], {"hero": '{"id":"m-1","x":"a/b"}'}) == []


def test_mime_types_are_normalized_or_dropped():
    def mime_of(value):
        found = extract_occurrences([field("f", "file")], {"f": {"id": "m", "mimeType": value}})
        return found[0].mime_type, found[0].media_kind

    assert mime_of(" Video/MP4 ; codecs=avc1") == ("video/mp4", "video")
    assert mime_of("pdf") == (None, None)
    assert mime_of(42) == (None, None)
    assert mime_of("") == (None, None)


def test_image_fields_fall_back_to_image_kind_and_files_to_none():
    fields = [field("hero", "image"), field("doc", "file")]
    found = extract_occurrences(fields, {"hero": {"id": "a", "mimeType": "x"}, "doc": "b"})
    assert [(item.media_kind, item.mime_type) for item in found] == [("image", None), (None, None)]
    other = extract_occurrences(fields, {"hero": {"id": "a", "mimeType": "application/json"}})
    assert other[0].media_kind == "other"


@pytest.mark.parametrize(
    ("mime", "kind"),
    [
        ("image/svg+xml", "image"),
        ("video/webm", "video"),
        ("audio/mpeg", "audio"),
        ("font/woff2", "font"),
        ("application/font-woff", "font"),
        ("text/csv", "text"),
        ("application/pdf", "document"),
        ("application/msword", "document"),
        ("application/rtf", "document"),
        ("application/vnd.ms-excel", "document"),
        ("application/vnd.ms-powerpoint", "document"),
        ("application/vnd.openxmlformats-officedocument.wordprocessingml.document", "document"),
        ("application/zip", "archive"),
        ("application/gzip", "archive"),
        ("application/x-tar", "archive"),
        ("application/x-7z-compressed", "archive"),
        ("application/x-rar-compressed", "archive"),
        ("application/vnd.rar", "archive"),
        ("application/vnd.ms-word", "other"),
        ("application/octet-stream", "other"),
        (None, None),
    ],
)
def test_media_kinds(mime, kind):
    assert media_kind(mime) == kind


def test_missing_values_and_unknown_field_types_produce_nothing():
    fields = [field("hero", "image"), field("title", "string"), field("data", "json")]
    assert extract_occurrences(fields, {"title": "x", "data": {"id": "m"}}) == []


def test_occurrences_round_trip_through_rows():
    found = extract_occurrences([field("hero", "image")], {"hero": "m-1"})
    rows = [{**item.row_values(), "id": "01", "generation": "g"} for item in found]
    assert occurrences_from_rows(rows) == found
