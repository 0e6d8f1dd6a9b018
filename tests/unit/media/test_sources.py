"""Source keys (port of EmDash's `usage-source-key.test.ts`) and source rows
(`content-snapshots.ts`: columns source, draft overlay, title and data preparation)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from media_usage_orchestration.media.extraction import MediaOccurrence
from media_usage_orchestration.media.fields import ExtractionField, FieldDiscovery, SubFieldSpec
from media_usage_orchestration.media.fingerprints import projection_fingerprint
from media_usage_orchestration.media.snapshots import (
    build_columns_source,
    build_draft_overlay_source,
    columns_data,
    content_title,
    deserialize_column_value,
)
from media_usage_orchestration.media.sources import (
    SOURCE_VARIANTS,
    ContentSource,
    is_source_variant,
    legacy_source_key,
    source_key,
)
from media_usage_orchestration.values.errors import DraftRevisionError, InvalidIdentifierError

COLLECTION_ID = "01JCOLLECTION0000000000000"
DISCOVERY = FieldDiscovery(
    (
        ExtractionField("body", "portableText"),
        ExtractionField("gallery", "repeater", (SubFieldSpec("image", "image"),)),
        ExtractionField("hero", "image"),
    ),
    ("title",),
)


def content_row(**values) -> dict:
    row = {
        "id": "entry-1",
        "slug": "first-entry",
        "status": "published",
        "created_at": "2026-01-01T00:00:00.000Z",
        "updated_at": "2026-01-02T00:00:00.000Z",
        "published_at": None,
        "scheduled_at": None,
        "deleted_at": None,
        "version": 3,
        "live_revision_id": "rev-live",
        "draft_revision_id": None,
        "locale": "en",
        "translation_group": "tg-1",
        "title": "First entry",
        "hero": '{"id":"hero-1","mimeType":"image/jpeg"}',
        "gallery": None,
        "body": None,
    }
    row.update(values)
    return row


def occurrence(slug, path, asset_id, reference_type="image_field", mime=None):
    return MediaOccurrence(
        slug, path, 0, reference_type, asset_id, "local", asset_id, "image", mime
    )


# --- source keys -----------------------------------------------------------------------------


def test_source_keys_use_the_content_namespace_and_variant():
    assert legacy_source_key("posts", "entry1", "columns") == "content:posts:entry1:columns"
    assert (
        legacy_source_key("posts", "entry1", "draft_overlay")
        == "content:posts:entry1:draft_overlay"
    )
    assert source_key("01ABC", "entry1", "columns") == "content:01ABC:entry1:columns"


def test_publish_states_are_not_source_variants():
    assert SOURCE_VARIANTS == ("columns", "draft_overlay")
    assert is_source_variant("columns") and is_source_variant("draft_overlay")
    assert not is_source_variant("live") and not is_source_variant("draft")
    with pytest.raises(ValueError):
        source_key("01ABC", "entry1", "live")


def test_canonical_source_keys_require_a_collection_id():
    with pytest.raises(ValueError, match="collection identity"):
        source_key("", "entry1", "columns")


# --- columns source --------------------------------------------------------------------------


def test_columns_source_carries_every_descriptive_column():
    source = build_columns_source(COLLECTION_ID, "posts", DISCOVERY, content_row())
    hero = occurrence("hero", "hero", "hero-1", mime="image/jpeg")
    expected = ContentSource(
        source_key=f"content:{COLLECTION_ID}:entry-1:columns",
        source_type="content",
        collection_id=COLLECTION_ID,
        collection_slug="posts",
        content_id="entry-1",
        source_variant="columns",
        locale="en",
        translation_group="tg-1",
        content_slug="first-entry",
        content_title="First entry",
        content_status="published",
        content_scheduled_at=None,
        content_deleted_at=None,
        revision_id="rev-live",
        schema_version=1,
        source_updated_at="2026-01-02T00:00:00.000Z",
        source_version=3,
        identity_version=1,
    )
    fingerprint = projection_fingerprint(COLLECTION_ID, DISCOVERY, expected, [hero])
    assert source == replace(
        expected,
        source_fingerprint=fingerprint.value,
        occurrences=(hero,),
        projection_byte_length=fingerprint.byte_length,
    )
    assert set(source.row_values()) == {
        "source_key",
        "source_type",
        "collection_id",
        "collection_slug",
        "content_id",
        "source_variant",
        "locale",
        "translation_group",
        "content_slug",
        "content_title",
        "content_status",
        "content_scheduled_at",
        "content_deleted_at",
        "revision_id",
        "schema_version",
        "source_updated_at",
        "source_version",
        "identity_version",
        "source_fingerprint",
    }


def test_trashed_and_scheduled_entries_keep_their_timestamps():
    row = content_row(deleted_at="2026-02-01", scheduled_at="2026-03-01", status="scheduled")
    source = build_columns_source(COLLECTION_ID, "posts", DISCOVERY, row)
    assert (source.content_deleted_at, source.content_scheduled_at, source.content_status) == (
        "2026-02-01",
        "2026-03-01",
        "scheduled",
    )


def test_legacy_columns_source_is_keyed_by_slug_without_identity():
    canonical = build_columns_source(COLLECTION_ID, "posts", DISCOVERY, content_row())
    legacy = build_columns_source(COLLECTION_ID, "posts", DISCOVERY, content_row(), canonical=False)
    assert legacy.source_key == "content:posts:entry-1:columns"
    assert (legacy.collection_id, legacy.identity_version) == (None, None)
    assert legacy.source_fingerprint != canonical.source_fingerprint


def test_non_string_columns_read_as_null_and_a_missing_id_as_empty():
    row = content_row(locale=5, translation_group=b"x", status=None, updated_at=1, id=None)
    source = build_columns_source(COLLECTION_ID, "posts", DISCOVERY, row)
    assert (source.locale, source.translation_group, source.content_status) == (None, None, None)
    assert source.source_updated_at is None
    assert source.content_id == ""
    assert source.source_key == f"content:{COLLECTION_ID}::columns"


@pytest.mark.parametrize(
    ("version", "expected"),
    [(4, 4), (2.0, 2), (2.5, 2.5), ("7", 7), (" 0x10 ", 16), ("", None), ("x", None), (True, None)],
)
def test_source_version_reads_numbers_like_emdash(version, expected):
    source = build_columns_source(COLLECTION_ID, "posts", DISCOVERY, content_row(version=version))
    assert source.source_version == expected


def test_the_collection_slug_is_validated():
    with pytest.raises(InvalidIdentifierError):
        build_columns_source(COLLECTION_ID, "Posts", DISCOVERY, content_row())


# --- titles and data -------------------------------------------------------------------------


def test_content_title_is_the_first_non_blank_title_or_name_untrimmed():
    assert content_title({"title": "  A  ", "name": "B"}, "slug", "id") == "  A  "
    assert content_title({"title": " \u3000 ", "name": "B"}, "slug", "id") == "B"
    assert content_title({"title": 3, "name": None}, "slug", "id") == "slug"
    assert content_title({}, None, "id") == "id"
    # Only a missing slug falls through to the id; an empty one is kept.
    assert content_title({}, "", "id") == ""


def test_display_values_are_not_json_decoded():
    discovery = FieldDiscovery((), ("title", "name"))
    row = content_row(title="   ", name='{"x":1}')
    assert build_columns_source(COLLECTION_ID, "posts", discovery, row).content_title == '{"x":1}'


def test_columns_data_decodes_json_text_and_keeps_the_rest():
    row = content_row(
        hero="[not json",
        body='[{"_type":"image","asset":{"_ref":"pt-1"}}]',
        gallery=[{"image": "g-1"}],
    )
    assert columns_data(row, DISCOVERY) == {
        "body": [{"_type": "image", "asset": {"_ref": "pt-1"}}],
        "gallery": [{"image": "g-1"}],
        "hero": "[not json",
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('{"id":"m"}', {"id": "m"}),
        ("[1,2]", [1, 2]),
        (' {"id":"m"}', ' {"id":"m"}'),
        ("{NaN}", "{NaN}"),
        ("[NaN]", "[NaN]"),
        ("media-1", "media-1"),
        ({"id": "m"}, {"id": "m"}),
        (None, None),
        (5, 5),
    ],
)
def test_deserialize_column_value(value, expected):
    assert deserialize_column_value(value) == expected


def test_already_decoded_json_columns_give_the_same_source():
    text_row = content_row(gallery='[{"image":{"id":"g-1"}}]')
    decoded_row = content_row(gallery=[{"image": {"id": "g-1"}}])
    text_source = build_columns_source(COLLECTION_ID, "posts", DISCOVERY, text_row)
    assert build_columns_source(COLLECTION_ID, "posts", DISCOVERY, decoded_row) == text_source
    assert [item.field_path for item in text_source.occurrences] == ["gallery[0].image", "hero"]


# --- draft overlay ---------------------------------------------------------------------------


def revision(data, **values) -> dict:
    row = {"id": "rev-draft", "collection": "posts", "entry_id": "entry-1", "data": data}
    row.update(values)
    return row


def draft_row(**values) -> dict:
    return content_row(draft_revision_id="rev-draft", **values)


def test_draft_overlay_merges_revision_data_over_the_columns():
    data = {
        "_slug": "draft-slug",
        "_status": "draft",
        "title": "Draft title",
        "hero": {"id": "hero-2", "mimeType": "image/png"},
        "body": [{"_type": "image", "asset": {"_ref": "pt-9"}}],
    }
    source = build_draft_overlay_source(
        COLLECTION_ID, "posts", DISCOVERY, draft_row(), revision(json.dumps(data))
    )
    assert source.source_key == f"content:{COLLECTION_ID}:entry-1:draft_overlay"
    assert source.source_variant == "draft_overlay"
    assert source.revision_id == "rev-draft"
    assert (source.content_slug, source.content_title) == ("draft-slug", "Draft title")
    assert source.occurrences == (
        occurrence("body", "body[0].asset._ref", "pt-9", "portable_text_image"),
        occurrence("hero", "hero", "hero-2", mime="image/png"),
    )
    columns = build_columns_source(COLLECTION_ID, "posts", DISCOVERY, draft_row())
    assert columns.source_fingerprint != source.source_fingerprint
    assert (columns.source_version, columns.source_updated_at) == (
        source.source_version,
        source.source_updated_at,
    )


def test_draft_overlay_without_changes_keeps_column_values_and_slug():
    source = build_draft_overlay_source(
        COLLECTION_ID, "posts", DISCOVERY, draft_row(), revision('{"_slug": 3}')
    )
    assert source.content_slug == "first-entry"
    assert source.content_title == "First entry"
    assert [item.media_id for item in source.occurrences] == ["hero-1"]


def test_draft_values_are_not_json_decoded_and_metadata_keys_are_dropped():
    data = {"hero": '{"id":"hero-9"}', "_hero": "ignored", "gallery": None}
    source = build_draft_overlay_source(
        COLLECTION_ID, "posts", DISCOVERY, draft_row(), revision(data)
    )
    # A JSON-looking string is a (strange) bare id, as in EmDash.
    assert [item.media_id for item in source.occurrences] == ['{"id":"hero-9"}']


def test_draft_title_overlays_even_when_blank_and_falls_back_to_the_slug():
    source = build_draft_overlay_source(
        COLLECTION_ID, "posts", DISCOVERY, draft_row(), revision({"title": " ", "_slug": "d"})
    )
    assert source.content_title == "d"


def test_draft_overlay_needs_a_draft_revision_id():
    with pytest.raises(ValueError):
        build_draft_overlay_source(COLLECTION_ID, "posts", DISCOVERY, content_row(), revision({}))


@pytest.mark.parametrize(
    ("stored", "code"),
    [
        (None, "DRAFT_REVISION_NOT_FOUND"),
        (revision("not json"), "DRAFT_REVISION_INVALID"),
        (revision("[1,2]"), "DRAFT_REVISION_INVALID"),
        (revision("null"), "DRAFT_REVISION_INVALID"),
        (revision(None), "DRAFT_REVISION_INVALID"),
        (revision("{}", collection="pages"), "DRAFT_REVISION_MISMATCH"),
        (revision("{}", entry_id="entry-2"), "DRAFT_REVISION_MISMATCH"),
    ],
)
def test_draft_revision_failures_carry_emdash_codes(stored, code):
    with pytest.raises(DraftRevisionError) as caught:
        build_draft_overlay_source(COLLECTION_ID, "posts", DISCOVERY, draft_row(), stored)
    assert caught.value.code == code
    attempted = caught.value.source
    assert attempted.source_key == f"content:{COLLECTION_ID}:entry-1:draft_overlay"
    assert attempted.revision_id == "rev-draft"
    assert attempted.content_title == "First entry"
    assert attempted.source_fingerprint is None
