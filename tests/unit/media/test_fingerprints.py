"""Fingerprints; the order-independence tests port EmDash's
`usage-projection-fingerprint.test.ts`. Literal digests were computed with Node."""

from __future__ import annotations

from dataclasses import replace

import pytest

from media_usage_orchestration.media.canonical import canonical_json, sha256_hex
from media_usage_orchestration.media.extraction import MediaOccurrence
from media_usage_orchestration.media.fields import ExtractionField, FieldDiscovery, SubFieldSpec
from media_usage_orchestration.media.fingerprints import (
    extraction_schema,
    field_fingerprint,
    projection_fingerprint,
)
from media_usage_orchestration.media.sources import ContentSource
from media_usage_orchestration.values.source_records import is_projection_fingerprint

# fixtures/README.md: the field fingerprint EmDash stored for both fixture collections.
FIXTURE_FIELD_FINGERPRINT = (
    "media-usage-fields:v1:sha256:9c4d23f9605c5ae1ab09446b89dd88458742ec1d19eee62ed02d109a31befd58"
)
FIXTURE_DISCOVERY = FieldDiscovery(
    (
        ExtractionField("attachment", "file"),
        ExtractionField("body", "portableText"),
        ExtractionField("gallery", "repeater", (SubFieldSpec("image", "image"),)),
        ExtractionField("hero", "image"),
    ),
    ("title",),
)

SOURCE = ContentSource(
    source_key="content:posts:entry-1:columns",
    source_type="content",
    collection_id=None,
    collection_slug="posts",
    content_id="entry-1",
    source_variant="columns",
    locale="en",
    translation_group="translation-1",
    content_slug="entry-1",
    content_title="Entry 1",
    content_status="published",
)
OCCURRENCES = (
    MediaOccurrence(
        "gallery",
        "gallery[1]",
        1,
        "image_field",
        "media-2",
        "local",
        "media-2",
        "image",
        "image/webp",
    ),
    MediaOccurrence(
        "gallery",
        "gallery[0]",
        0,
        "image_field",
        "media-1",
        "local",
        "media-1",
        "image",
        "image/webp",
    ),
)
DISCOVERY = FieldDiscovery((ExtractionField("gallery", "image"),), ())


def fingerprint(
    collection_id="collection-1", discovery=DISCOVERY, source=SOURCE, occurrences=OCCURRENCES
):
    return projection_fingerprint(collection_id, discovery, source, occurrences)


def test_projection_fingerprint_is_order_independent_but_covers_every_input_class():
    baseline = fingerprint()
    assert fingerprint(occurrences=OCCURRENCES[::-1]) == baseline
    assert fingerprint(collection_id="collection-2").value != baseline.value
    assert (
        fingerprint(source=replace(SOURCE, content_title="Changed title")).value != baseline.value
    )
    changed = (replace(OCCURRENCES[0], media_id="changed-media"), OCCURRENCES[1])
    assert fingerprint(occurrences=changed).value != baseline.value
    more_fields = FieldDiscovery(
        (*DISCOVERY.extraction_fields, ExtractionField("hero", "image")), ()
    )
    assert fingerprint(discovery=more_fields).value != baseline.value
    assert is_projection_fingerprint(baseline.value)
    assert baseline.byte_length > 0


def test_byte_length_is_the_utf8_payload_length():
    ascii_title = fingerprint(source=replace(SOURCE, content_title="e"))
    multibyte = fingerprint(source=replace(SOURCE, content_title="é"))
    assert multibyte.byte_length == ascii_title.byte_length + 1


def test_a_collection_identity_is_required():
    with pytest.raises(ValueError, match="collection identity"):
        fingerprint(collection_id="")


def test_version_and_update_time_are_not_hashed_but_completeness_is():
    baseline = fingerprint()
    moved = replace(
        SOURCE, source_version=9, source_updated_at="2030-01-01", source_fingerprint="x"
    )
    assert fingerprint(source=moved) == baseline
    partial = projection_fingerprint(
        "collection-1", DISCOVERY, SOURCE, OCCURRENCES, source_completeness="partial"
    )
    assert partial.value != baseline.value


def test_hand_checked_projection_fingerprint():
    source = ContentSource(
        source_key="content:01M8N6NRZY15B8WKP7FPWK6M3Z:entry-1:columns",
        source_type="content",
        collection_id="01M8N6NRZY15B8WKP7FPWK6M3Z",
        collection_slug="posts",
        content_id="entry-1",
        source_variant="columns",
        locale="en",
        translation_group="entry-1",
        content_slug="cafe",
        content_title="Café ☕",
        content_status="published",
    )
    hero = MediaOccurrence(
        "hero", "hero", 0, "image_field", "media-1", "local", "media-1", "image", "image/webp"
    )
    discovery = FieldDiscovery((ExtractionField("hero", "image"),), ("title",))
    expected_payload = (
        '{"collectionId":"01M8N6NRZY15B8WKP7FPWK6M3Z",'
        '"extractionSchema":[{"slug":"hero","type":"image"}],'
        '"fingerprintVersion":1,'
        '"occurrences":[{"fieldPath":"hero","fieldSlug":"hero","mediaId":"media-1",'
        '"mediaKind":"image","mimeType":"image/webp","occurrenceIndex":0,"provider":"local",'
        '"providerAssetId":"media-1","referenceType":"image_field"}],'
        '"source":{"collectionSlug":"posts","contentDeletedAt":null,"contentId":"entry-1",'
        '"contentScheduledAt":null,"contentSlug":"cafe","contentStatus":"published",'
        '"contentTitle":"Café ☕","locale":"en","revisionId":null,"schemaVersion":1,'
        '"sourceCompleteness":"complete",'
        '"sourceKey":"content:01M8N6NRZY15B8WKP7FPWK6M3Z:entry-1:columns",'
        '"sourceType":"content","sourceVariant":"columns","translationGroup":"entry-1"}}'
    )
    digest = "589af98c312c5caf67b839092d39d41cfdc4012fcf593f7c87173f96d07ad768"
    assert sha256_hex(expected_payload) == digest
    result = projection_fingerprint(source.collection_id, discovery, source, [hero])
    assert result.value == f"media-usage-projection:v1:sha256:{digest}"
    assert result.byte_length == 746


def test_field_fingerprint_of_the_fixture_collections():
    assert field_fingerprint(FIXTURE_DISCOVERY) == FIXTURE_FIELD_FINGERPRINT


def test_hand_checked_field_fingerprint():
    payload = (
        '{"contentSourceSchemaVersion":1,"displayFieldSlugs":["title"],'
        '"extractionFields":[{"slug":"attachment","type":"file"},'
        '{"slug":"body","type":"portableText"},'
        '{"slug":"gallery","subFields":[{"slug":"image","type":"image"}],"type":"repeater"},'
        '{"slug":"hero","type":"image"}],"fingerprintVersion":1}'
    )
    assert (
        canonical_json(
            {
                "fingerprintVersion": 1,
                "contentSourceSchemaVersion": 1,
                "extractionFields": extraction_schema(FIXTURE_DISCOVERY.extraction_fields),
                "displayFieldSlugs": ["title"],
            }
        )
        == payload
    )
    assert f"media-usage-fields:v1:sha256:{sha256_hex(payload)}" == FIXTURE_FIELD_FINGERPRINT


def test_field_fingerprint_changes_with_media_and_display_fields_only():
    baseline = field_fingerprint(FIXTURE_DISCOVERY)
    fields = FIXTURE_DISCOVERY.extraction_fields
    variants = [
        FieldDiscovery(fields[:-1], ("title",)),
        FieldDiscovery((*fields, ExtractionField("cover", "image")), ("title",)),
        FieldDiscovery((*fields[:-1], ExtractionField("hero", "file")), ("title",)),
        FieldDiscovery(fields, ("title", "name")),
        FieldDiscovery(fields, ()),
    ]
    assert len({baseline, *map(field_fingerprint, variants)}) == len(variants) + 1
    assert field_fingerprint(FieldDiscovery(fields[::-1], ("title",))) == baseline
    both = field_fingerprint(FieldDiscovery(fields, ("title", "name")))
    assert field_fingerprint(FieldDiscovery(fields, ("name", "title"))) == both


def test_hashed_schema_sorts_by_code_units_not_locale():
    fields = (ExtractionField("a_b", "image"), ExtractionField("a1", "image"))
    assert [entry["slug"] for entry in extraction_schema(fields)] == ["a1", "a_b"]
    repeater = ExtractionField(
        "g", "repeater", (SubFieldSpec("z", "image"), SubFieldSpec("a", "image"))
    )
    assert extraction_schema([repeater]) == [
        {
            "slug": "g",
            "type": "repeater",
            "subFields": [{"slug": "a", "type": "image"}, {"slug": "z", "type": "image"}],
        }
    ]
    assert extraction_schema([ExtractionField("hero", "image", (SubFieldSpec("x", "image"),))]) == [
        {"slug": "hero", "type": "image"}
    ]


def test_is_projection_fingerprint():
    assert not is_projection_fingerprint(None)
    assert not is_projection_fingerprint("media-usage-projection:v1:sha256:ABC")
    assert not is_projection_fingerprint(FIXTURE_FIELD_FINGERPRINT)
