"""The scrubber's slices (`processing/integrity/scrub.py`) on both dialects: sources of a gone entry, open
work, the time budget."""

from __future__ import annotations

from media_usage_orchestration.emdash_double.sample_content import sample_entry
from media_usage_orchestration.processing.integrity.scrub import (
    ScrubLimits,
    ScrubPosition,
    scrub_tick,
)
from media_usage_orchestration.processing.integrity.verify import DriftKind, verify_index
from media_usage_orchestration.processing.operator.actions import retry_work_item
from media_usage_orchestration.store.core import schema
from tests.support.projection import canonical_key, drain, processed_collection
from tests.support.states import count, one, set_status

ALL_AT_ONCE = ScrubLimits(entries=100, seconds=30.0)


def delete_entry_behind_the_index(engine, collection, content_id: str) -> None:
    """The entry's row goes and so does the work its capture trigger opened: its sources
    stay behind with nothing left to remove them."""
    with engine.begin() as connection:
        connection.exec_driver_sql(f"DELETE FROM {collection.table} WHERE id = '{content_id}'")
        connection.execute(schema.work.delete().where(schema.work.c.content_id == content_id))


def test_the_sources_of_a_gone_entry_are_found_and_their_work_created(db):
    articles = processed_collection(db.engine)
    gone = sample_entry("art", 7)["id"]
    delete_entry_behind_the_index(db.engine, articles, gone)
    set_status(db.engine, "articles", status="complete")

    tick = scrub_tick(db.engine, ScrubPosition(), ALL_AT_ONCE)

    assert tick.sweep is not None and tick.sweep.entries_seen == 7
    assert [(d.kind, d.content_id, d.source_key) for d in tick.slice.confirmed] == [
        (DriftKind.UNEXPECTED_SOURCE, gone, canonical_key(articles, gone))
    ]
    [heal] = tick.slice.heals
    assert (heal.content_id, heal.changed, heal.trust_withdrawn) == (gone, True, ())
    assert one(db.engine, schema.work, content_id=gone)["state"] == "pending"
    drain(db.engine)
    assert not verify_index(db.engine).has_drift


def test_entries_with_open_work_are_skipped_not_reported(db):
    articles = processed_collection(db.engine)
    entry = sample_entry("art", 2)["id"]
    with db.engine.begin() as connection:
        connection.execute(
            schema.occurrences.delete().where(
                schema.occurrences.c.source_key == canonical_key(articles, entry)
            )
        )
    assert retry_work_item(db.engine, "articles", entry).changed  # its work is pending
    set_status(db.engine, "articles", status="complete")

    tick = scrub_tick(db.engine, ScrubPosition(), ALL_AT_ONCE)

    assert (tick.slice.entries_seen, tick.slice.entries_checked) == (8, 7)
    assert tick.slice.entries_skipped == 1
    assert tick.slice.confirmed == [] and tick.slice.heals == []
    assert tick.position.differences == 0
    assert count(db.engine, schema.work) == 1


def test_the_time_budget_ends_a_slice_after_its_guaranteed_entry(db):
    processed_collection(db.engine)
    position = ScrubPosition()
    walked = []

    for _ in range(3):
        tick = scrub_tick(db.engine, position, ScrubLimits(entries=100, seconds=1e-9))
        position = tick.position
        walked.append((tick.slice.entries_seen, position.after, tick.sweep is None))

    art = sample_entry("art", 0)["id"][:-1]
    assert walked == [(1, f"{art}0", True), (1, f"{art}1", True), (1, f"{art}2", True)]
