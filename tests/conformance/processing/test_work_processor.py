"""EmDash's `media-usage-work-processor.test.ts`, on both dialects."""

from __future__ import annotations

import random
import threading

import pytest
from sqlalchemy import delete, text, update

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.loop.retry_policy import WORK_RETRY
from media_usage_orchestration.processing.work.processor import (
    JOBS_PER_TICK,
    ORDINARY_STATEMENTS_PER_JOB,
    WorkOutcome,
    is_terminal,
    process_due_work,
    process_work_after_write,
    work_error_code,
)
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.host import status as status_store
from tests.support.factories import draft_revision, insert_registry
from tests.support.projection import (
    active_collection,
    canonical_key,
    coverage,
    drop_row_trigger,
    find_source,
    insert_entry,
    occurrence_count,
    row_trigger,
    sql_statements,
    supersede_work_sql,
    work_count,
    work_for,
)
from tests.support.states import recorded_statements, set_activation, set_status


def test_inline_path_completes_the_job_and_trusted_coverage_becomes_complete(db):
    posts = active_collection(db.engine, "posts")
    insert_entry(db.engine, "posts", "entry-1")
    assert coverage(db.engine, posts)["status"] == "stale"

    outcome = process_work_after_write(db.engine, "posts", "entry-1")

    assert outcome is WorkOutcome.COMPLETED
    assert work_count(db.engine) == 0
    source = find_source(db.engine, canonical_key(posts, "entry-1"))
    assert source is not None
    assert (source.collection_id, source.collection_slug, source.content_id) == (
        posts.id,
        "posts",
        "entry-1",
    )
    assert source.identity_version == 1
    assert source.source_completeness == "complete"
    status = coverage(db.engine, posts)
    assert status["status"] == "complete"
    assert status["reconciliation_required"] == 0
    assert status["last_incremental_success_at"] is not None
    assert status["last_error_code"] is None
    assert occurrence_count(db.engine, source.source_key) == 1


def test_untrusted_coverage_is_not_completed_by_incremental_success(db):
    untrusted = active_collection(db.engine, "untrusted")
    set_status(db.engine, "untrusted", status="never", reconciliation_required=1)
    insert_entry(db.engine, "untrusted", "entry-1")

    outcome = process_work_after_write(db.engine, "untrusted", "entry-1")

    assert outcome is WorkOutcome.COMPLETED
    assert work_count(db.engine) == 0
    status = coverage(db.engine, untrusted)
    assert (status["status"], status["reconciliation_required"]) == ("never", 1)
    assert status["last_incremental_success_at"] is not None


def test_an_obsolete_terminal_failure_is_not_published_after_newer_work(db):
    collection = active_collection(db.engine, "failure_race")
    insert_entry(db.engine, "failure_race", "entry-1")
    failed_version = work_for(db.engine, "entry-1")["work_version"]
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.work)
            .where(schema.work.c.work_version == failed_version)
            .values(state="failed", last_error_code="OBSOLETE_FAILURE")
        )
        connection.execute(
            text(f"UPDATE {collection.table} SET title = 'newer projection' WHERE id = 'entry-1'")
        )

    with db.engine.begin() as connection:
        recorded = status_store.record_incremental_failure(
            connection, collection.id, "failure_race", "entry-1", failed_version, "OBSOLETE_FAILURE"
        )

    assert recorded is False
    work = work_for(db.engine, "entry-1")
    assert (work["state"], work["work_version"], work["last_error_code"]) == (
        "pending",
        failed_version + 1,
        None,
    )
    assert coverage(db.engine, collection)["status"] == "stale"


def test_a_tick_processes_one_job_and_the_backlog_stays_durable(db):
    articles = active_collection(db.engine, "articles")
    for index in range(3):
        insert_entry(db.engine, "articles", f"entry-{index}", f"media-{index}")

    result = process_due_work(db.engine)

    assert result.candidate_count == 3
    assert result.counts.claimed == JOBS_PER_TICK == 1
    assert result.counts.completed == 1
    assert result.admission_closed is True
    assert work_count(db.engine) == 2
    assert coverage(db.engine, articles)["status"] == "stale"

    process_due_work(db.engine)
    assert coverage(db.engine, articles)["status"] == "stale"
    process_due_work(db.engine)
    assert work_count(db.engine) == 0
    assert coverage(db.engine, articles)["status"] == "complete"


def test_only_one_of_two_overlapping_inline_calls_owns_the_job(db):
    notes = active_collection(db.engine, "notes")
    insert_entry(db.engine, "notes", "entry-1")
    barrier = threading.Barrier(2)
    outcomes: list[WorkOutcome] = []

    def inline() -> None:
        barrier.wait()
        outcomes.append(process_work_after_write(db.engine, "notes", "entry-1"))

    threads = [threading.Thread(target=inline) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert outcomes.count(WorkOutcome.COMPLETED) == 1
    assert set(outcomes) <= {WorkOutcome.COMPLETED, WorkOutcome.CLAIM_LOST, WorkOutcome.NOT_DUE}
    assert work_count(db.engine) == 0
    assert find_source(db.engine, canonical_key(notes, "entry-1")) is not None


def test_a_superseded_projection_keeps_the_work_and_redelivery_is_a_no_op(db):
    pages = active_collection(db.engine, "pages")
    insert_entry(db.engine, "pages", "entry-1")
    row_trigger(db, "test_supersede_work", schema.sources.name, supersede_work_sql("entry-1"))

    assert process_work_after_write(db.engine, "pages", "entry-1") is WorkOutcome.SUPERSEDED
    before = find_source(db.engine, canonical_key(pages, "entry-1"))
    assert before is not None
    assert work_count(db.engine) == 1

    drop_row_trigger(db, "test_supersede_work", schema.sources.name)
    assert process_work_after_write(db.engine, "pages", "entry-1") is WorkOutcome.COMPLETED
    after = find_source(db.engine, canonical_key(pages, "entry-1"))
    assert after.current_generation == before.current_generation
    assert work_count(db.engine) == 0


def test_snapshot_failures_retry_then_fail_terminally_and_publish_partial(db):
    news = active_collection(db.engine, "news")
    insert_entry(db.engine, "news", "entry-1")
    draft_revision(db.engine, "news", "entry-1", "{", revision_id="broken-revision")

    assert process_work_after_write(db.engine, "news", "entry-1") is WorkOutcome.RETRY
    work = work_for(db.engine, "entry-1")
    assert (work["state"], work["attempt_count"], work["last_error_code"]) == (
        "retry",
        1,
        "MEDIA_USAGE_SNAPSHOT_FAILED",
    )
    assert work["next_attempt_at"] > work["updated_at"]
    assert coverage(db.engine, news)["status"] == "stale"
    assert find_source(db.engine, canonical_key(news, "entry-1")) is None

    with db.engine.begin() as connection:
        connection.execute(
            update(schema.work).values(
                state="pending",
                attempt_count=WORK_RETRY.max_attempts - 1,
                next_attempt_at="2000-01-01T00:00:00.000Z",
            )
        )
    assert process_work_after_write(db.engine, "news", "entry-1") is WorkOutcome.FAILED
    work = work_for(db.engine, "entry-1")
    assert (work["state"], work["attempt_count"], work["last_error_code"]) == (
        "failed",
        WORK_RETRY.max_attempts,
        "MEDIA_USAGE_SNAPSHOT_FAILED",
    )
    status = coverage(db.engine, news)
    assert (status["status"], status["reconciliation_required"], status["last_error_code"]) == (
        "partial",
        0,
        "MEDIA_USAGE_SNAPSHOT_FAILED",
    )
    assert status["completed_at"] is None


def test_a_deleted_entry_completes_and_removes_its_sources(db):
    documents = active_collection(db.engine, "documents")
    insert_entry(db.engine, "documents", "entry-1")
    assert process_work_after_write(db.engine, "documents", "entry-1") is WorkOutcome.COMPLETED
    key = canonical_key(documents, "entry-1")
    assert find_source(db.engine, key) is not None

    CmsWriter(db.engine).delete_entry("documents", "entry-1")

    assert process_work_after_write(db.engine, "documents", "entry-1") is WorkOutcome.COMPLETED
    assert find_source(db.engine, key) is None
    assert occurrence_count(db.engine, key) == 0
    assert work_count(db.engine) == 0


def test_work_of_a_replaced_collection_is_obsolete_and_projects_nothing(db):
    original = active_collection(db.engine, "reused_slug")
    insert_entry(db.engine, "reused_slug", "entry-1")
    with db.engine.begin() as connection:
        connection.execute(delete(schema.collections).where(schema.collections.c.id == original.id))
    insert_registry(
        db.engine, id="replacement-collection-id", slug="reused_slug", label="Replacement"
    )

    result = process_due_work(db.engine)

    assert result.counts.obsolete == 1
    assert result.counts.claimed == 1
    assert work_count(db.engine) == 0
    assert find_source(db.engine, canonical_key(original, "entry-1")) is None
    assert occurrence_count(db.engine, canonical_key(original, "entry-1")) == 0


def test_an_ordinary_job_stays_inside_the_statement_envelope(db):
    active_collection(db.engine, "measured")
    insert_entry(db.engine, "measured", "entry-1")

    with recorded_statements(db.engine) as sent:
        outcome = process_work_after_write(db.engine, "measured", "entry-1")

    assert outcome is WorkOutcome.COMPLETED
    statements = sql_statements(sent)
    assert 0 < len(statements) <= ORDINARY_STATEMENTS_PER_JOB
    # SQLite has no FOR KEY SHARE lock on the registry row; everything else is the same.
    # The incremental success is one statement (no read of the epoch first).
    assert len(statements) == (16 if db.is_postgres else 15)


def test_inactive_capture_processes_nothing(db):
    active_collection(db.engine, "dormant")
    insert_entry(db.engine, "dormant", "entry-1")
    set_activation(db.engine, "expanded")

    assert process_work_after_write(db.engine, "dormant", "entry-1") is WorkOutcome.INACTIVE
    tick = process_due_work(db.engine)
    assert (tick.candidate_count, tick.counts.claimed, tick.admission_closed) == (0, 0, False)
    assert work_count(db.engine) == 1


def test_no_work_for_the_entry_is_not_due(db):
    active_collection(db.engine, "quiet")
    assert process_work_after_write(db.engine, "quiet", "missing") is WorkOutcome.NOT_DUE


@pytest.mark.parametrize(
    ("attempt_count", "lowest", "highest"),
    [(0, 30, 37), (1, 60, 74), (2, 120, 149), (3, 240, 299), (4, 480, 599), (5, 900, 900)],
)
def test_retry_delay_is_exponential_with_bounded_jitter(attempt_count, lowest, highest):
    class Fixed:
        def __init__(self, value: float) -> None:
            self.value = value

        def random(self) -> float:
            return self.value

    assert WORK_RETRY.delay_seconds(attempt_count, Fixed(0.0).random) == lowest
    assert WORK_RETRY.delay_seconds(attempt_count, Fixed(0.999999).random) == highest
    assert (
        lowest
        <= WORK_RETRY.delay_seconds(attempt_count, random.Random(attempt_count).random)
        <= highest
    )


def test_error_codes_and_terminal_attempts():
    assert work_error_code("DRAFT_REVISION_INVALID") == "MEDIA_USAGE_SNAPSHOT_FAILED"
    assert work_error_code("CONTENT_USAGE_GENERATION_CONFLICT") == "MEDIA_USAGE_GENERATION_CONFLICT"
    assert work_error_code("CONTENT_USAGE_RESOURCE_LIMIT") == "MEDIA_USAGE_RESOURCE_LIMIT"
    assert work_error_code("CONTENT_USAGE_REFRESH_ERROR") == "MEDIA_USAGE_PROCESSING_FAILED"
    assert work_error_code(None) == "MEDIA_USAGE_PROCESSING_FAILED"
    assert is_terminal("MEDIA_USAGE_RESOURCE_LIMIT", 0)
    assert not is_terminal("MEDIA_USAGE_PROCESSING_FAILED", WORK_RETRY.max_attempts - 2)
    assert is_terminal("MEDIA_USAGE_PROCESSING_FAILED", WORK_RETRY.max_attempts - 1)
