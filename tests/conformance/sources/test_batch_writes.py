"""Canonical projection of many sources of one collection at once (`store/sources/batch_writes.py`):
each row of a batch keeps its own guards (its write lease, its expected columns, its content
row, the collection identity), so each lands or not exactly as it would alone; what landed is
reported, the write leases are released, and a failed transaction takes every write back."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import delete, func, select, text, update

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.work.content_reads import load_content_snapshots
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.sources.batch_writes import (
    BatchWriteResult,
    Publication,
    Removal,
    measure_generation_deletions,
    write_collection_batch,
)
from media_usage_orchestration.store.sources.writes import SourceRepository
from tests.support.factories import insert_occurrences, insert_registry
from tests.support.projection import image, sql_statements, total_rows
from tests.support.states import count, make_collection, recorded_statements, snapshot

ENTRIES = ("entry-1", "entry-2", "entry-3")


@pytest.fixture
def posts(db):
    collection = make_collection(db.engine, "posts")
    writer = CmsWriter(db.engine)
    for content_id in ENTRIES:
        writer.insert_entry(
            "posts",
            {"id": content_id, "slug": content_id, "title": content_id, "hero": image(content_id)},
        )
    return collection


def columns_of(db, collection, content_id: str):
    """The entry's `columns` snapshot as it is now."""
    loaded = load_content_snapshots(db.engine, collection.slug, content_id, collection.id)
    assert loaded.success
    (columns,) = loaded.snapshots
    return columns


def batch(db, collection, publications=(), removals=(), then=None) -> BatchWriteResult:
    return write_collection_batch(
        db.engine, collection.id, collection.slug, publications, removals, then
    )


def stored(db, source_key: str):
    return SourceRepository(db.engine).find_source(source_key)


def published(db, collection, *content_ids: str) -> dict:
    """The entries' sources published by one batch; their stored rows by content id."""
    sources = {content_id: columns_of(db, collection, content_id) for content_id in content_ids}
    result = batch(db, collection, [Publication(source, None) for source in sources.values()])
    assert result.published == {source.source_key for source in sources.values()}
    return {content_id: stored(db, source.source_key) for content_id, source in sources.items()}


# --- publication ------------------------------------------------------------------------------


def test_new_sources_are_published_each_under_a_generation_of_its_own(db, posts):
    sources = [columns_of(db, posts, content_id) for content_id in ENTRIES]

    result = batch(db, posts, [Publication(source, None) for source in sources])

    assert result == BatchWriteResult(frozenset(s.source_key for s in sources), frozenset())
    rows = [stored(db, source.source_key) for source in sources]
    assert len({row.current_generation for row in rows}) == 3
    for source, row in zip(sources, rows, strict=True):
        assert row.source_fingerprint == source.source_fingerprint
        assert (row.source_completeness, row.last_error_code) == ("complete", None)
        assert row.indexed_at == row.updated_at == row.last_attempted_at
        assert row.content_title == source.content_id
        occurrences = count(db.engine, schema.occurrences, source_key=source.source_key)
        assert occurrences == count(
            db.engine, schema.occurrences, generation=row.current_generation
        )
        assert occurrences == 1
    assert total_rows(db.engine, schema.generation_writes) == 0  # every lease released


def test_a_changed_projection_replaces_the_observed_row(db, posts):
    observed = published(db, posts, "entry-1")["entry-1"]
    CmsWriter(db.engine).update_entry("posts", "entry-1", {"title": "Edited", "hero": image("new")})
    changed = columns_of(db, posts, "entry-1")

    result = batch(db, posts, [Publication(changed, observed)])

    assert result.published == {changed.source_key}
    row = stored(db, changed.source_key)
    assert row.current_generation != observed.current_generation
    assert (row.content_title, row.source_version) == ("Edited", 2)
    # The superseded generation stays for the projection GC.
    assert count(db.engine, schema.occurrences, source_key=changed.source_key) == 2
    assert total_rows(db.engine, schema.generation_writes) == 0


def test_a_row_whose_guard_fails_is_left_and_the_others_land(db, posts):
    observed = published(db, posts, "entry-1", "entry-2")
    # entry-1: another writer published it after this batch observed it.
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.sources)
            .where(schema.sources.c.source_key == observed["entry-1"].source_key)
            .values(updated_at="2099-01-01T00:00:00.000Z")
        )
    # entry-3: a first publication, but its row appeared meanwhile.
    first = columns_of(db, posts, "entry-3")
    assert batch(db, posts, [Publication(first, None)]).published == {first.source_key}
    winner = stored(db, first.source_key)
    edited = {
        content_id: replace(columns_of(db, posts, content_id), content_title="Batch")
        for content_id in ENTRIES
    }

    result = batch(
        db,
        posts,
        [
            Publication(edited["entry-1"], observed["entry-1"]),
            Publication(edited["entry-2"], observed["entry-2"]),
            Publication(edited["entry-3"], None),
        ],
    )

    assert result.published == {edited["entry-2"].source_key}
    assert stored(db, edited["entry-2"].source_key).content_title == "Batch"
    assert stored(db, edited["entry-1"].source_key).updated_at == "2099-01-01T00:00:00.000Z"
    assert stored(db, first.source_key) == winner
    assert total_rows(db.engine, schema.generation_writes) == 0


@pytest.mark.parametrize(
    "change",
    [
        "DELETE FROM ec_posts WHERE id = 'entry-1'",
        "UPDATE ec_posts SET version = version + 1 WHERE id = 'entry-1'",
        "UPDATE ec_posts SET updated_at = '2099-01-01T00:00:00.000Z' WHERE id = 'entry-1'",
    ],
    ids=["deleted", "newer-version", "newer-write"],
)
def test_a_stale_snapshot_is_never_published(db, posts, change):
    stale, fresh = columns_of(db, posts, "entry-1"), columns_of(db, posts, "entry-2")
    with db.engine.begin() as connection:
        connection.execute(text(change))

    result = batch(db, posts, [Publication(stale, None), Publication(fresh, None)])

    assert result.published == {fresh.source_key}
    assert stored(db, stale.source_key) is None
    # The losing generation is left for the projection GC; its write lease is released.
    assert count(db.engine, schema.occurrences, source_key=stale.source_key) == 1
    assert total_rows(db.engine, schema.generation_writes) == 0


def test_a_replaced_collection_is_granted_no_write_lease(db, posts):
    sources = [columns_of(db, posts, content_id) for content_id in ENTRIES]
    with db.engine.begin() as connection:
        connection.execute(delete(schema.fields))
        connection.execute(delete(schema.collections))
    insert_registry(db.engine, id="id-replacement", slug="posts")
    before = snapshot(db.engine)

    result = batch(db, posts, [Publication(source, None) for source in sources])

    assert result == BatchWriteResult()
    assert snapshot(db.engine) == before  # no lease, no occurrence, no source


def test_a_batch_runs_in_the_same_statements_whatever_its_size(db, posts):
    writer = CmsWriter(db.engine)
    for index in range(4, 10):
        content_id = f"entry-{index}"
        writer.insert_entry("posts", {"id": content_id, "title": content_id, "hero": image("m")})
    small = [columns_of(db, posts, content_id) for content_id in ("entry-1", "entry-2")]
    large = [columns_of(db, posts, f"entry-{index}") for index in range(3, 10)]

    with recorded_statements(db.engine) as sent_small:
        batch(db, posts, [Publication(source, None) for source in small])
    with recorded_statements(db.engine) as sent_large:
        batch(db, posts, [Publication(source, None) for source in large])

    assert len(sql_statements(sent_large)) == len(sql_statements(sent_small))
    assert count(db.engine, schema.sources) == 9


# --- removal ----------------------------------------------------------------------------------


def test_a_removal_deletes_the_observed_source_and_its_current_occurrences(db, posts):
    observed = published(db, posts, "entry-1", "entry-2")
    leftover = [
        {"source_key": observed["entry-1"].source_key, "id": "old", "generation": "old-gen"}
    ]
    insert_occurrences(db.engine, leftover)

    result = batch(db, posts, removals=[Removal(observed["entry-1"])])

    assert result == BatchWriteResult(frozenset(), frozenset({observed["entry-1"].source_key}))
    assert stored(db, observed["entry-1"].source_key) is None
    # Only the current generation goes with it: older ones are the projection GC's.
    remaining = count(db.engine, schema.occurrences, source_key=observed["entry-1"].source_key)
    assert remaining == 1
    assert stored(db, observed["entry-2"].source_key) == observed["entry-2"]


def test_a_removal_of_a_changed_source_changes_nothing(db, posts):
    observed = published(db, posts, "entry-1")["entry-1"]
    stale = replace(observed, current_generation="01OLDERGENERATION000000000")
    before = snapshot(db.engine)

    result = batch(db, posts, removals=[Removal(stale)])

    assert result.removed == frozenset()
    assert snapshot(db.engine) == before


def test_a_removal_for_gone_content_waits_for_the_content_to_be_gone(db, posts):
    observed = published(db, posts, "entry-1")["entry-1"]
    removal = Removal(observed, absent_content_id="entry-1")
    before = snapshot(db.engine)

    assert batch(db, posts, removals=[removal]).removed == frozenset()
    assert snapshot(db.engine) == before

    CmsWriter(db.engine).delete_entry("posts", "entry-1")
    assert batch(db, posts, removals=[removal]).removed == {observed.source_key}
    assert stored(db, observed.source_key) is None


def test_a_removal_after_a_publication_waits_for_it_to_land(db, posts):
    observed = published(db, posts, "entry-1", "entry-2")
    # entry-2's draft is dropped only once entry-1's columns are published (same batch).
    lands = replace(columns_of(db, posts, "entry-1"), content_title="Lands")
    loses = replace(columns_of(db, posts, "entry-3"), content_title="Loses")
    with db.engine.begin() as connection:
        connection.execute(text("UPDATE ec_posts SET version = 9 WHERE id = 'entry-3'"))

    result = batch(
        db,
        posts,
        [Publication(lands, observed["entry-1"]), Publication(loses, None)],
        [Removal(observed["entry-2"], after=frozenset({lands.source_key, loses.source_key}))],
    )

    assert result == BatchWriteResult(frozenset({lands.source_key}), frozenset())
    assert stored(db, observed["entry-2"].source_key) == observed["entry-2"]


def test_a_removal_needs_the_collection_identity_current(db, posts):
    observed = published(db, posts, "entry-1")["entry-1"]
    with db.engine.begin() as connection:
        connection.execute(delete(schema.fields))
        connection.execute(delete(schema.collections))
    before = snapshot(db.engine)

    assert batch(db, posts, removals=[Removal(observed)]).removed == frozenset()
    assert snapshot(db.engine) == before


# --- the batch's transaction ------------------------------------------------------------------


def test_then_sees_the_batchs_writes_and_what_landed(db, posts):
    sources = [columns_of(db, posts, content_id) for content_id in ("entry-1", "entry-2")]
    seen = {}

    def then(connection, result):
        seen["result"] = result
        counted = select(func.count()).select_from(schema.sources)
        seen["sources"] = connection.execute(counted).scalar_one()

    result = batch(db, posts, [Publication(source, None) for source in sources], then=then)

    assert seen == {"result": result, "sources": 2}


def test_a_failure_in_then_takes_every_write_back_and_releases_the_leases(db, posts):
    observed = published(db, posts, "entry-1")["entry-1"]
    fresh = columns_of(db, posts, "entry-2")
    before = snapshot(db.engine)

    def then(_connection, _result):
        raise RuntimeError("the completion failed")

    with pytest.raises(RuntimeError, match="the completion failed"):
        batch(db, posts, [Publication(fresh, None)], [Removal(observed)], then=then)

    assert snapshot(db.engine) == before


# --- bad input --------------------------------------------------------------------------------


def _bad_batches(db, posts):
    one, two = columns_of(db, posts, "entry-1"), columns_of(db, posts, "entry-2")
    observed = published(db, posts, "entry-3")["entry-3"]
    return {
        "no collection id": (("", "posts", [Publication(one, None)], []), "collection ID"),
        "a key twice": (
            (posts.id, "posts", [Publication(one, None), Publication(one, None)], []),
            "more than once",
        ),
        "published and removed": (
            (posts.id, "posts", [Publication(observed_source(db, posts), None)], [observed]),
            "more than once",
        ),
        "another slug": (
            (posts.id, "pages", [Publication(one, None)], []),
            "another collection identity",
        ),
        "another id": (
            (posts.id, "posts", [Publication(replace(two, collection_id="x"), None)], []),
            "another collection identity",
        ),
        "removal of another collection": (
            (posts.id, "posts", [], [replace(observed, collection_slug="pages")]),
            "another collection identity",
        ),
        "legacy source": (
            (posts.id, "posts", [Publication(replace(one, identity_version=None), None)], []),
            "only canonical content sources",
        ),
        "not content": (
            (posts.id, "posts", [Publication(replace(one, source_type="setting"), None)], []),
            "only canonical content sources",
        ),
    }


def observed_source(db, posts):
    return columns_of(db, posts, "entry-3")


BAD_BATCHES = [
    "no collection id",
    "a key twice",
    "published and removed",
    "another slug",
    "another id",
    "removal of another collection",
    "legacy source",
    "not content",
]


@pytest.mark.parametrize("name", BAD_BATCHES)
def test_a_bad_batch_is_refused_before_any_sql(db, posts, name):
    (collection_id, slug, publications, removed), message = _bad_batches(db, posts)[name]
    removals = [Removal(expected) for expected in removed]
    before = snapshot(db.engine)

    with recorded_statements(db.engine) as sent, pytest.raises(ValueError, match=message):
        write_collection_batch(db.engine, collection_id, slug, publications, removals)

    assert sent == []
    assert snapshot(db.engine) == before


def test_an_empty_batch_writes_nothing(db, posts):
    calls = []

    result = batch(db, posts, then=lambda _connection, landed: calls.append(landed))

    assert result == BatchWriteResult() and calls == [BatchWriteResult()]
    assert total_rows(db.engine, schema.sources) == 0


# --- measuring deletions ----------------------------------------------------------------------


def test_deletions_are_measured_for_many_sources_as_one_by_one(db, posts):
    observed = published(db, posts, "entry-1", "entry-2")
    key = observed["entry-1"].source_key
    generation = observed["entry-1"].current_generation
    insert_occurrences(
        db.engine,
        [
            {"source_key": key, "index": index, "id": f"extra-{index}", "generation": generation}
            for index in range(1, 5)
        ],
    )
    empty = replace(
        observed["entry-2"],
        source_key="content:nothing-left",
        current_generation="01EMPTYGENERATION000000000",
    )
    rows = [observed["entry-1"], observed["entry-2"], empty]
    single = SourceRepository(db.engine)

    with db.engine.connect() as connection:
        measured = measure_generation_deletions(connection, rows, limit=3)
        roomy = measure_generation_deletions(connection, rows, limit=10)
        with recorded_statements(db.engine) as sent:
            nothing = measure_generation_deletions(connection, [], limit=3)

    assert set(measured) == {row.source_key for row in rows}
    assert (measured[key].occurrence_count, measured[key].exceeds_occurrence_limit) == (5, True)
    for row in rows:
        one_by_one = single.measure_source_generation_deletion(
            row.source_key, row.current_generation, limit=10
        )
        assert roomy[row.source_key] == one_by_one
    second = measured[observed["entry-2"].source_key]
    assert (second.occurrence_count, second.exceeds_occurrence_limit) == (1, False)
    assert measured["content:nothing-left"] == roomy["content:nothing-left"]
    assert (roomy["content:nothing-left"].occurrence_count, roomy[key].occurrence_bytes > 0) == (
        0,
        True,
    )
    assert nothing == {} and sent == []
