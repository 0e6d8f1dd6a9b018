"""The batch path: several due jobs claimed per statement, each processed under its own lease."""

from __future__ import annotations

import itertools
import threading

from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.work.processor import WorkOutcome, process_due_batch
from media_usage_orchestration.store.core import schema
from tests.support.projection import (
    active_collection,
    canonical_key,
    drop_row_trigger,
    find_source,
    insert_entry,
    occurrence_count,
    row_trigger,
    supersede_work_sql,
    total_rows,
    work_count,
    work_for,
)
from tests.support.states import set_activation


def entries(engine, slug: str, content_ids) -> None:
    for content_id in content_ids:
        insert_entry(engine, slug, content_id, f"media-{content_id}")


def test_a_batch_completes_every_claimed_job_exactly_once(db):
    posts = active_collection(db.engine, "posts")
    content_ids = [f"entry-{index}" for index in range(6)]
    entries(db.engine, "posts", content_ids)

    result = process_due_batch(db.engine, 10)

    assert (result.counts.claimed, result.counts.completed) == (6, 6)
    assert (result.counts.retry, result.counts.superseded, result.counts.claim_lost) == (0, 0, 0)
    assert work_count(db.engine) == 0
    for content_id in content_ids:
        assert occurrence_count(db.engine, canonical_key(posts, content_id)) == 1
    assert total_rows(db.engine, schema.generation_writes) == 0
    assert not verify_index(db.engine).has_drift
    assert process_due_batch(db.engine, 10).counts.claimed == 0


def test_a_job_re_enqueued_while_claimed_is_superseded_and_processed_later(db):
    posts = active_collection(db.engine, "posts")
    entries(db.engine, "posts", ["entry-a", "entry-b", "entry-c"])
    # Publishing entry-a re-enqueues entry-b, which this batch has already claimed.
    row_trigger(
        db,
        "test_batch_supersede",
        schema.sources.name,
        supersede_work_sql("entry-b"),
        when="NEW.content_id = 'entry-a'",
    )

    first = process_due_batch(db.engine, 10)

    assert (first.counts.claimed, first.counts.completed, first.counts.superseded) == (3, 2, 1)
    assert work_for(db.engine, "entry-b")["state"] == "pending"
    published = find_source(db.engine, canonical_key(posts, "entry-b"))
    assert published is not None

    drop_row_trigger(db, "test_batch_supersede", schema.sources.name)
    second = process_due_batch(db.engine, 10)

    assert (second.counts.claimed, second.counts.completed) == (1, 1)
    assert work_count(db.engine) == 0
    redelivered = find_source(db.engine, canonical_key(posts, "entry-b"))
    assert redelivered.current_generation == published.current_generation


def test_an_aged_lease_is_renewed_and_a_lost_one_is_left_alone(db):
    posts = active_collection(db.engine, "posts")
    entries(db.engine, "posts", ["entry-a", "entry-b", "entry-c"])
    row_trigger(
        db,
        "test_batch_renewal",
        schema.sources.name,
        supersede_work_sql("entry-b"),
        when="NEW.content_id = 'entry-a'",
    )
    # Every reading of this clock is a minute later: each job's lease looks half spent.
    minutes = itertools.count(step=60.0)

    result = process_due_batch(db.engine, 10, lease_seconds=60, clock=lambda: next(minutes))

    assert (result.counts.claimed, result.counts.completed, result.counts.claim_lost) == (3, 2, 1)
    # entry-b's renewal failed before any work was done for it.
    assert find_source(db.engine, canonical_key(posts, "entry-b")) is None
    assert work_for(db.engine, "entry-b")["state"] == "pending"


def test_concurrent_batches_take_disjoint_jobs(db):
    posts = active_collection(db.engine, "posts")
    content_ids = [f"entry-{index}" for index in range(8)]
    entries(db.engine, "posts", content_ids)
    barrier = threading.Barrier(2)
    outcomes = []

    def worker() -> None:
        barrier.wait()
        for _ in range(4):
            outcomes.append(process_due_batch(db.engine, 2))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outcomes.append(process_due_batch(db.engine, 10))

    assert sum(result.counts.completed for result in outcomes) == 8
    assert sum(result.counts.superseded + result.counts.claim_lost for result in outcomes) == 0
    assert work_count(db.engine) == 0
    assert total_rows(db.engine, schema.occurrences) == 8
    for content_id in content_ids:
        assert find_source(db.engine, canonical_key(posts, content_id)) is not None


def test_a_batch_is_inert_while_capture_is_inactive(db):
    active_collection(db.engine, "posts")
    entries(db.engine, "posts", ["entry-1"])
    set_activation(db.engine, "expanded")

    result = process_due_batch(db.engine, 10)

    assert result.inactive is True
    assert result.counts.claimed == 0
    assert work_count(db.engine) == 1


def test_outcomes_report_whether_a_job_was_claimed():
    assert WorkOutcome.COMPLETED.claimed and WorkOutcome.OBSOLETE.claimed
    assert not WorkOutcome.CLAIM_LOST.claimed and not WorkOutcome.NOT_DUE.claimed


def test_a_batch_can_be_limited_to_one_collection(db):
    posts = active_collection(db.engine, "posts")
    active_collection(db.engine, "pages")
    entries(db.engine, "posts", ["entry-1", "entry-2"])
    entries(db.engine, "pages", ["entry-3"])

    result = process_due_batch(db.engine, 10, collection_id=posts.id)

    assert (result.counts.claimed, result.counts.completed) == (2, 2)
    assert work_count(db.engine) == 1
    assert work_for(db.engine, "entry-3")["state"] == "pending"
