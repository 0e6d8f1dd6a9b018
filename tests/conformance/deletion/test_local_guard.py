"""EmDash's local deletion guard (`store/deletion/local_guard.py`, upstream
`executeLocalCollectionDeletionGuard`): fencing capture or dropping the content table, in one
transaction and only under the live lease of the matching phase; the slug lock
(`isMediaUsageCollectionSlugDeleting`); and the synchronous delete of a collection whose capture
never activated, with the reads it decides on.
"""

from __future__ import annotations

import pytest
from sqlalchemy import insert

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.deletion.local_guard import (
    delete_collection_synchronously,
    drop_content_table,
    execute_local_deletion_guard,
    is_slug_deleting,
    read_capture_state,
    table_has_live_content,
)
from media_usage_orchestration.store.deletion.records import DeletionPhase, GuardOutcome
from media_usage_orchestration.values.errors import InvalidIdentifierError
from tests.support.deletions import (
    add_source,
    claimed,
    expire_lease,
    table_exists,
    tombstone,
)
from tests.support.factories import insert_deletion
from tests.support.states import (
    all_rows,
    count,
    make_collection,
    recorded_statements,
    set_status,
    snapshot,
    status_row,
)

STALE_TOKEN = "01STALESTALESTALESTALESTAL"


@pytest.fixture
def posts(db):
    return make_collection(db.engine, "posts")


def posts_table(collection):
    return schema.content_table(collection.slug)


def guard(db, claim, action="fence", *, token=None, force=None):
    return execute_local_deletion_guard(
        db.engine,
        action,
        claim.collection_id,
        claim.collection_slug,
        token or claim.lease_token,
        claim.force_delete if force is None else force,
    )


# --- the local guard (foundation) ------------------------------------------------------------


def test_fence_with_the_live_lease_sets_capture_state_deleting(db, posts):
    claim = claimed(db.engine, posts)
    assert guard(db, claim) is GuardOutcome.FENCED
    assert status_row(db.engine, "posts")["capture_state"] == "deleting"


@pytest.mark.parametrize("how", ["wrong_token", "expired", "wrong_phase"])
def test_guard_acts_only_with_the_exact_live_lease(db, posts, how):
    phase = DeletionPhase.REGISTRY if how == "wrong_phase" else DeletionPhase.FENCE
    claim = claimed(db.engine, posts, phase)
    if how == "expired":
        expire_lease(db.engine, posts.id)
    token = STALE_TOKEN if how == "wrong_token" else None
    before = snapshot(db.engine)
    assert guard(db, claim, "fence", token=token) is GuardOutcome.STALE
    assert guard(db, claim, "drop", token=token) is GuardOutcome.STALE
    assert snapshot(db.engine) == before
    assert table_exists(db.engine, "ec_posts")


def test_an_expired_owner_cannot_drop_a_replacement_table(db, posts):
    claim = claimed(db.engine, posts, DeletionPhase.TABLE)
    expire_lease(db.engine, posts.id)
    CmsWriter(db.engine).insert_entry("posts", {"id": "replacement", "title": "kept"})
    assert guard(db, claim, "drop") is GuardOutcome.STALE
    assert table_exists(db.engine, "ec_posts")
    assert count(db.engine, posts_table(posts)) == 1


def test_without_force_a_collection_with_content_is_kept(db, posts):
    CmsWriter(db.engine).insert_entry("posts", {"title": "live"})
    claim = claimed(db.engine, posts)
    before = snapshot(db.engine)
    assert guard(db, claim) is GuardOutcome.HAS_CONTENT
    assert snapshot(db.engine) == before
    assert status_row(db.engine, "posts")["capture_state"] == "active"


def test_only_trashed_rows_are_not_content(db, posts):
    writer = CmsWriter(db.engine)
    writer.trash_entry("posts", writer.insert_entry("posts", {"title": "trashed"}))
    claim = claimed(db.engine, posts)
    assert guard(db, claim) is GuardOutcome.FENCED


def test_force_fences_a_collection_with_content(db, posts):
    CmsWriter(db.engine).insert_entry("posts", {"title": "live"})
    claim = claimed(db.engine, posts, force=True)
    assert guard(db, claim) is GuardOutcome.FENCED


@pytest.mark.parametrize("change", ["capture_installing", "registry_replaced"])
def test_fence_is_stale_without_an_active_exact_identity(db, posts, change):
    claim = claimed(db.engine, posts)
    if change == "capture_installing":
        set_status(db.engine, "posts", capture_state="installing")
    else:
        with db.engine.begin() as connection:
            connection.execute(schema.fields.delete())
            connection.execute(schema.collections.update().values(id="other-id"))
    assert guard(db, claim) is GuardOutcome.STALE
    assert status_row(db.engine, "posts")["capture_state"] != "deleting"


def test_drop_removes_the_content_table(db, posts):
    claim = claimed(db.engine, posts, DeletionPhase.TABLE)
    assert guard(db, claim, "drop") is GuardOutcome.DROPPED
    assert not table_exists(db.engine, "ec_posts")
    assert guard(db, claim, "drop") is GuardOutcome.DROPPED


@pytest.mark.sqlite_only("FTS5 tables exist only on SQLite")
def test_drop_removes_the_fts_table_and_its_triggers_on_sqlite(db, posts):
    with db.engine.begin() as connection:
        connection.exec_driver_sql(
            'CREATE VIRTUAL TABLE "_emdash_fts_posts" USING fts5(id UNINDEXED, title)'
        )
        for event, body in (
            ("INSERT", "INSERT INTO _emdash_fts_posts(id, title) VALUES (NEW.id, NEW.title)"),
            ("UPDATE", "DELETE FROM _emdash_fts_posts WHERE id = OLD.id"),
            ("DELETE", "DELETE FROM _emdash_fts_posts WHERE id = OLD.id"),
        ):
            connection.exec_driver_sql(
                f'CREATE TRIGGER "_emdash_fts_posts_{event.lower()}" AFTER {event} ON ec_posts '
                f"BEGIN {body}; END"
            )
    claim = claimed(db.engine, posts, DeletionPhase.TABLE)
    assert guard(db, claim, "drop") is GuardOutcome.DROPPED
    with db.engine.connect() as connection:
        left = connection.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE name LIKE '%emdash_fts_posts%'"
        ).all()
    assert left == []


# --- the guard's phases and identity ----------------------------------------------------------


def test_a_fence_lease_cannot_drop_and_a_table_lease_cannot_fence(db, posts):
    fence = claimed(db.engine, posts, DeletionPhase.FENCE)
    before = snapshot(db.engine)
    assert guard(db, fence, "drop") is GuardOutcome.STALE
    assert snapshot(db.engine) == before and table_exists(db.engine, "ec_posts")

    with db.engine.begin() as connection:
        connection.execute(
            schema.collection_deletions.update().values(phase=DeletionPhase.TABLE.value)
        )
    before = snapshot(db.engine)
    assert guard(db, fence, "fence") is GuardOutcome.STALE
    assert snapshot(db.engine) == before
    assert status_row(db.engine, "posts")["capture_state"] == "active"


def test_the_guard_needs_the_tombstones_own_slug(db, posts):
    claim = claimed(db.engine, posts, DeletionPhase.TABLE)
    make_collection(db.engine, "pages")
    before = snapshot(db.engine)

    outcome = execute_local_deletion_guard(
        db.engine, "drop", claim.collection_id, "pages", claim.lease_token, False
    )

    assert outcome is GuardOutcome.STALE
    assert snapshot(db.engine) == before and table_exists(db.engine, "ec_pages")


def test_a_fence_without_a_status_row_is_stale(db, posts):
    claim = claimed(db.engine, posts)
    with db.engine.begin() as connection:
        connection.execute(schema.index_status.delete())
    before = snapshot(db.engine)

    assert guard(db, claim) is GuardOutcome.STALE
    assert snapshot(db.engine) == before


def _guard_arguments(**overrides):
    arguments = {
        "action": "fence",
        "collection_id": "id-posts",
        "collection_slug": "posts",
        "lease_token": STALE_TOKEN,
        "force_delete": False,
    }
    return {**arguments, **overrides}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"action": "truncate"}, "Invalid collection deletion guard action"),
        ({"collection_id": ""}, "requires a collection ID"),
        ({"collection_id": None}, "requires a collection ID"),
        ({"collection_slug": "Posts"}, "Invalid collection slug"),
        ({"collection_slug": "x; drop table ec_posts"}, "Invalid collection slug"),
        ({"collection_slug": "a" * 126}, "Invalid content table"),
        ({"lease_token": ""}, "requires a lease token"),
        ({"force_delete": "yes"}, "force_delete must be a boolean"),
    ],
    ids=[
        "action",
        "empty-id",
        "no-id",
        "upper-case-slug",
        "injected-slug",
        "slug-too-long",
        "empty-token",
        "force-not-boolean",
    ],
)
def test_bad_guard_input_is_refused_before_any_sql(db, posts, overrides, message):
    claimed(db.engine, posts, DeletionPhase.TABLE)
    before = snapshot(db.engine)

    with recorded_statements(db.engine) as sent, pytest.raises(ValueError, match=message):
        execute_local_deletion_guard(db.engine, **_guard_arguments(**overrides))

    assert sent == []
    assert snapshot(db.engine) == before and table_exists(db.engine, "ec_posts")


# --- the slug lock ----------------------------------------------------------------------------


def test_a_tombstone_holds_its_slug(db, posts):
    assert is_slug_deleting(db.engine, "posts") is False
    tombstone(db.engine, posts)
    # A tombstone holds the slug whatever collection now has it, even none.
    insert_deletion(db.engine, collection_id="id-gone", collection_slug="pages")

    assert is_slug_deleting(db.engine, "posts") is True
    assert is_slug_deleting(db.engine, "pages") is True
    assert is_slug_deleting(db.engine, "articles") is False


def test_without_a_tombstone_table_no_slug_is_held(empty_db):
    assert is_slug_deleting(empty_db.engine, "posts") is False


@pytest.mark.parametrize("slug", ["Posts", "", "x; drop table ec_posts", None])
def test_a_bad_slug_is_refused_before_the_slug_lock_is_read(db, slug):
    with (
        recorded_statements(db.engine) as sent,
        pytest.raises(InvalidIdentifierError, match="Invalid collection slug"),
    ):
        is_slug_deleting(db.engine, slug)
    assert sent == []


# --- the reads the deletion decides on --------------------------------------------------------


def test_the_capture_state_is_read_for_the_exact_identity(db, posts):
    with db.engine.connect() as connection:
        assert read_capture_state(connection, posts.id, "posts") == "active"
        assert read_capture_state(connection, "id-replaced", "posts") is None
        assert read_capture_state(connection, posts.id, "pages") is None

    set_status(db.engine, "posts", capture_state=None)
    with db.engine.connect() as connection:
        assert read_capture_state(connection, posts.id, "posts") is None


def test_only_rows_not_trashed_are_live_content(db, posts):
    writer = CmsWriter(db.engine)

    def live() -> bool:
        with db.engine.connect() as connection:
            return table_has_live_content(connection, "ec_posts")

    assert live() is False
    trashed = writer.insert_entry("posts", {"title": "trashed"})
    writer.trash_entry("posts", trashed)
    assert live() is False
    writer.insert_entry("posts", {"title": "live"})
    assert live() is True


# --- dropping the content table ---------------------------------------------------------------


def test_dropping_the_content_table_is_idempotent_and_leaves_the_others(db, posts):
    make_collection(db.engine, "pages")

    for _ in range(2):
        with db.engine.begin() as connection:
            drop_content_table(connection, "posts")

    assert not table_exists(db.engine, "ec_posts")
    assert table_exists(db.engine, "ec_pages")


def test_a_bad_slug_drops_nothing(db, posts):
    with (
        db.engine.connect() as connection,
        recorded_statements(db.engine) as sent,
        pytest.raises(InvalidIdentifierError),
    ):
        drop_content_table(connection, "posts; drop table ec_pages")
    assert sent == []
    assert table_exists(db.engine, "ec_posts")


# --- the synchronous delete (capture never activated) -----------------------------------------


def test_a_synchronous_delete_removes_everything_of_the_collection(db, posts):
    pages = make_collection(db.engine, "pages")
    CmsWriter(db.engine).insert_entry("posts", {"title": "deleted with the table"})
    add_source(
        db.engine,
        "posts-source",
        collection_id=posts.id,
        collection_slug="posts",
        occurrence_ids=["p-1", "p-2"],
    )
    # EmDash deletes the collection's sources by slug, whatever their identity.
    add_source(
        db.engine,
        "legacy-source",
        collection_id=None,
        collection_slug="posts",
        identity_version=None,
        occurrence_ids=["l-1"],
    )
    add_source(
        db.engine,
        "pages-source",
        collection_id=pages.id,
        collection_slug="pages",
        occurrence_ids=["o-1"],
    )
    with db.engine.begin() as connection:
        connection.execute(
            insert(schema.sources).values(
                source_key="setting-source",
                source_type="setting",
                collection_slug="posts",
                source_variant="columns",
                current_generation="gen-1",
            )
        )

    with db.engine.begin() as connection:
        delete_collection_synchronously(connection, posts.id, "posts")

    assert not table_exists(db.engine, "ec_posts")
    assert count(db.engine, schema.collections, id=posts.id) == 0
    assert count(db.engine, schema.fields, collection_id=posts.id) == 0
    assert status_row(db.engine, "posts") is None
    remaining = sorted(row["source_key"] for row in all_rows(db.engine, schema.sources))
    assert remaining == ["pages-source", "setting-source"]
    assert sorted(row["id"] for row in all_rows(db.engine, schema.occurrences)) == ["o-1"]
    # The other collection is untouched.
    assert table_exists(db.engine, "ec_pages") and status_row(db.engine, "pages") is not None
    assert count(db.engine, schema.fields, collection_id=pages.id) == 2


def test_a_synchronous_delete_in_a_failed_transaction_leaves_everything(db, posts):
    before = snapshot(db.engine)

    with pytest.raises(RuntimeError, match="the caller failed"), db.engine.begin() as connection:
        delete_collection_synchronously(connection, posts.id, "posts")
        raise RuntimeError("the caller failed")

    assert snapshot(db.engine) == before
    assert table_exists(db.engine, "ec_posts")
