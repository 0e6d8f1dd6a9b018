"""The collection registry (`store/host/registry.py`): lookups by slug and by exact identity,
listings in slug order (live ones without a deletion tombstone), and the one-off read of another
database's live slugs through a read-only engine of its own."""

from __future__ import annotations

import pytest
from sqlalchemy import MetaData

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.host.registry import (
    RegisteredCollection,
    collection_id_for_slug,
    collection_identity_exists,
    holds_collections,
    list_collection_slugs,
    list_collections,
    list_live_collection_slugs,
    read_collection_id,
    read_collection_identity_exists,
    read_collection_slug,
    read_collection_slugs,
    read_live_collection_slugs_at,
)
from media_usage_orchestration.values.errors import InvalidIdentifierError, RegistryUnreadable
from tests.support.factories import insert_deletion, insert_registry
from tests.support.projection import sql_statements
from tests.support.states import recorded_statements, snapshot

# Inserted out of slug order: every listing sorts them.
REGISTERED = {"pages": "id-pages", "articles": "id-articles", "posts": "id-posts"}


@pytest.fixture
def registry(db):
    for slug, collection_id in REGISTERED.items():
        insert_registry(db.engine, id=collection_id, slug=slug)
    return db


def test_a_slug_reads_as_its_registered_id(registry):
    with registry.engine.connect() as connection:
        assert collection_id_for_slug(connection, "posts") == "id-posts"
        assert collection_id_for_slug(connection, "drafts") is None
    assert read_collection_id(registry.engine, "articles") == "id-articles"
    assert read_collection_id(registry.engine, "drafts") is None


def test_an_id_reads_as_its_registered_slug(registry):
    assert read_collection_slug(registry.engine, "id-pages") == "pages"
    assert read_collection_slug(registry.engine, "id-gone") is None


def test_an_identity_exists_only_as_the_exact_id_and_slug_pair(registry):
    with registry.engine.connect() as connection:
        assert collection_identity_exists(connection, "id-posts", "posts") is True
        assert collection_identity_exists(connection, "id-posts", "pages") is False
        assert collection_identity_exists(connection, "id-pages", "posts") is False
        assert collection_identity_exists(connection, "id-gone", "gone") is False
    assert read_collection_identity_exists(registry.engine, "id-pages", "pages") is True
    assert read_collection_identity_exists(registry.engine, "id-posts", "articles") is False


def test_a_replaced_collection_is_a_new_identity_under_the_same_slug(registry):
    with registry.engine.begin() as connection:
        connection.execute(schema.collections.delete().where(schema.collections.c.slug == "posts"))
    insert_registry(registry.engine, id="id-posts-2", slug="posts")

    assert read_collection_id(registry.engine, "posts") == "id-posts-2"
    assert read_collection_identity_exists(registry.engine, "id-posts", "posts") is False
    assert read_collection_slug(registry.engine, "id-posts") is None


def test_collections_are_listed_by_slug_after_a_cursor_and_up_to_a_limit(registry):
    with registry.engine.connect() as connection:
        everything = list_collections(connection)
        first_two = list_collections(connection, limit=2)
        after_articles = list_collections(connection, after="articles")
        after_pages = list_collections(connection, after="pages", limit=5)
        past_the_end = list_collections(connection, after="posts")
        from_the_start = list_collections(connection, after="", limit=1)

    assert everything == [
        RegisteredCollection("id-articles", "articles"),
        RegisteredCollection("id-pages", "pages"),
        RegisteredCollection("id-posts", "posts"),
    ]
    collection_id, slug = everything[0]  # unpacks as (id, slug)
    assert (collection_id, slug) == ("id-articles", "articles")
    assert first_two == everything[:2]
    assert after_articles == everything[1:]
    assert after_pages == everything[2:]
    assert past_the_end == []
    assert from_the_start == everything[:1]  # an empty cursor starts at the first slug


def test_every_slug_is_listed_in_order(registry):
    with registry.engine.connect() as connection:
        assert list_collection_slugs(connection) == ["articles", "pages", "posts"]
    assert read_collection_slugs(registry.engine) == ["articles", "pages", "posts"]


def test_an_empty_registry_lists_nothing_and_holds_no_collections(db):
    with db.engine.connect() as connection:
        assert list_collections(connection) == []
        assert list_collection_slugs(connection) == []
        assert list_live_collection_slugs(connection) == []
        assert holds_collections(connection) is False
    assert read_collection_slugs(db.engine) == []


def test_live_slugs_leave_out_the_tombstoned_ones(registry):
    insert_deletion(registry.engine, collection_id="id-pages", collection_slug="pages")
    # A tombstone holds its slug whatever the registry row's id now is.
    insert_deletion(registry.engine, collection_id="id-old-posts", collection_slug="posts")

    with registry.engine.connect() as connection:
        assert list_live_collection_slugs(connection) == ["articles"]
        assert holds_collections(connection) is True
        # The other listings still name every registry row.
        assert list_collection_slugs(connection) == ["articles", "pages", "posts"]


def test_without_a_registry_table_there_are_no_collections(empty_db):
    with empty_db.engine.connect() as connection:
        assert list_live_collection_slugs(connection) == []
        assert holds_collections(connection) is False


def test_without_a_tombstone_table_every_registered_slug_is_live(empty_db):
    only_registry = MetaData()
    schema.collections.to_metadata(only_registry)
    only_registry.create_all(empty_db.engine)
    insert_registry(empty_db.engine, id="id-b", slug="beta")
    insert_registry(empty_db.engine, id="id-a", slug="alpha")

    with empty_db.engine.connect() as connection:
        assert list_live_collection_slugs(connection) == ["alpha", "beta"]
        assert holds_collections(connection) is True


@pytest.mark.parametrize("slug", ["Posts", "", "x; drop table ec_posts", "a" * 129, None, 7])
def test_a_bad_slug_is_refused_before_any_sql(registry, slug):
    before = snapshot(registry.engine)
    with registry.engine.connect() as connection:
        with (
            recorded_statements(registry.engine) as sent,
            pytest.raises(InvalidIdentifierError, match="Invalid collection slug"),
        ):
            collection_id_for_slug(connection, slug)
        assert sent == []
    with (
        recorded_statements(registry.engine) as sent,
        pytest.raises(InvalidIdentifierError, match="Invalid collection slug"),
    ):
        read_collection_id(registry.engine, slug)
    assert sql_statements(sent) == []  # at most the read transaction's BEGIN and ROLLBACK
    assert snapshot(registry.engine) == before


def test_another_databases_live_slugs_are_read_through_its_url(registry):
    insert_deletion(registry.engine, collection_id="id-posts", collection_slug="posts")

    assert read_live_collection_slugs_at(registry.url) == ["articles", "pages"]


@pytest.mark.sqlite_only("a SQLite file is what a read-only engine must not create")
def test_a_missing_sqlite_file_is_unreadable_and_not_created(db, tmp_path):
    missing = tmp_path / "elsewhere" / "missing.db"

    with pytest.raises(RegistryUnreadable, match="no SQLite database file"):
        read_live_collection_slugs_at(f"sqlite:///{missing}")

    assert not missing.exists() and not missing.parent.exists()


def test_an_unusable_url_is_unreadable():
    with pytest.raises(RegistryUnreadable):
        read_live_collection_slugs_at("nosuchdriver://somewhere/db")


def test_an_unreachable_server_is_unreadable_without_its_password():
    # Port 1 on the loopback refuses at once: no connect timeout is waited for.
    url = "postgresql+psycopg://media:hunter2-secret@127.0.0.1:1/media"

    with pytest.raises(RegistryUnreadable) as raised:
        read_live_collection_slugs_at(url)

    assert "hunter2-secret" not in str(raised.value)
