"""Reads of content entries, draft revisions and field definitions (`store/host/content.py`):
an entry is read joined to its exact registry identity, so an entry of a replaced collection
with the same slug reads as absent; authorship is never read."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from sqlalchemy import delete

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, FieldSpec, SubField
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.host.content import (
    CONTENT_SYSTEM_COLUMNS,
    content_columns,
    content_row,
    content_rows,
    content_rows_query,
    field_rows,
    load_revision,
    load_revisions,
)
from media_usage_orchestration.values.errors import InvalidIdentifierError
from media_usage_orchestration.values.identifiers import COLLECTION_ID_RESULT
from tests.support.factories import insert_registry, insert_revision
from tests.support.projection import image, sql_statements
from tests.support.states import make_collection, recorded_statements, snapshot

FIELDS = (
    FieldSpec("title", "string"),
    FieldSpec("hero", "image"),
    FieldSpec("sections", "repeater", sub_fields=(SubField("image", "image"),)),
)


@dataclass(frozen=True)
class Discovery:
    """The part of a field discovery the reads use."""

    column_slugs: tuple[str, ...]


POSTS_COLUMNS = Discovery(("title", "hero"))


@pytest.fixture
def posts(db):
    collection = make_collection(db.engine, "posts", FIELDS)
    writer = CmsWriter(db.engine)
    for entry in (
        {"id": "entry-1", "slug": "one", "title": "One", "hero": image("media-1")},
        {"id": "entry-2", "slug": "two", "title": "Two", "author_id": "author-9"},
        {"id": "entry-3", "slug": "three", "title": "Three"},
    ):
        writer.insert_entry("posts", entry)
    writer.trash_entry("posts", "entry-3")
    return collection


def _replace_registry_row(db, slug: str, new_id: str) -> None:
    """The collection deleted from the registry and created again under the same slug; its
    content table left as it was."""
    with db.engine.begin() as connection:
        connection.execute(delete(schema.fields))
        connection.execute(delete(schema.collections).where(schema.collections.c.slug == slug))
    insert_registry(db.engine, id=new_id, slug=slug)


# --- field definitions ------------------------------------------------------------------------


def test_field_rows_are_the_collections_field_definitions(db, posts):
    make_collection(db.engine, "pages")  # fields of another collection are not read

    with db.engine.connect() as connection:
        rows = field_rows(connection, "posts")
        exact = field_rows(connection, "posts", posts.id)

    by_slug = {row["slug"]: row for row in rows}
    assert sorted(by_slug) == ["hero", "sections", "title"]
    assert set(rows[0]) == {"slug", "type", "validation"}
    assert (by_slug["title"]["type"], by_slug["title"]["validation"]) == ("string", None)
    assert by_slug["hero"]["type"] == "image"
    assert json.loads(by_slug["sections"]["validation"]) == {
        "subFields": [{"slug": "image", "type": "image", "label": "Image"}]
    }
    assert sorted(exact, key=lambda row: row["slug"]) == sorted(rows, key=lambda row: row["slug"])


def test_field_rows_of_another_identity_or_slug_are_empty(db, posts):
    with db.engine.connect() as connection:
        assert field_rows(connection, "posts", "id-replaced") == []
        assert field_rows(connection, "drafts") == []


@pytest.mark.parametrize("slug", ["Posts", "x; drop table ec_posts", "", None])
def test_field_rows_refuse_a_bad_slug_before_any_sql(db, posts, slug):
    before = snapshot(db.engine)
    with (
        db.engine.connect() as connection,
        recorded_statements(db.engine) as sent,
        pytest.raises(InvalidIdentifierError, match="Invalid collection slug"),
    ):
        field_rows(connection, slug)
    assert sql_statements(sent) == []
    assert snapshot(db.engine) == before


# --- the columns an entry is read with ----------------------------------------------------------


def test_an_entry_is_read_with_the_system_columns_then_its_field_columns():
    columns = content_columns(Discovery(("title", "hero", "title", "slug")))

    assert columns == (*CONTENT_SYSTEM_COLUMNS, "title", "hero")
    assert "author_id" not in columns and "primary_byline_id" not in columns
    assert {"id", "version", "updated_at", "live_revision_id", "draft_revision_id"} <= set(columns)


@pytest.mark.parametrize("slug", ["Title", "hero-image", "x; drop table ec_posts", ""])
def test_a_bad_field_column_is_refused(slug):
    with pytest.raises(InvalidIdentifierError, match="content media usage column"):
        content_columns(Discovery(("title", slug)))


# --- entries ----------------------------------------------------------------------------------


def test_an_entry_is_read_with_its_registry_identity_and_without_authorship(db, posts):
    with db.engine.connect() as connection:
        row = content_row(connection, "posts", posts.id, POSTS_COLUMNS, "entry-1")
        authored = content_row(connection, "posts", posts.id, POSTS_COLUMNS, "entry-2")
        trashed = content_row(connection, "posts", posts.id, POSTS_COLUMNS, "entry-3")
        missing = content_row(connection, "posts", posts.id, POSTS_COLUMNS, "entry-9")

    assert set(row) == {*CONTENT_SYSTEM_COLUMNS, "title", "hero", COLLECTION_ID_RESULT}
    assert (row["id"], row["slug"], row["title"], row[COLLECTION_ID_RESULT]) == (
        "entry-1",
        "one",
        "One",
        posts.id,
    )
    assert json.loads(row["hero"]) == image("media-1")
    assert (row["version"], row["locale"], row["deleted_at"]) == (1, "en", None)
    assert "author_id" not in authored and authored["title"] == "Two"
    assert trashed["deleted_at"] is not None  # trashed entries are still content rows
    assert missing is None


def test_many_entries_are_read_at_once_keyed_by_id(db, posts):
    with db.engine.connect() as connection:
        rows = content_rows(
            connection, "posts", posts.id, POSTS_COLUMNS, ["entry-2", "entry-1", "entry-9"]
        )
        single = content_row(connection, "posts", posts.id, POSTS_COLUMNS, "entry-2")
        none = content_rows(connection, "posts", posts.id, POSTS_COLUMNS, [])

    assert sorted(rows) == ["entry-1", "entry-2"]
    assert rows["entry-2"] == single
    assert none == {}


def test_the_entries_of_a_replaced_collection_read_as_absent(db, posts):
    _replace_registry_row(db, "posts", "id-replacement")

    with db.engine.connect() as connection:
        old = content_row(connection, "posts", posts.id, POSTS_COLUMNS, "entry-1")
        many = content_rows(connection, "posts", posts.id, POSTS_COLUMNS, ["entry-1"])
        new = content_row(connection, "posts", "id-replacement", POSTS_COLUMNS, "entry-1")

    assert (old, many) == (None, {})
    assert new[COLLECTION_ID_RESULT] == "id-replacement"


def test_the_query_filters_and_orders_by_the_content_alias(db, posts):
    query, content = content_rows_query("posts", posts.id, POSTS_COLUMNS)

    with db.engine.connect() as connection:
        ids = connection.execute(
            query.where(content.c.deleted_at.is_(None)).order_by(content.c.id.desc())
        ).scalars()
        assert list(ids) == ["entry-2", "entry-1"]


@pytest.mark.parametrize("slug", ["Posts", "x; drop table ec_posts", "a" * 126])
def test_an_entry_read_refuses_a_bad_slug_before_any_sql(db, posts, slug):
    with db.engine.connect() as connection, recorded_statements(db.engine) as sent:
        with pytest.raises(InvalidIdentifierError):
            content_row(connection, slug, posts.id, POSTS_COLUMNS, "entry-1")
        with pytest.raises(InvalidIdentifierError):
            content_rows(connection, slug, posts.id, POSTS_COLUMNS, ["entry-1"])
    assert sql_statements(sent) == []


# --- revisions --------------------------------------------------------------------------------


def test_a_revision_is_read_by_id(db):
    insert_revision(db.engine, id="rev-1", entry_id="entry-1", data='{"title":"Draft"}')

    with db.engine.connect() as connection:
        found = load_revision(connection, "rev-1")
        missing = load_revision(connection, "rev-9")

    assert found == {
        "id": "rev-1",
        "collection": "posts",
        "entry_id": "entry-1",
        "data": '{"title":"Draft"}',
    }
    assert missing is None


def test_many_revisions_are_read_at_once_keyed_by_id(db):
    for index in (1, 2, 3):
        insert_revision(db.engine, id=f"rev-{index}", entry_id=f"entry-{index}")

    with db.engine.connect() as connection:
        found = load_revisions(connection, ["rev-3", "rev-1", "rev-3", "rev-9"])
        with recorded_statements(db.engine) as sent:
            nothing = load_revisions(connection, [])

    assert sorted(found) == ["rev-1", "rev-3"]
    assert found["rev-3"]["entry_id"] == "entry-3"
    assert nothing == {} and sent == []  # nothing asked, nothing read
