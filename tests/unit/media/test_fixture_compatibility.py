"""Byte compatibility with EmDash on the database EmDash itself produced.

Every entry of the fixture is read, discovered, extracted and fingerprinted here, and the
result must equal the sources, occurrences and fingerprints EmDash wrote for it.
"""

from __future__ import annotations

import json
import shutil

import pytest
from sqlalchemy import create_engine, select, text

from media_usage_orchestration.media.extraction import occurrences_from_rows
from media_usage_orchestration.media.fingerprints import field_fingerprint
from media_usage_orchestration.media.snapshots import (
    build_columns_source,
    build_draft_overlay_source,
)
from media_usage_orchestration.media.sources import ContentSource
from media_usage_orchestration.processing.work.content_reads import load_fields
from media_usage_orchestration.store.core import schema
from tests.fixtures import FIXTURE_DB, FIXTURES

FIELD_FINGERPRINT = (
    "media-usage-fields:v1:sha256:9c4d23f9605c5ae1ab09446b89dd88458742ec1d19eee62ed02d109a31befd58"
)
SLUGS = ("coll_0", "coll_1")
# The reference end state lists these source columns; completeness and error code belong to
# the writer, not to source building.
IDENTITY_COLUMNS = (
    "source_key",
    "source_type",
    "collection_slug",
    "content_id",
    "source_variant",
    "locale",
    "content_slug",
    "content_title",
    "content_status",
    "content_deleted_at",
)


@pytest.fixture(scope="module")
def fixture_engine(tmp_path_factory):
    copy = tmp_path_factory.mktemp("emdash") / "emdash-fixture.db"
    shutil.copyfile(FIXTURE_DB, copy)
    engine = create_engine(f"sqlite:///{copy}")
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def collection_ids(fixture_engine) -> dict[str, str]:
    with fixture_engine.connect() as connection:
        rows = connection.execute(select(schema.collections.c.slug, schema.collections.c.id))
        return {slug: collection_id for slug, collection_id in rows}


@pytest.fixture(scope="module")
def built_sources(fixture_engine, collection_ids) -> dict[str, ContentSource]:
    """Our sources for every fixture entry, keyed as the reference files key them."""
    built: dict[str, ContentSource] = {}
    with fixture_engine.connect() as connection:
        for slug in SLUGS:
            collection_id = collection_ids[slug]
            discovery = load_fields(connection, slug, collection_id)
            for row in _content_rows(connection, slug, discovery.column_slugs):
                for source in _sources_of(connection, collection_id, slug, discovery, row):
                    built[source.source_key.replace(collection_id, f"<{slug}>")] = source
    return built


def _content_rows(connection, slug, column_slugs):
    columns = ", ".join(f'"{column}"' for column in (*schema.SYSTEM_COLUMNS, *column_slugs))
    query = text(f'SELECT {columns} FROM "ec_{slug}" ORDER BY id')  # slugs are fixed above
    return connection.execute(query).mappings().all()


def _sources_of(connection, collection_id, slug, discovery, row):
    yield build_columns_source(collection_id, slug, discovery, row)
    if row["draft_revision_id"]:
        revision = (
            connection.execute(
                select(schema.revisions).where(schema.revisions.c.id == row["draft_revision_id"])
            )
            .mappings()
            .first()
        )
        yield build_draft_overlay_source(collection_id, slug, discovery, row, revision)


def _load(name: str):
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def _sorted_occurrences(occurrences):
    return sorted(occurrences, key=lambda item: tuple(str(value) for value in vars(item).values()))


def test_field_fingerprint_matches_emdash_for_both_collections(fixture_engine, collection_ids):
    with fixture_engine.connect() as connection:
        for slug in SLUGS:
            discovery = load_fields(connection, slug, collection_ids[slug])
            assert field_fingerprint(discovery) == FIELD_FINGERPRINT
            assert discovery.display_field_slugs == ("title",)


def test_every_source_fingerprint_matches_emdash(built_sources):
    expected = _load("emdash-reference-source-fingerprints.json")
    assert len(expected) == 400
    actual = {key: source.source_fingerprint for key, source in built_sources.items()}
    mismatched = sorted(key for key in expected if actual.get(key) != expected[key])
    assert mismatched == []
    assert set(actual) == set(expected)


def test_every_source_and_occurrence_matches_emdash(built_sources, collection_ids):
    reference = _load("emdash-reference-end-state.json")
    assert reference["orphanOrStaleOccurrenceRows"] == 0
    assert set(built_sources) == {item["source_key"] for item in reference["sources"]}
    total = 0
    for item in reference["sources"]:
        source = built_sources[item["source_key"]]
        row = source.row_values()
        row["source_key"] = item["source_key"]
        assert {column: row[column] for column in IDENTITY_COLUMNS} == {
            column: item[column] for column in IDENTITY_COLUMNS
        }
        assert source.collection_id == collection_ids[source.collection_slug]
        assert source.identity_version == 1
        expected = occurrences_from_rows(item["occurrences"])
        assert _sorted_occurrences(source.occurrences) == _sorted_occurrences(expected)
        total += len(source.occurrences)
    assert total == 2268
