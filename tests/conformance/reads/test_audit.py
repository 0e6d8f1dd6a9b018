"""The reads that check the index against the content (`store/reads/audit.py`): captured
collections, pages of rows, canonical sources and their current occurrences, sources whose
entry is gone, abandoned occurrences, open work, the demo's end-state checks, and the snapshot
a whole comparison reads in."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import DBAPIError

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.host.registry import RegisteredCollection
from media_usage_orchestration.store.reads.audit import (
    CapturedCoverage,
    abandoned_occurrence_count,
    canonical_source_rows,
    canonical_sources_without_entry,
    captured_collections,
    captured_coverage,
    collection_is_gone,
    complete_collection_slugs,
    current_occurrence_rows,
    database_now,
    entries_with_open_work,
    entry_counts,
    revisions_by_id,
    row_pages,
    rows_after,
    snapshot_read_transaction,
    work_count,
)
from tests.support.factories import (
    backing_off,
    failed,
    insert_deletion,
    insert_occurrences,
    insert_registry,
    insert_revision,
    insert_source,
    insert_status,
    insert_work,
    insert_works,
    leased,
    of,
    work_row,
)
from tests.support.states import db_now, make_collection, recorded_statements, set_status

POSTS_ID = "id-posts"


def key(content_id: str, collection_id: str = POSTS_ID) -> str:
    return f"content:{collection_id}:{content_id}:columns"


def _occurrences(source_key: str, generation: str, count: int) -> list[dict]:
    return [
        {
            "source_key": source_key,
            "index": index,
            "id": f"{source_key}|{generation}|{index}",
            "generation": generation,
            "media_id": f"{generation}-media-{index}",
        }
        for index in range(count)
    ]


@pytest.fixture
def posts(db):
    """`posts` with entries e1, e2 (a draft) and t1 (trashed); canonical sources of e1, e2 and
    of the gone entries g1, g2; a legacy source, another collection's source, superseded and
    orphaned occurrences."""
    collection = make_collection(db.engine, "posts", collection_id=POSTS_ID)
    writer = CmsWriter(db.engine)
    for content_id in ("e1", "e2", "t1"):
        writer.insert_entry("posts", {"id": content_id, "slug": content_id, "title": content_id})
    writer.save_draft("posts", "e2", {"title": "draft"})
    writer.trash_entry("posts", "t1")
    for content_id in ("e1", "e2", "g1", "g2"):
        insert_source(
            db.engine,
            key(content_id),
            **of(collection),
            content_id=content_id,
            current_generation="gen-2",
        )
    insert_source(
        db.engine, "legacy:posts:g3", **of(collection), content_id="g3", identity_version=None
    )
    insert_source(db.engine, key("x", "id-other"), collection_id="id-other", content_id="e1")
    insert_occurrences(
        db.engine,
        [
            *_occurrences(key("e1"), "gen-2", 2),  # current
            *_occurrences(key("e1"), "gen-1", 3),  # superseded: abandoned
            *_occurrences(key("e2"), "gen-2", 1),  # current
            *_occurrences(key("e9"), "gen-1", 2),  # no source row: orphaned
            *_occurrences("legacy:posts:g3", "gen-0", 4),  # not canonical
            *_occurrences(key("x", "id-other"), "generation-1", 5),  # another collection's
        ],
    )
    return collection


# --- captured collections ---------------------------------------------------------------------


def test_captured_collections_are_those_with_an_active_status_row_of_their_identity(db):
    for slug in ("delta", "alpha", "beta", "gamma"):
        make_collection(db.engine, slug, collection_id=f"id-{slug}")
    set_status(db.engine, "beta", capture_state="installing")
    set_status(db.engine, "gamma", collection_id="id-replaced")
    set_status(db.engine, "delta", status="complete", reconciliation_required=0, schema_version=3)

    with db.engine.connect() as connection:
        every = captured_collections(connection, None)
        some = captured_collections(connection, ["delta", "beta", "nothing"])
        coverage = captured_coverage(connection)

    assert every == [
        RegisteredCollection("id-alpha", "alpha"),
        RegisteredCollection("id-delta", "delta"),
    ]
    assert some == [RegisteredCollection("id-delta", "delta")]
    assert coverage == [
        CapturedCoverage("id-alpha", "alpha", "stale", 1, True),
        CapturedCoverage("id-delta", "delta", "complete", 3, False),
    ]


def test_a_status_row_of_another_adapter_does_not_capture(db):
    insert_registry(db.engine, id="id-posts", slug="posts")
    insert_status(
        db.engine, adapter_id="other-adapter", collection_id="id-posts", capture_state="active"
    )

    with db.engine.connect() as connection:
        assert captured_collections(connection, None) == []
        assert captured_coverage(connection) == []


# --- pages ------------------------------------------------------------------------------------


def test_rows_are_read_in_pages_of_their_unique_key(db):
    insert_works(db.engine, [{"content_id": f"entry-{index:02d}"} for index in (4, 0, 3, 1, 2)])
    query = select(schema.work.c.content_id, schema.work.c.state)
    by_id = schema.work.c.content_id

    with db.engine.connect() as connection:
        pages = list(row_pages(connection, query, by_id, 2))
        after = rows_after(connection, query, by_id, "entry-01", 2)
        first = rows_after(connection, query, by_id, None, 1)
        none = rows_after(connection, query, by_id, "entry-04", 10)

    assert [[row["content_id"] for row in page] for page in pages] == [
        ["entry-00", "entry-01"],
        ["entry-02", "entry-03"],
        ["entry-04"],
    ]
    assert pages[0][0] == {"content_id": "entry-00", "state": "pending"}
    assert [row["content_id"] for row in after] == ["entry-02", "entry-03"]
    assert [row["content_id"] for row in first] == ["entry-00"]
    assert none == []


def test_revisions_are_read_by_id(db):
    insert_revision(db.engine, id="rev-1", data='{"title":"One"}')
    insert_revision(db.engine, id="rev-2", entry_id="entry-2")

    with db.engine.connect() as connection:
        found = revisions_by_id(connection, ["rev-2", "rev-1", "rev-9"])

    assert sorted(found) == ["rev-1", "rev-2"]
    assert found["rev-1"] == {
        "id": "rev-1",
        "collection": "posts",
        "entry_id": "entry-1",
        "data": '{"title":"One"}',
    }


# --- sources and occurrences ------------------------------------------------------------------


def test_canonical_source_rows_are_the_collections_versioned_content_sources(db, posts):
    with db.engine.connect() as connection:
        rows = canonical_source_rows(connection, POSTS_ID, ["e1", "g1", "g3", "nothing"])

    assert sorted(row["source_key"] for row in rows) == [key("e1"), key("g1")]
    assert set(rows[0].keys()) == set(schema.sources.c.keys())  # every column
    assert {row["collection_id"] for row in rows} == {POSTS_ID}


def test_current_occurrences_are_those_of_each_sources_current_generation(db, posts):
    with db.engine.connect() as connection:
        rows = current_occurrence_rows(
            connection, POSTS_ID, ["e1", "e2", "g3"], ["id", "generation", "media_id"]
        )

    assert sorted((row["source_key"], row["media_id"]) for row in rows) == [
        (key("e1"), "gen-2-media-0"),
        (key("e1"), "gen-2-media-1"),
        (key("e2"), "gen-2-media-0"),
    ]
    assert set(rows[0].keys()) == {"source_key", "id", "generation", "media_id"}


def test_canonical_sources_whose_entry_is_gone_are_found_by_key_in_a_range(db, posts):
    with db.engine.connect() as connection:
        gone = canonical_sources_without_entry(connection, POSTS_ID, "posts")
        after = canonical_sources_without_entry(connection, POSTS_ID, "posts", after="g1")
        through = canonical_sources_without_entry(connection, POSTS_ID, "posts", through="g1")
        window = canonical_sources_without_entry(connection, POSTS_ID, "posts", "g1", "g1")

    assert gone == [(key("g1"), "g1"), (key("g2"), "g2")]
    assert after == [(key("g2"), "g2")]
    assert through == [(key("g1"), "g1")]
    assert window == []


def test_a_source_of_a_trashed_entry_still_has_its_entry(db, posts):
    insert_source(db.engine, key("t1"), **of(posts), content_id="t1")

    with db.engine.connect() as connection:
        gone = canonical_sources_without_entry(connection, POSTS_ID, "posts")

    assert [content_id for _, content_id in gone] == ["g1", "g2"]


def test_a_bad_slug_is_refused_before_any_sql(db, posts):
    with (
        db.engine.connect() as connection,
        recorded_statements(db.engine) as sent,
        pytest.raises(ValueError, match="Invalid collection slug"),
    ):
        canonical_sources_without_entry(connection, POSTS_ID, "x; drop table ec_posts")
    assert sent == []


def test_abandoned_occurrences_are_superseded_or_without_a_source(db, posts):
    with db.engine.connect() as connection:
        assert abandoned_occurrence_count(connection, POSTS_ID) == 3 + 2
        assert abandoned_occurrence_count(connection, "id-other") == 0
        assert abandoned_occurrence_count(connection, "id-unknown") == 0


# --- work -------------------------------------------------------------------------------------


def test_work_is_counted_per_collection_or_in_all(db):
    insert_works(
        db.engine,
        [{"content_id": "a"}, {"content_id": "b", **failed("X")}],
        collection_id="id-posts",
    )
    insert_work(db.engine, collection_id="id-pages", content_id="c")

    with db.engine.connect() as connection:
        assert work_count(connection, "id-posts") == 2
        assert work_count(connection, "id-pages") == 1
        assert work_count(connection, "id-none") == 0
        assert work_count(connection) == 3


def test_open_work_is_pending_leased_or_retrying(db):
    insert_works(
        db.engine,
        [
            {"content_id": "pending"},
            {"content_id": "leased", **leased()},
            {"content_id": "retry", **backing_off()},
            {"content_id": "failed", **failed("X")},
        ],
        collection_id="id-posts",
    )
    insert_work(db.engine, collection_id="id-pages", content_id="elsewhere")
    asked = ["pending", "leased", "retry", "failed", "elsewhere", "none"]

    with db.engine.connect() as connection:
        open_work = entries_with_open_work(connection, "id-posts", asked)
        with recorded_statements(db.engine) as sent:
            nothing = entries_with_open_work(connection, "id-posts", [])

    assert open_work == {"pending", "leased", "retry"}
    assert nothing == set() and sent == []


def test_database_now_is_the_databases_sortable_time(db):
    before = db_now(db.engine)
    with db.engine.connect() as connection:
        now = database_now(connection)

    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", now)
    assert before <= now <= db_now(db.engine)


# --- the demo's end-state checks --------------------------------------------------------------


def test_a_collection_with_nothing_left_is_gone(db, posts):
    with db.engine.connect() as connection:
        assert collection_is_gone(connection, "posts") is False
        assert collection_is_gone(connection, "pages") is True


@pytest.mark.parametrize("leftover", ["registry", "status", "tombstone", "source", "work", "table"])
def test_any_leftover_keeps_a_collection_from_being_gone(db, leftover):
    if leftover == "registry":
        insert_registry(db.engine, id="id-pages", slug="pages")
    if leftover == "status":
        insert_status(db.engine, scope_key="pages")
    if leftover == "tombstone":
        insert_deletion(db.engine, collection_id="id-pages", collection_slug="pages")
    if leftover == "source":
        insert_source(db.engine, key("x", "id-pages"), collection_slug="pages")
    if leftover == "work":
        insert_work(db.engine, collection_id="id-pages", collection_slug="pages")
    if leftover == "table":
        with db.engine.begin() as connection:
            schema.create_content_table(connection, "pages")

    with db.engine.connect() as connection:
        assert collection_is_gone(connection, "pages") is False


def test_complete_slugs_are_those_with_complete_trusted_coverage(db):
    make_collection(db.engine, "done", status="complete", reconciliation_required=0)
    make_collection(db.engine, "untrusted", status="complete", reconciliation_required=1)
    make_collection(db.engine, "stale", status="stale", reconciliation_required=0)
    insert_status(
        db.engine,
        adapter_id="other-adapter",
        scope_key="done_elsewhere",
        status="complete",
        reconciliation_required=0,
    )

    with db.engine.connect() as connection:
        assert complete_collection_slugs(connection) == {"done"}


def test_entry_counts_are_entries_drafts_and_trash(db, posts):
    with db.engine.connect() as connection:
        assert tuple(entry_counts(connection, "posts")) == (3, 1, 1)


# --- the snapshot -----------------------------------------------------------------------------


def test_a_comparison_reads_one_snapshot_however_many_statements_it_runs(db):
    insert_work(db.engine, content_id="before")

    with snapshot_read_transaction(db.engine) as connection:
        first = work_count(connection)
        with db.engine.begin() as writer:
            writer.execute(insert(schema.work).values(**work_row(content_id="during")))
        second = work_count(connection)

    with db.engine.connect() as connection:
        after = work_count(connection)
    assert (first, second, after) == (1, 1, 2)


@pytest.mark.postgres_only("SQLite's read transaction is a snapshot without a read-only mode")
def test_the_snapshot_refuses_writes(db):
    with (
        pytest.raises(DBAPIError, match="read-only transaction"),
        snapshot_read_transaction(db.engine) as connection,
    ):
        connection.execute(insert(schema.work).values(**work_row()))

    with db.engine.connect() as connection:
        assert work_count(connection) == 0
