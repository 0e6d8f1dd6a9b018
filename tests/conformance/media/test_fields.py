"""Field discovery reads one collection's field rows from the registry (`load_fields`), on
both dialects, and validates the slug before reading."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import insert

from media_usage_orchestration.media.fields import ExtractionField, FieldDiscovery, SubFieldSpec
from media_usage_orchestration.processing.work.content_reads import load_fields
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.values.errors import InvalidIdentifierError


@pytest.fixture
def registry(db):
    """Two collections' registry and field rows, on each dialect."""
    engine = db.engine
    with engine.begin() as connection:
        for collection_id, slug in (("c-posts", "posts"), ("c-pages", "pages")):
            connection.execute(
                insert(schema.collections).values(id=collection_id, slug=slug, label=slug)
            )
        specs = [
            ("c-posts", "title", "string", None),
            ("c-posts", "hero", "image", None),
            (
                "c-posts",
                "gallery",
                "repeater",
                json.dumps({"subFields": [{"slug": "image", "type": "image"}]}),
            ),
            ("c-pages", "cover", "image", None),
        ]
        for number, (collection_id, slug, field_type, validation) in enumerate(specs):
            connection.execute(
                insert(schema.fields).values(
                    id=f"f{number}",
                    collection_id=collection_id,
                    slug=slug,
                    label=slug,
                    type=field_type,
                    column_type="TEXT",
                    validation=validation,
                )
            )
    return engine


def test_load_fields_reads_one_collection(registry):
    with registry.connect() as connection:
        discovery = load_fields(connection, "posts")
        assert load_fields(connection, "posts", "c-posts") == discovery
        assert load_fields(connection, "posts", "c-pages") == FieldDiscovery((), ())
        assert load_fields(connection, "pages").extraction_fields == (
            ExtractionField("cover", "image"),
        )
    assert discovery == FieldDiscovery(
        (
            ExtractionField("gallery", "repeater", (SubFieldSpec("image", "image"),)),
            ExtractionField("hero", "image"),
        ),
        ("title",),
    )


def test_load_fields_validates_the_collection_slug(registry):
    with registry.connect() as connection, pytest.raises(InvalidIdentifierError):
        load_fields(connection, "posts; DROP TABLE x")
