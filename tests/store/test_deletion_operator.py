"""Operator views of collection deletions (upstream `…-deletion-operator`): redacted pages with
cursors, and retry of failed, retrying and lease-expired tombstones."""

from __future__ import annotations

import dataclasses

import pytest

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.leases import LeaseState
from media_usage_orchestration.store.deletions import (
    DeletionPhase,
    DeletionRepository,
    OperatorDeletionItem,
)
from media_usage_orchestration.values.cursors import encode_cursor
from media_usage_orchestration.values.errors import InvalidCursorError
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome
from tests.store.deletion_helpers import (
    LEASE_SECONDS,
    claimed,
    expire_lease,
    set_tombstone,
    tombstone,
)
from tests.support import db_now, make_collection, one, snapshot

FAILED_CODE = "MEDIA_USAGE_COLLECTION_DELETION_FAILED"


@pytest.fixture
def repo(db):
    return DeletionRepository(db.engine)


def failed_tombstone(db, slug, phase=DeletionPhase.WORK):
    collection = make_collection(db.engine, slug)
    claim = claimed(db.engine, collection, phase)
    assert DeletionRepository(db.engine).record_failure(claim, FAILED_CODE, True, 0)
    return collection


def stamp_all(db, updated_at):
    """Equal `updated_at` everywhere, so the collection id alone orders the page."""
    with db.engine.begin() as connection:
        connection.execute(schema.collection_deletions.update().values(updated_at=updated_at))


def test_pages_are_redacted_ordered_and_bounded(db, repo):
    made = [failed_tombstone(db, f"coll_{index}") for index in range(5)]
    stamp_all(db, "2026-01-01T00:00:00.000Z")
    expected = sorted((collection.id for collection in made), reverse=True)

    first = repo.find_operator_page(limit=2)
    assert all(isinstance(item, OperatorDeletionItem) for item in first.items)
    field_names = {field.name for field in dataclasses.fields(OperatorDeletionItem)}
    assert "lease_token" not in field_names and "force_delete" not in field_names
    assert first.next_cursor is not None
    second = repo.find_operator_page(limit=2, cursor=first.next_cursor)
    third = repo.find_operator_page(limit=2, cursor=second.next_cursor)
    assert third.next_cursor is None
    walked = [item.collection_id for page in (first, second, third) for item in page.items]
    assert walked == expected

    item = first.items[0]
    assert (item.state, item.phase, item.attempt_count, item.last_error_code) == (
        LeaseState.FAILED,
        DeletionPhase.WORK,
        1,
        FAILED_CODE,
    )


def test_an_exact_full_page_has_no_cursor(db, repo):
    for index in range(3):
        failed_tombstone(db, f"coll_{index}")
    page = repo.find_operator_page(limit=3)
    assert len(page.items) == 3 and page.next_cursor is None


def test_newest_updates_come_first(db, repo):
    older = failed_tombstone(db, "older")
    newer = failed_tombstone(db, "newer")
    with db.engine.begin() as connection:
        table = schema.collection_deletions
        connection.execute(
            table.update()
            .where(table.c.collection_id == older.id)
            .values(updated_at="2026-01-01T00:00:00.000Z")
        )
        connection.execute(
            table.update()
            .where(table.c.collection_id == newer.id)
            .values(updated_at="2026-01-02T00:00:00.000Z")
        )
    page = repo.find_operator_page(limit=1)
    assert page.items[0].collection_id == newer.id
    rest = repo.find_operator_page(limit=1, cursor=page.next_cursor)
    assert [item.collection_id for item in rest.items] == [older.id]
    assert rest.next_cursor is None


def test_state_filter_defaults_to_failed(db, repo):
    failed = failed_tombstone(db, "failed_one")
    pending = make_collection(db.engine, "pending_one")
    tombstone(db.engine, pending)
    assert [item.collection_id for item in repo.find_operator_page().items] == [failed.id]
    pending_page = repo.find_operator_page(state="pending")
    assert [item.collection_id for item in pending_page.items] == [pending.id]
    assert repo.find_operator_page(state=LeaseState.RETRY).items == ()


@pytest.mark.parametrize(
    "cursor",
    ["not base64!", "", encode_cursor("x", "y")[:-2] + "@@", "eyJmb28iOiAxfQ==", "W10="],
)
def test_a_malformed_cursor_is_rejected(db, repo, cursor):
    with pytest.raises(InvalidCursorError):
        repo.find_operator_page(cursor=cursor)


@pytest.mark.parametrize("state", ["failed", "retry", "expired"])
def test_retry_reopens_with_the_phase_unchanged(db, repo, state):
    collection = make_collection(db.engine, "posts")
    claim = claimed(db.engine, collection, DeletionPhase.SOURCES)
    if state == "expired":
        expire_lease(db.engine, collection.id)
    else:
        assert repo.record_failure(claim, FAILED_CODE, state == "failed", 600)

    result = repo.retry_operator_deletion(collection.id)

    assert result.outcome is OperatorRetryOutcome.PENDING and result.changed
    row = one(db.engine, schema.collection_deletions, collection_id=collection.id)
    assert (row["state"], row["phase"], row["attempt_count"]) == ("pending", "sources", 0)
    assert row["lease_token"] is None and row["lease_expires_at"] is None
    assert row["last_error_code"] is None and row["next_attempt_at"] <= db_now(db.engine)
    assert result.item.collection_id == collection.id
    assert result.item.phase is DeletionPhase.SOURCES and result.item.state is LeaseState.PENDING
    assert repo.claim(collection.id, DeletionPhase.SOURCES, LEASE_SECONDS) is not None


def test_retry_does_not_steal_a_live_lease(db, repo):
    collection = make_collection(db.engine, "posts")
    claimed(db.engine, collection, DeletionPhase.WORK)
    row = one(db.engine, schema.collection_deletions, collection_id=collection.id)
    before = snapshot(db.engine)
    result = repo.retry_operator_deletion(collection.id)
    assert result.outcome is OperatorRetryOutcome.LEASE_ACTIVE and not result.changed
    assert result.lease_expires_at == row["lease_expires_at"]
    assert result.item is None
    assert snapshot(db.engine) == before


def test_retry_of_a_missing_tombstone_is_not_found(db, repo):
    assert repo.retry_operator_deletion("missing-id").outcome is OperatorRetryOutcome.NOT_FOUND


def test_retry_of_a_pending_tombstone_is_a_conflict(db, repo):
    collection = make_collection(db.engine, "posts")
    tombstone(db.engine, collection, DeletionPhase.WORK)
    set_tombstone(db.engine, collection.id, attempt_count=2)
    before = snapshot(db.engine)
    result = repo.retry_operator_deletion(collection.id)
    assert result.outcome is OperatorRetryOutcome.CONFLICT and not result.changed
    assert snapshot(db.engine) == before
