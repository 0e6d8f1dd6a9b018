"""The bulk batch path: same outcomes and index as processing every claimed job one by one,
in a bounded number of statements per batch."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import func, select, text, update

from media_usage_orchestration.emdash_double.cms_writer import (
    CmsWriter,
    Collection,
    FieldSpec,
    SubField,
)
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.work import processor as work_processing
from media_usage_orchestration.processing.work.processor import WorkBatchResult, process_due_batch
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.sources import batch_writes
from media_usage_orchestration.store.work.records import WorkLease
from media_usage_orchestration.store.work.repository import WorkRepository
from media_usage_orchestration.store.work.statements import complete_leases
from tests.support.databases import TestDatabase
from tests.support.factories import insert_revision
from tests.support.projection import (
    active_collection,
    add_measured_draft,
    canonical_key,
    find_source,
    image,
    insert_entry,
    insert_measured_entry,
    row_trigger,
    sql_statements,
    supersede_work_sql,
    work_count,
    work_for,
)
from tests.support.states import all_rows, backdate, count, recorded_statements
from tests.support.triggers import create_trigger

POSTS_ID = "01J0POSTS0000000000000000A"
PAGES_ID = "01J0PAGES0000000000000000B"
POSTS = Collection(POSTS_ID, "posts")
FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("title", "string"),
    FieldSpec("hero", "image"),
    FieldSpec("body", "portableText"),
    FieldSpec("sections", "repeater", sub_fields=(SubField("image", "image"),)),
)
BULK_STATEMENT_BUDGET = 25


# --- a mixed batch ------------------------------------------------------------------------------

# Due order of the batch under test: every posts job, then the removed collection's jobs.
BATCH_ORDER = (
    "new-1",
    "new-2",
    "new-3",
    "unchanged-1",
    "unchanged-2",
    "edited-1",
    "edited-2",
    "deleted-1",
    "trashed-1",
    "draft-1",
    "draft-gone-1",
    "broken-draft-1",
    "oversized-1",
    "new-4",
    "page-1",
    "page-2",
)


def build_mixed_batch(database: TestDatabase) -> None:
    """Entries in every state a claimed batch can hold, their jobs due in `BATCH_ORDER`."""
    engine = database.engine
    writer = CmsWriter(engine)
    active_collection(engine, "posts", FIELDS, collection_id=POSTS_ID)
    for content_id in ("unchanged-1", "unchanged-2", "edited-1", "edited-2", "deleted-1"):
        insert_entry(engine, "posts", content_id, f"media-{content_id}")
    for content_id in ("trashed-1", "draft-1", "draft-gone-1", "broken-draft-1"):
        insert_entry(engine, "posts", content_id, f"media-{content_id}")
    add_measured_draft(engine, POSTS, "draft-gone-1", {"hero": image("media-draft-gone")})
    drain_one_by_one(engine)

    for content_id in ("new-1", "new-2", "new-3", "new-4"):
        insert_entry(engine, "posts", content_id, f"media-{content_id}")
    for content_id in ("unchanged-1", "unchanged-2"):
        writer.update_entry("posts", content_id, {"published_at": "2026-08-02T00:00:00.000Z"})
    writer.update_entry("posts", "edited-1", {"hero": image("media-edited-1-v2")})
    writer.update_entry("posts", "edited-2", {"title": "Edited title"})
    writer.delete_entry("posts", "deleted-1")
    writer.update_entry("posts", "trashed-1", {"deleted_at": "2026-08-03T00:00:00.000Z"})
    add_measured_draft(engine, POSTS, "draft-1", {"hero": image("media-draft-1"), "_slug": "draft"})
    insert_revision(
        engine, id="broken-revision", collection="posts", entry_id="broken-draft-1", data="{"
    )
    content = schema.content_table("posts")
    with engine.begin() as connection:
        for content_id, draft in (("draft-gone-1", None), ("broken-draft-1", "broken-revision")):
            connection.execute(
                update(content).where(content.c.id == content_id).values(draft_revision_id=draft)
            )
    insert_measured_entry(engine, "posts", "oversized-1", 13)

    active_collection(engine, "pages", FIELDS, collection_id=PAGES_ID)
    for content_id in ("page-1", "page-2"):
        insert_entry(engine, "pages", content_id, f"media-{content_id}")
    # Publishing new-1 re-enqueues new-4 (claimed, not yet acknowledged); publishing new-2
    # removes the pages collection from the registry.
    row_trigger(
        database,
        "test_bulk_supersede",
        schema.sources.name,
        supersede_work_sql("new-4"),
        when="NEW.content_id = 'new-1'",
    )
    row_trigger(
        database,
        "test_bulk_remove_pages",
        schema.sources.name,
        f"DELETE FROM _emdash_collections WHERE id = '{PAGES_ID}'",
        when="NEW.content_id = 'new-2'",
    )
    schedule(engine, BATCH_ORDER)


def schedule(engine, order) -> None:
    with engine.begin() as connection:
        for position, content_id in enumerate(order):
            stamp = f"2000-01-01T00:00:{position:02d}.000Z"
            connection.execute(
                update(schema.work)
                .where(schema.work.c.content_id == content_id)
                .values(next_attempt_at=stamp, updated_at=stamp)
            )


def drain_one_by_one(engine) -> None:
    while process_due_batch(engine, 50, bulk=False).counts.claimed:
        pass


def index_state(engine) -> dict[str, Any]:
    """Everything the processing decides, without generations and timestamps."""
    stamps = {
        "created_at",
        "updated_at",
        "indexed_at",
        "last_attempted_at",
        "current_generation",
        "source_updated_at",
    }
    with engine.connect() as connection:
        source_rows = connection.execute(select(schema.sources).order_by("source_key")).mappings()
        sources = {
            row["source_key"]: {k: v for k, v in row.items() if k not in stamps}
            for row in source_rows
        }
        current = connection.execute(
            select(schema.occurrences)
            .join(
                schema.sources,
                (schema.sources.c.source_key == schema.occurrences.c.source_key)
                & (schema.sources.c.current_generation == schema.occurrences.c.generation),
            )
            .order_by(schema.occurrences.c.source_key, schema.occurrences.c.field_path)
        ).mappings()
        occurrences = [
            (row["source_key"], row["field_path"], row["provider_asset_id"], row["media_kind"])
            for row in current
        ]
        jobs = {
            row["content_id"]: (
                row["state"],
                row["work_version"],
                row["attempt_count"],
                row["last_error_code"],
            )
            for row in connection.execute(select(schema.work)).mappings()
        }
        coverage = {
            row["scope_key"]: (
                row["status"],
                row["reconciliation_required"],
                row["last_error_code"],
                row["change_epoch"],
            )
            for row in connection.execute(select(schema.index_status)).mappings()
        }
        registry = sorted(connection.execute(select(schema.collections.c.id)).scalars())
    return {
        "sources": sources,
        "occurrences": occurrences,
        "jobs": jobs,
        "coverage": coverage,
        "registry": registry,
    }


def drift(engine) -> Counter:
    report = verify_index(engine)
    return Counter((d.kind.value, d.content_id, d.source_key) for d in report.differences)


def test_a_mixed_batch_in_bulk_ends_exactly_as_one_by_one(db, twin):
    build_mixed_batch(db)
    build_mixed_batch(twin)

    bulk = process_due_batch(db.engine, 50)
    one_by_one = process_due_batch(twin.engine, 50, bulk=False)

    assert counts(bulk) == counts(one_by_one)
    assert counts(bulk) == {
        "claimed": 16,
        "completed": 11,
        "retry": 1,
        "failed": 1,
        "superseded": 1,
        "obsolete": 2,
        "claim_lost": 0,
    }
    assert index_state(db.engine) == index_state(twin.engine)
    assert drift(db.engine) == drift(twin.engine)
    jobs = index_state(db.engine)["jobs"]
    assert jobs["broken-draft-1"][0::3] == ("retry", "MEDIA_USAGE_SNAPSHOT_FAILED")
    assert jobs["oversized-1"][0::3] == ("failed", "MEDIA_USAGE_RESOURCE_LIMIT")
    assert jobs["new-4"][0] == "pending"
    assert find_source(db.engine, canonical_key_of("deleted-1")) is None
    assert find_source(db.engine, canonical_key_of("draft-gone-1", "draft_overlay")) is None
    assert find_source(db.engine, canonical_key_of("draft-1", "draft_overlay")) is not None


def canonical_key_of(content_id: str, variant: str = "columns") -> str:
    return f"content:{POSTS_ID}:{content_id}:{variant}"


def counts(result: WorkBatchResult) -> dict[str, int]:
    return result.counts.as_dict()


def test_an_ordinary_mix_in_bulk_leaves_no_drift(db):
    posts = active_collection(db.engine, "posts", FIELDS)
    writer = CmsWriter(db.engine)
    for index in range(30):
        insert_entry(db.engine, "posts", f"entry-{index:02d}", f"media-{index}")
    assert process_due_batch(db.engine, 50).counts.completed == 30
    writer.update_entry("posts", "entry-00", {"hero": image("media-changed")})
    writer.update_entry("posts", "entry-01", {"published_at": "2026-08-02T00:00:00.000Z"})
    writer.delete_entry("posts", "entry-02")
    writer.trash_entry("posts", "entry-03")
    writer.save_draft("posts", "entry-04", {"hero": image("media-draft")})
    for index in range(30, 40):
        insert_entry(db.engine, "posts", f"entry-{index:02d}", f"media-{index}")

    result = process_due_batch(db.engine, 50)

    assert (result.counts.claimed, result.counts.completed) == (15, 15)
    assert work_count(db.engine) == 0
    report = verify_index(db.engine)
    assert not report.has_drift, report.differences[:5]
    assert find_source(db.engine, canonical_key(posts, "entry-02")) is None
    assert find_source(db.engine, canonical_key(posts, "entry-04", "draft_overlay")) is not None


# --- lost guards --------------------------------------------------------------------------------


def test_a_write_that_loses_its_guard_in_bulk_takes_the_per_item_path(db):
    posts = active_collection(db.engine, "posts", FIELDS)
    for content_id in ("entry-1", "entry-2"):
        insert_entry(db.engine, "posts", content_id, f"media-{content_id}")
    # A content write lands between the batch's snapshot and its publication (once).
    row_trigger(
        db,
        "test_bulk_concurrent_edit",
        schema.generation_writes.name,
        "UPDATE ec_posts SET title = 'edited meanwhile', version = version + 1 "
        "WHERE id = 'entry-1' AND title = 'entry-1'",
    )

    first = process_due_batch(db.engine, 50)

    # entry-2 was published in bulk; entry-1's bulk write lost its content guard, the per-item
    # path projected the edit, and the edit's own (captured) job superseded this one.
    assert (first.counts.claimed, first.counts.completed, first.counts.superseded) == (2, 1, 1)
    assert find_source(db.engine, canonical_key(posts, "entry-1")).content_title == (
        "edited meanwhile"
    )
    second = process_due_batch(db.engine, 50)
    assert (second.counts.claimed, second.counts.completed) == (1, 1)
    assert not verify_index(db.engine).has_drift


def test_a_completion_that_fails_takes_the_batch_writes_back_with_it(db, monkeypatch):
    posts = active_collection(db.engine, "posts", FIELDS)
    for content_id in ("entry-1", "entry-2"):
        insert_entry(db.engine, "posts", content_id, f"media-{content_id}")
    seen: dict[str, int] = {}
    complete_leases = work_processing.complete_leases

    def fail_inside_the_writes(connection, leases):
        # What the batch wrote so far is visible inside its own transaction only.
        seen["occurrences"] = connection.execute(
            select(func.count()).select_from(schema.occurrences)
        ).scalar()
        monkeypatch.setattr(work_processing, "complete_leases", complete_leases)
        raise RuntimeError("the completion failed")

    monkeypatch.setattr(work_processing, "complete_leases", fail_inside_the_writes)
    result = process_due_batch(db.engine, 50)

    # The bulk writes were taken back with the completion: no generation of the bulk write
    # survives and its write leases were released; the per-item path then did the work.
    assert seen["occurrences"] > 0
    assert (result.counts.claimed, result.counts.completed) == (2, 2)
    assert count(db.engine, schema.generation_writes) == 0
    generations = {row["generation"] for row in all_rows(db.engine, schema.occurrences)}
    current = {row["current_generation"] for row in all_rows(db.engine, schema.sources)}
    assert generations == current
    assert find_source(db.engine, canonical_key(posts, "entry-2")) is not None
    assert work_count(db.engine) == 0
    assert not verify_index(db.engine).has_drift


def test_a_batch_whose_rows_cannot_be_bound_releases_its_write_leases(db, monkeypatch):
    active_collection(db.engine, "posts", FIELDS)
    for content_id in ("entry-1", "entry-2"):
        insert_entry(db.engine, "posts", content_id, f"media-{content_id}")
    leases_held: list[int] = []

    def unbindable(_dialect, _leased):
        leases_held.append(count(db.engine, schema.generation_writes))
        raise RuntimeError("the rows could not be bound")

    monkeypatch.setattr(batch_writes._BoundPublications, "of", staticmethod(unbindable))
    result = process_due_batch(db.engine, 50)

    # The bulk write took its two leases and gave them back; the per-item path did the work.
    assert leases_held == [2]
    assert (result.counts.claimed, result.counts.completed) == (2, 2)
    assert count(db.engine, schema.generation_writes) == 0
    assert not verify_index(db.engine).has_drift


def test_completion_acknowledges_only_leases_still_held(db):
    active_collection(db.engine, "posts", FIELDS)
    for index in range(4):
        insert_entry(db.engine, "posts", f"entry-{index}", f"media-{index}")
    repository = WorkRepository(db.engine)
    held, superseded, expired, forged = repository.claim_due_batch(4, 60)
    with db.engine.begin() as connection:
        connection.execute(text(supersede_work_sql(superseded.content_id)))
    backdate(db.engine, schema.work, "lease_expires_at", 1, content_id=expired.content_id)
    wrong_token = WorkLease(forged.collection_id, forged.content_id, forged.work_version, "x")

    with db.engine.begin() as connection:
        completed = complete_leases(
            connection, [held.lease, superseded.lease, expired.lease, wrong_token]
        )

    assert completed == {(held.collection_id, held.content_id)}
    assert work_for(db.engine, held.content_id) is None
    assert work_for(db.engine, superseded.content_id)["state"] == "pending"
    assert work_for(db.engine, expired.content_id)["lease_token"] == expired.lease_token
    assert work_for(db.engine, forged.content_id)["lease_token"] == forged.lease_token


# --- cost ---------------------------------------------------------------------------------------


def test_a_batch_of_fifty_costs_a_bounded_number_of_statements(db):
    posts = active_collection(db.engine, "posts", FIELDS)
    for index in range(50):
        insert_entry(db.engine, "posts", f"entry-{index:02d}", f"media-{index}")

    with recorded_statements(db.engine) as sent:
        created = process_due_batch(db.engine, 50)
    assert created.counts.completed == 50
    assert len(sql_statements(sent)) <= BULK_STATEMENT_BUDGET

    writer = CmsWriter(db.engine)
    for index in range(50):
        changes = {"hero": image(f"media-{index}-v2")} if index % 2 else {"published_at": "x"}
        writer.update_entry("posts", f"entry-{index:02d}", changes)
    with recorded_statements(db.engine) as sent:
        replaced = process_due_batch(db.engine, 50)
    assert replaced.counts.completed == 50
    assert len(sql_statements(sent)) <= BULK_STATEMENT_BUDGET
    assert find_source(db.engine, canonical_key(posts, "entry-01")).content_title == "entry-01"
    assert not verify_index(db.engine).has_drift


# --- concurrency --------------------------------------------------------------------------------


def audit_completions(database: TestDatabase) -> None:
    """Every deletion of a work row (a completion) is logged with the lease it acknowledged."""
    with database.engine.begin() as connection:
        connection.execute(
            text(
                "CREATE TABLE test_completed "
                "(content_id TEXT, work_version BIGINT, state TEXT, lease_token TEXT)"
            )
        )
    create_trigger(
        database.engine,
        "test_audit",
        table="_emdash_media_usage_work",
        event="AFTER DELETE",
        action="INSERT INTO test_completed (content_id, work_version, state, lease_token) "
        "VALUES (OLD.content_id, OLD.work_version, OLD.state, OLD.lease_token)",
    )


@pytest.mark.slow
def test_concurrent_bulk_processors_never_complete_a_job_twice(db):
    active_collection(db.engine, "posts", FIELDS)
    audit_completions(db)
    for index in range(120):
        insert_entry(db.engine, "posts", f"entry-{index:03d}", f"media-{index}")
    start = threading.Barrier(4)
    results: list[WorkBatchResult] = []
    errors: list[BaseException] = []
    busy: set[str] = set()
    # Each processor holds after its first batch until the three have one: on a loaded host
    # one thread could otherwise drain all twelve batches before the others claim any.
    first_batches = threading.Barrier(3, timeout=60)

    def processor() -> None:
        try:
            start.wait()
            while (batch := process_due_batch(db.engine, 10)).counts.claimed:
                results.append(batch)
                if threading.current_thread().name not in busy:
                    busy.add(threading.current_thread().name)
                    first_batches.wait()
        except BaseException as error:  # reported below
            errors.append(error)

    def editor() -> None:
        try:
            start.wait()
            writer = CmsWriter(db.engine)
            for index in range(0, 120, 7):
                writer.update_entry("posts", f"entry-{index:03d}", {"hero": image(f"v2-{index}")})
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=processor) for _ in range(3)]
    threads.append(threading.Thread(target=editor))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(busy) == 3, "the processors never overlapped"
    results.extend(drain_with_retries_due(db.engine))

    with db.engine.connect() as connection:
        logged = connection.execute(
            text("SELECT content_id, work_version, state, lease_token FROM test_completed")
        ).all()
    # Each deletion acknowledged a live lease of its own, and was reported by exactly one
    # processor: a second report of the same completion would make the sum exceed the log.
    assert all(state == "leased" and token for _, _, state, token in logged)
    tokens = [token for _, _, _, token in logged]
    assert len(tokens) == len(set(tokens))
    assert sum(result.counts.completed for result in results) == len(logged)
    assert {row[0] for row in logged} == {f"entry-{i:03d}" for i in range(120)}
    assert work_count(db.engine) == 0
    assert not verify_index(db.engine).has_drift


def drain_with_retries_due(engine) -> list[WorkBatchResult]:
    """Process everything left, making retries due at once (time moves by backdating)."""
    results = []
    while work_count(engine):
        backdate(engine, schema.work, "next_attempt_at", 1, state="retry")
        batch = process_due_batch(engine, 50)
        results.append(batch)
        assert batch.counts.claimed, "work remains that nothing can claim"
    return results
