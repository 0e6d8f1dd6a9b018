"""The projection write protocol (`SourceRepository`): guarded publication and deletes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import delete, text, update

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.work.content_reads import load_content_snapshots
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.sources.writes import UNKNOWN_COMPLETENESS, SourceRepository
from tests.support.factories import insert_occurrences, insert_revision
from tests.support.projection import image, total_rows
from tests.support.states import count, make_collection


@pytest.fixture
def posts(db):
    collection = make_collection(db.engine, "posts")
    CmsWriter(db.engine).insert_entry(
        "posts",
        {"id": "entry-1", "slug": "entry-1", "title": "Entry", "hero": image("media-1")},
    )
    return collection


def snapshots(engine, collection, content_id: str = "entry-1"):
    loaded = load_content_snapshots(engine, collection.slug, content_id, collection.id)
    assert loaded.success
    return loaded.snapshots


def test_a_new_source_is_published_with_its_generation_and_lease_time(db, posts):
    (columns,) = snapshots(db.engine, posts)
    repository = SourceRepository(db.engine)

    result = repository.replace_source_if_matching(columns, None, None)

    assert (result.replaced, result.unchanged) == (True, False)
    stored = repository.find_source(columns.source_key)
    assert stored.source_fingerprint == columns.source_fingerprint
    assert stored.source_completeness == "complete"
    assert stored.last_attempted_at == stored.indexed_at == stored.updated_at
    items = count(db.engine, schema.occurrences, generation=stored.current_generation)
    assert items == 1
    assert total_rows(db.engine, schema.generation_writes) == 0


def test_an_unchanged_projection_is_not_rewritten(db, posts):
    (columns,) = snapshots(db.engine, posts)
    repository = SourceRepository(db.engine)
    repository.replace_source_if_matching(columns, None, None)
    observed = repository.find_source(columns.source_key)

    result = repository.replace_source_if_matching(columns, None, observed)

    assert (result.replaced, result.unchanged) == (False, True)
    assert repository.find_source(columns.source_key) == observed


@pytest.mark.parametrize(
    "change",
    [
        "DELETE FROM ec_posts WHERE id = 'entry-1'",
        "UPDATE ec_posts SET version = version + 1 WHERE id = 'entry-1'",
        "UPDATE ec_posts SET updated_at = '2099-01-01T00:00:00.000Z' WHERE id = 'entry-1'",
        "UPDATE ec_posts SET live_revision_id = 'rev-2' WHERE id = 'entry-1'",
    ],
    ids=["deleted", "newer-version", "newer-write", "stale-revision"],
)
def test_a_stale_snapshot_is_never_published(db, posts, change):
    (columns,) = snapshots(db.engine, posts)
    insert_revision(db.engine, id="rev-2")
    with db.engine.begin() as connection:
        connection.execute(text(change))
    repository = SourceRepository(db.engine)

    result = repository.replace_source_if_matching(columns, None, None)

    assert result.replaced is False
    assert repository.find_source(columns.source_key) is None
    # The losing generation is left for the projection GC; its write lease is released.
    assert count(db.engine, schema.occurrences, source_key=columns.source_key) == 1
    assert total_rows(db.engine, schema.generation_writes) == 0


def test_the_current_revision_is_published(db, posts):
    insert_revision(db.engine, id="rev-2")
    with db.engine.begin() as connection:
        connection.execute(
            text("UPDATE ec_posts SET live_revision_id = 'rev-2' WHERE id = 'entry-1'")
        )
    (columns,) = snapshots(db.engine, posts)

    assert SourceRepository(db.engine).replace_source_if_matching(columns, None, None).replaced
    assert SourceRepository(db.engine).find_source(columns.source_key).revision_id == "rev-2"


def test_a_replacement_loses_to_a_changed_row_and_reports_the_winner(db, posts):
    (columns,) = snapshots(db.engine, posts)
    repository = SourceRepository(db.engine)
    repository.replace_source_if_matching(columns, None, None)
    observed = repository.find_source(columns.source_key)
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.sources)
            .where(schema.sources.c.source_key == columns.source_key)
            .values(updated_at="2099-01-01T00:00:00.000Z")
        )
    changed = replace(columns, content_title="Another title", source_fingerprint=None)

    result = repository.replace_source_if_matching(changed, columns.occurrences, observed)

    assert result.replaced is False
    assert result.source.updated_at == "2099-01-01T00:00:00.000Z"
    assert result.source.current_generation == observed.current_generation


def test_no_lease_is_granted_once_the_collection_is_replaced(db, posts):
    (columns,) = snapshots(db.engine, posts)
    with db.engine.begin() as connection:
        connection.execute(delete(schema.collections).where(schema.collections.c.id == posts.id))

    result = SourceRepository(db.engine).replace_source_if_matching(columns, None, None)

    assert result.replaced is False
    assert total_rows(db.engine, schema.occurrences) == 0


def test_guarded_deletes_remove_the_source_and_its_current_generation(db, posts):
    (columns,) = snapshots(db.engine, posts)
    repository = SourceRepository(db.engine)
    repository.replace_source_if_matching(columns, None, None)
    observed = repository.find_source(columns.source_key)

    present = repository.delete_source_if_matching_content_absent(
        columns.source_key, observed, "posts", "entry-1"
    )
    assert (present.deleted, present.content_present) == (False, True)

    CmsWriter(db.engine).delete_entry("posts", "entry-1")
    absent = repository.delete_source_if_matching_content_absent(
        columns.source_key, observed, "posts", "entry-1"
    )
    assert absent.deleted is True
    assert repository.find_source(columns.source_key) is None
    assert count(db.engine, schema.occurrences, source_key=columns.source_key) == 0


def test_a_guarded_delete_of_a_changed_source_reports_it(db, posts):
    (columns,) = snapshots(db.engine, posts)
    repository = SourceRepository(db.engine)
    repository.replace_source_if_matching(columns, None, None)
    observed = repository.find_source(columns.source_key)
    stale = replace(observed, current_generation="01OLDERGENERATION000000000")

    result = repository.delete_source_if_matching(columns.source_key, stale)

    assert result.deleted is False
    assert result.source == observed
    assert repository.delete_source_if_matching(columns.source_key, observed).deleted is True


def test_withdrawn_trust_makes_the_next_replacement_republish(db, posts):
    (columns,) = snapshots(db.engine, posts)
    repository = SourceRepository(db.engine)
    repository.replace_source_if_matching(columns, None, None)
    observed = repository.find_source(columns.source_key)
    stale = replace(observed, current_generation="01OLDERGENERATION000000000")

    assert repository.withdraw_trust(stale) is False  # the row is not the one observed
    assert repository.find_source(columns.source_key) == observed
    assert repository.withdraw_trust(observed) is True

    withdrawn = repository.find_source(columns.source_key)
    assert withdrawn.source_completeness == UNKNOWN_COMPLETENESS
    assert (withdrawn.current_generation, withdrawn.source_fingerprint) == (
        observed.current_generation,
        observed.source_fingerprint,
    )
    assert repository.withdraw_trust(observed) is False  # its CAS columns moved on
    result = repository.replace_source_if_matching(columns, None, withdrawn)
    assert (result.replaced, result.unchanged) == (True, False)
    assert repository.find_source(columns.source_key).source_completeness == "complete"


def test_deletion_measurement_reads_at_most_one_row_past_the_limit(db, posts):
    generation = "01GENERATION00000000000000"
    insert_occurrences(
        db.engine,
        [
            {
                "source_key": "content:x:entry:columns",
                "index": index,
                "id": f"occ-{index:02d}",
                "generation": generation,
                "field_path": f"hero[{index}]",
                "occurrence_index": 0,
                "media_id": "é",
                "provider": "local",
                "provider_asset_id": "é",
            }
            for index in range(20)
        ],
    )
    repository = SourceRepository(db.engine)

    over = repository.measure_source_generation_deletion("content:x:entry:columns", generation)
    small = repository.measure_source_generation_deletion(
        "content:x:entry:columns", generation, limit=30
    )

    assert (over.occurrence_count, over.exceeds_occurrence_limit) == (13, True)
    assert (small.occurrence_count, small.exceeds_occurrence_limit) == (20, False)
    # "hero" + "hero[N]" + "image_field" + "é" + "local" + "é": é is two UTF-8 bytes.
    per_row = 4 + 7 + 11 + 2 + 5 + 2
    assert small.occurrence_bytes == 10 * per_row + 10 * (per_row + 1)
    with pytest.raises(ValueError, match="non-negative"):
        repository.measure_source_generation_deletion("content:x:entry:columns", generation, -1)
