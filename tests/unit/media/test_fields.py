from __future__ import annotations

import json

import pytest

from media_usage_orchestration.media.fields import (
    ExtractionField,
    FieldDiscovery,
    SubFieldSpec,
    discover_fields,
    identifier_collation_key,
)
from media_usage_orchestration.values.errors import (
    InvalidIdentifierError,
    MediaUsageFieldDiscoveryError,
)


def row(slug: str, field_type: str, validation: object = None) -> dict:
    if isinstance(validation, dict):
        validation = json.dumps(validation)
    return {"slug": slug, "type": field_type, "validation": validation}


def repeater(slug: str, *sub_fields: tuple[str, str]) -> dict:
    items = [{"slug": sub, "type": kind, "label": sub.title()} for sub, kind in sub_fields]
    return row(slug, "repeater", {"subFields": items})


def test_media_fields_are_discovered_and_other_types_ignored():
    discovery = discover_fields(
        [
            row("title", "string"),
            row("hero", "image"),
            row("attachment", "file"),
            row("body", "portableText"),
            row("tags", "multiSelect"),
            row("data", "json"),
            row("link", "url"),
        ]
    )
    assert discovery == FieldDiscovery(
        (
            ExtractionField("attachment", "file"),
            ExtractionField("body", "portableText"),
            ExtractionField("hero", "image"),
        ),
        ("title",),
    )


def test_repeaters_keep_only_image_sub_fields_sorted_by_slug():
    discovery = discover_fields(
        [
            repeater("gallery", ("zoom", "image"), ("caption", "string"), ("alt_image", "image")),
            repeater("downloads", ("file", "file")),
            row("empty", "repeater"),
            row("blank", "repeater", ""),
            row("not_object", "repeater", "[1,2]"),
            row("no_list", "repeater", {"subFields": {"slug": "x", "type": "image"}}),
        ]
    )
    assert discovery.extraction_fields == (
        ExtractionField(
            "gallery",
            "repeater",
            (SubFieldSpec("alt_image", "image"), SubFieldSpec("zoom", "image")),
        ),
    )


def test_sub_fields_without_a_string_slug_are_skipped():
    validation = {"subFields": [{"type": "image"}, {"slug": 3, "type": "image"}, "image"]}
    assert discover_fields([row("gallery", "repeater", validation)]).extraction_fields == ()


def test_invalid_repeater_validation_is_a_coded_error():
    with pytest.raises(MediaUsageFieldDiscoveryError) as caught:
        discover_fields([row("gallery", "repeater", "{not json")])
    assert caught.value.code == "INVALID_REPEATER_VALIDATION"


def test_invalid_json_is_only_an_error_for_repeaters():
    discovery = discover_fields([row("hero", "image", "{not json")])
    assert discovery.extraction_fields == (ExtractionField("hero", "image"),)


@pytest.mark.parametrize(
    "rows",
    [
        [row("Hero", "image")],
        [row("hero-image", "file")],
        [repeater("Gallery", ("image", "image"))],
        [repeater("gallery", ("Image", "image"))],
    ],
)
def test_invalid_media_slugs_are_refused(rows):
    with pytest.raises(InvalidIdentifierError):
        discover_fields(rows)


def test_invalid_slugs_of_non_media_fields_are_not_checked():
    assert discover_fields([row("Sub-Title", "string")]).extraction_fields == ()


def test_display_fields_are_title_then_name_whatever_their_type():
    discovery = discover_fields([row("name", "json"), row("title", "text"), row("label", "string")])
    assert discovery.display_field_slugs == ("title", "name")
    assert discover_fields([row("name", "string")]).display_field_slugs == ("name",)


def test_extraction_fields_sort_like_locale_compare():
    # localeCompare puts `_` before digits and digits before letters; code units would give
    # ["a1", "a_b", "ab"].
    slugs = ["ab", "a1", "a_b", "a", "a0", "b"]
    discovery = discover_fields([row(slug, "image") for slug in slugs])
    assert [field.slug for field in discovery.extraction_fields] == [
        "a",
        "a_b",
        "a0",
        "a1",
        "ab",
        "b",
    ]
    assert sorted(slugs, key=identifier_collation_key)[:3] == ["a", "a_b", "a0"]


def test_column_slugs_are_extraction_then_display_fields():
    discovery = discover_fields([row("title", "string"), row("hero", "image"), row("name", "file")])
    assert discovery.column_slugs == ("hero", "name", "title")
