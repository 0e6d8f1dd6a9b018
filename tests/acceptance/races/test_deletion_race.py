"""Races on collection-deletion tombstones with real concurrent connections."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import event, insert

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.deletion.local_guard import execute_local_deletion_guard
from media_usage_orchestration.store.deletion.records import DeletionPhase, GuardOutcome
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from tests.support.deletions import LEASE_SECONDS, claimed, tombstone
from tests.support.states import make_collection, one, status_row, waiter_on_table_lock

pytestmark = pytest.mark.slow

CONTENDERS = 8
WAIT_SECONDS = 10


def test_concurrent_claims_of_one_due_tombstone_have_one_winner(db):
    collection = make_collection(db.engine, "posts")
    tombstone(db.engine, collection)
    repo = DeletionRepository(db.engine)
    start = threading.Barrier(CONTENDERS)

    def contend(_):
        start.wait()
        return repo.claim(collection.id, DeletionPhase.FENCE, LEASE_SECONDS)

    with ThreadPoolExecutor(CONTENDERS) as pool:
        claims = list(pool.map(contend, range(CONTENDERS)))

    winners = [claim for claim in claims if claim is not None]
    assert len(winners) == 1
    row = one(db.engine, schema.collection_deletions, collection_id=collection.id)
    assert row["lease_token"] == winners[0].lease_token and row["state"] == "leased"


def _content_row(entry_id):
    return {"id": entry_id, "slug": entry_id, "locale": "en", "title": "racing"}


def _fence(db, claim):
    return execute_local_deletion_guard(
        db.engine, "fence", claim.collection_id, claim.collection_slug, claim.lease_token
    )


@pytest.mark.postgres_only("table locks exist only on PostgreSQL; SQLite serializes writers")
def test_fence_waits_for_an_open_content_insert_then_sees_it(db):
    collection = make_collection(db.engine, "posts")
    claim = claimed(db.engine, collection)
    content = schema.content_table("posts", [schema.ContentField("title", "TEXT")])

    with ThreadPoolExecutor(1) as pool, db.engine.connect() as writer:
        writer.execute(insert(content).values(**_content_row("entry-1")))
        fencing = pool.submit(_fence, db, claim)
        assert waiter_on_table_lock(db.engine, "ec_posts", WAIT_SECONDS), (
            "the fence did not wait for the open insert"
        )
        assert not fencing.done()
        writer.commit()
        outcome = fencing.result(timeout=WAIT_SECONDS)

    assert outcome is GuardOutcome.HAS_CONTENT
    assert status_row(db.engine, "posts")["capture_state"] == "active"


@pytest.mark.postgres_only("table locks exist only on PostgreSQL; SQLite serializes writers")
def test_an_insert_after_the_fence_lock_waits_until_the_fence_commits(db):
    collection = make_collection(db.engine, "posts")
    claim = claimed(db.engine, collection)
    content = schema.content_table("posts", [schema.ContentField("title", "TEXT")])
    locked, proceed = threading.Event(), threading.Event()

    def hold_after_lock(_conn, _cursor, statement, *_args):
        if statement.startswith("LOCK TABLE"):
            locked.set()
            proceed.wait(WAIT_SECONDS)

    def insert_entry():
        with db.engine.begin() as connection:
            connection.execute(insert(content).values(**_content_row("entry-1")))

    event.listen(db.engine, "after_cursor_execute", hold_after_lock)
    try:
        with ThreadPoolExecutor(2) as pool:
            fencing = pool.submit(_fence, db, claim)
            assert locked.wait(WAIT_SECONDS)
            inserting = pool.submit(insert_entry)
            assert waiter_on_table_lock(db.engine, "ec_posts", WAIT_SECONDS), (
                "the insert did not wait for the fence"
            )
            assert not inserting.done()
            proceed.set()
            assert fencing.result(timeout=WAIT_SECONDS) is GuardOutcome.FENCED
            inserting.result(timeout=WAIT_SECONDS)
    finally:
        proceed.set()
        event.remove(db.engine, "after_cursor_execute", hold_after_lock)

    assert status_row(db.engine, "posts")["capture_state"] == "deleting"
