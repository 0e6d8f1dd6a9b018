"""Operator listing and retry of media usage work (upstream `media-usage-work-operator.test.ts`).

The upstream races (newer work, removal, collection deletion between the coverage bump and
the reopen) are staged with a trigger on the status epoch bump, on both dialects.
"""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import select

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.leases import LeaseState
from media_usage_orchestration.store.work import (
    OperatorPage,
    OperatorRetryResult,
    OperatorWorkItem,
    WorkRepository,
)
from media_usage_orchestration.values.errors import InvalidCursorError
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome
from tests.factories import insert_work, insert_works
from tests.store.work_helpers import after_epoch_bump, read_work
from tests.support import make_collection, set_status, snapshot, status_row

STATES = ("pending", "retry", "leased", "failed")
STAMP = "2026-08-06T12:00:00.000Z"


@pytest.fixture
def post(db):
    """The current, active `post` collection with trusted (complete) coverage."""
    collection = make_collection(db.engine, "post", status="complete", reconciliation_required=0)
    set_status(db.engine, "post", completed_at="2026-08-01T00:00:00.000Z")
    return collection


@pytest.fixture
def repo(db) -> WorkRepository:
    return WorkRepository(db.engine)


def post_work(post, content_id: str, state: str, **overrides) -> dict:
    row = {
        "collection_id": post.id,
        "collection_slug": "post",
        "content_id": content_id,
        "change_epoch": 0,
        "state": state,
        "created_at": STAMP,
        "updated_at": STAMP,
    }
    row.update(overrides)
    return row


def raw_work(db, post, content_id: str) -> dict | None:
    return read_work(db.engine, post.id, content_id)


# --- listing ----------------------------------------------------------------------------------


def test_cursor_pages_are_deterministic_bounded_and_redacted(db, repo, post):
    insert_works(
        db.engine,
        [
            post_work(
                post,
                f"entry-{index:03d}",
                STATES[index % 4],
                updated_at=f"2026-08-06T12:{index // 3:02d}:00.000Z",
                lease_token="secret-token" if STATES[index % 4] == "leased" else None,
                lease_expires_at="2100-01-01T00:00:00.000Z"
                if STATES[index % 4] == "leased"
                else None,
            )
            for index in range(27)
        ],
    )

    first = repo.find_operator_page("post", limit=10)
    second = repo.find_operator_page("post", limit=10, cursor=first.next_cursor)
    third = repo.find_operator_page("post", limit=10, cursor=second.next_cursor)

    assert isinstance(first, OperatorPage)
    assert len(first.items) == 10 and isinstance(first.next_cursor, str)
    assert first.items[0].collection_id == post.id
    assert first.items[0].collection_slug == "post"
    assert first.items[0].content_id == "entry-026"
    assert len(second.items) == 10 and second.next_cursor
    assert len(third.items) == 7 and third.next_cursor is None
    listed = [item.content_id for page in (first, second, third) for item in page.items]
    assert listed == [f"entry-{index:03d}" for index in range(26, -1, -1)]
    assert repo.find_operator_page("post", limit=10) == first
    exposed = {field.name for field in dataclasses.fields(OperatorWorkItem)}
    assert not exposed & {"lease_token", "work_version", "change_epoch"}
    assert "secret-token" not in repr(first) + repr(second) + repr(third)


def test_an_exact_full_page_is_distinguished_from_a_page_with_more(db, repo, post):
    insert_works(
        db.engine,
        [
            post_work(
                post,
                f"entry-boundary-{index:03d}",
                "pending",
                updated_at=f"2026-08-06T12:{index // 60:02d}:{index % 60:02d}.000Z",
            )
            for index in range(100)
        ],
    )
    exact = repo.find_operator_page("post", limit=100)
    assert len(exact.items) == 100 and exact.next_cursor is None

    insert_work(
        db.engine,
        **post_work(post, "entry-boundary-100", "pending", updated_at="2026-08-06T12:02:00.000Z"),
    )
    first = repo.find_operator_page("post", limit=100)
    assert len(first.items) == 100 and first.next_cursor
    second = repo.find_operator_page("post", limit=100, cursor=first.next_cursor)
    assert [item.content_id for item in second.items] == ["entry-boundary-000"]
    assert second.next_cursor is None


def test_the_default_page_holds_fifty(db, repo, post):
    insert_works(db.engine, [post_work(post, f"entry-{n:02d}", "failed") for n in range(51)])
    page = repo.find_operator_page("post")
    assert len(page.items) == 50 and page.next_cursor


@pytest.mark.parametrize("cursor", ["not-a-cursor", "e30=", "W10=", "x" * 2049])
def test_a_malformed_cursor_is_rejected_instead_of_restarting(db, repo, post, cursor):
    insert_work(db.engine, **post_work(post, "entry-1", "failed"))
    before = snapshot(db.engine)
    with pytest.raises(InvalidCursorError):
        repo.find_operator_page("post", cursor=cursor)
    assert snapshot(db.engine) == before


def test_state_filter_stays_within_one_collection_identity(db, repo, post):
    insert_works(
        db.engine,
        [
            post_work(post, "failed-current", "failed"),
            post_work(post, "pending-current", "pending"),
            post_work(post, "failed-old", "failed", collection_id="other-collection"),
        ],
    )

    page = repo.find_operator_page("post", state="failed", limit=50)

    assert [item.content_id for item in page.items] == ["failed-current"]
    assert page.items[0].state is LeaseState.FAILED
    assert page.next_cursor is None
    everything = repo.find_operator_page("post", limit=50)
    assert {item.content_id for item in everything.items} == {"failed-current", "pending-current"}


def test_a_missing_collection_gives_none(repo, post):
    assert repo.find_operator_page("missing") is None


# --- retry ------------------------------------------------------------------------------------


def test_pending_work_and_its_coverage_epoch_are_left_unchanged(db, repo, post):
    insert_work(db.engine, **post_work(post, "entry-pending", "pending", work_version=4))
    before = snapshot(db.engine)

    result = repo.retry_operator_work(post.id, "entry-pending")

    assert result.outcome is OperatorRetryOutcome.PENDING and result.changed is False
    assert result.work.content_id == "entry-pending" and result.work.state is LeaseState.PENDING
    assert snapshot(db.engine) == before
    assert raw_work(db, post, "entry-pending")["work_version"] == 4


@pytest.mark.parametrize("state", ["retry", "failed"])
def test_retry_and_failed_work_reopen_and_invalidate_complete_coverage(db, repo, post, state):
    insert_work(
        db.engine,
        **post_work(
            post,
            f"entry-{state}",
            state,
            work_version=7,
            attempt_count=3,
            last_error_code="MEDIA_USAGE_PROCESSING_FAILED",
            last_attempted_at=STAMP,
        ),
    )

    result = repo.retry_operator_work(post.id, f"entry-{state}")

    assert result.outcome is OperatorRetryOutcome.PENDING and result.changed is True
    assert result.work.state is LeaseState.PENDING
    assert result.work.attempt_count == 0 and result.work.last_error_code is None
    row = raw_work(db, post, f"entry-{state}")
    assert (row["work_version"], row["change_epoch"], row["state"]) == (8, 1, "pending")
    assert row["lease_token"] is None and row["lease_expires_at"] is None
    assert row["last_attempted_at"] is None
    status = status_row(db.engine, "post")
    assert (status["status"], status["completed_at"], status["change_epoch"]) == ("stale", None, 1)


def test_an_expired_lease_is_taken_over_without_keeping_its_owner(db, repo, post):
    insert_work(
        db.engine,
        **post_work(
            post,
            "entry-expired",
            "leased",
            work_version=2,
            lease_token="expired-owner",
            lease_expires_at="2000-01-01T00:00:00.000Z",
        ),
    )

    result = repo.retry_operator_work(post.id, "entry-expired")

    assert result.outcome is OperatorRetryOutcome.PENDING and result.changed is True
    row = raw_work(db, post, "entry-expired")
    assert (row["state"], row["work_version"]) == ("pending", 3)
    assert row["lease_token"] is None and row["lease_expires_at"] is None


def test_a_live_lease_is_not_stolen_and_its_token_not_exposed(db, repo, post):
    insert_work(
        db.engine,
        **post_work(
            post,
            "entry-live",
            "leased",
            work_version=3,
            lease_token="private-owner-token",
            lease_expires_at="2100-01-01T00:00:00.000Z",
        ),
    )
    before = snapshot(db.engine)

    result = repo.retry_operator_work(post.id, "entry-live")

    assert result == OperatorRetryResult(
        OperatorRetryOutcome.LEASE_ACTIVE, lease_expires_at="2100-01-01T00:00:00.000Z"
    )
    assert "private-owner-token" not in repr(result)
    assert snapshot(db.engine) == before


def test_work_is_created_for_an_absent_content_row(db, repo, post):
    result = repo.retry_operator_work(post.id, "already-deleted-entry")

    assert result.outcome is OperatorRetryOutcome.PENDING and result.changed is True
    assert (result.work.collection_id, result.work.collection_slug) == (post.id, "post")
    assert result.work.content_id == "already-deleted-entry"
    assert result.work.state is LeaseState.PENDING
    row = raw_work(db, post, "already-deleted-entry")
    assert (row["work_version"], row["change_epoch"], row["attempt_count"]) == (1, 1, 0)
    status = status_row(db.engine, "post")
    assert (status["status"], status["completed_at"], status["change_epoch"]) == ("stale", None, 1)


def test_newer_pending_work_created_mid_retry_is_not_overwritten(db, repo, post):
    insert_work(
        db.engine,
        **post_work(
            post,
            "entry-newer-work",
            "failed",
            work_version=7,
            attempt_count=5,
            last_error_code="MEDIA_USAGE_PROCESSING_FAILED",
        ),
    )
    after_epoch_bump(
        db,
        "retry_newer_work_wins",
        "UPDATE _emdash_media_usage_work SET state = 'pending', work_version = work_version + 1, "
        "attempt_count = 0, last_error_code = NULL WHERE collection_id = NEW.collection_id "
        "AND content_id = 'entry-newer-work'",
    )

    result = repo.retry_operator_work(post.id, "entry-newer-work")

    assert result.outcome is OperatorRetryOutcome.PENDING and result.changed is False
    assert result.work.state is LeaseState.PENDING and result.work.attempt_count == 0
    row = raw_work(db, post, "entry-newer-work")
    assert (row["work_version"], row["state"], row["change_epoch"]) == (8, "pending", 0)


def test_a_concurrent_removal_gives_conflict_and_keeps_coverage_stale(db, repo, post):
    insert_work(db.engine, **post_work(post, "entry-removed-race", "failed", work_version=4))
    after_epoch_bump(
        db,
        "retry_remove_work_race",
        "DELETE FROM _emdash_media_usage_work WHERE collection_id = NEW.collection_id "
        "AND content_id = 'entry-removed-race'",
    )

    result = repo.retry_operator_work(post.id, "entry-removed-race")

    assert result == OperatorRetryResult(OperatorRetryOutcome.CONFLICT)
    status = status_row(db.engine, "post")
    assert (status["status"], status["completed_at"], status["change_epoch"]) == ("stale", None, 1)
    assert raw_work(db, post, "entry-removed-race") is None


def test_a_newer_failed_version_mid_retry_is_not_reopened(db, repo, post):
    insert_work(db.engine, **post_work(post, "entry-refailed", "failed", work_version=2))
    after_epoch_bump(
        db,
        "retry_refailed_race",
        "UPDATE _emdash_media_usage_work SET work_version = work_version + 1 "
        "WHERE collection_id = NEW.collection_id AND content_id = 'entry-refailed'",
    )

    result = repo.retry_operator_work(post.id, "entry-refailed")

    assert result == OperatorRetryResult.conflict()
    row = raw_work(db, post, "entry-refailed")
    assert (row["state"], row["work_version"], row["change_epoch"]) == ("failed", 3, 0)


@pytest.mark.parametrize("existing", [True, False], ids=["reopen", "create"])
def test_a_newer_coverage_epoch_mid_retry_wins(db, repo, post, existing):
    if existing:
        insert_work(db.engine, **post_work(post, "entry-epoch-race", "failed", work_version=2))
    # Another capture write lands right after the retry's own bump (epoch 1 -> 2).
    after_epoch_bump(
        db,
        "retry_epoch_race",
        "UPDATE _emdash_media_usage_index_status SET change_epoch = change_epoch + 1 "
        "WHERE collection_id = NEW.collection_id AND change_epoch = 1",
    )
    before = raw_work(db, post, "entry-epoch-race")

    result = repo.retry_operator_work(post.id, "entry-epoch-race")

    assert result == OperatorRetryResult.conflict()
    assert raw_work(db, post, "entry-epoch-race") == before
    status = status_row(db.engine, "post")
    assert (status["status"], status["change_epoch"]) == ("stale", 2)


REMOVE_COLLECTION = "DELETE FROM _emdash_collections WHERE id = NEW.collection_id"


def test_nothing_is_reopened_after_the_collection_is_removed(db, repo, post):
    insert_work(db.engine, **post_work(post, "entry-obsolete", "failed", work_version=2))
    after_epoch_bump(db, "retry_collection_removed", REMOVE_COLLECTION)

    result = repo.retry_operator_work(post.id, "entry-obsolete")

    assert result == OperatorRetryResult(OperatorRetryOutcome.COLLECTION_NOT_FOUND)
    row = raw_work(db, post, "entry-obsolete")
    assert (row["state"], row["work_version"]) == ("failed", 2)


def test_nothing_is_created_after_the_collection_is_removed(db, repo, post):
    after_epoch_bump(db, "retry_collection_removed", REMOVE_COLLECTION)

    result = repo.retry_operator_work(post.id, "entry-missing-race")

    assert result == OperatorRetryResult(OperatorRetryOutcome.COLLECTION_NOT_FOUND)
    assert raw_work(db, post, "entry-missing-race") is None


def test_a_lease_taken_mid_retry_is_reported_as_active(db, repo, post):
    insert_work(db.engine, **post_work(post, "entry-claimed-race", "failed", work_version=2))
    after_epoch_bump(
        db,
        "retry_claimed_race",
        "UPDATE _emdash_media_usage_work SET state = 'leased', lease_token = 'racer', "
        "lease_expires_at = '2100-01-01T00:00:00.000Z' WHERE collection_id = NEW.collection_id "
        "AND content_id = 'entry-claimed-race'",
    )

    result = repo.retry_operator_work(post.id, "entry-claimed-race")

    assert result == OperatorRetryResult.lease_active("2100-01-01T00:00:00.000Z")
    assert raw_work(db, post, "entry-claimed-race")["lease_token"] == "racer"


def test_missing_and_inactive_identities_give_collection_not_found(db, repo, post):
    assert repo.retry_operator_work("missing-collection", "entry-1") == (
        OperatorRetryResult.collection_not_found()
    )
    set_status(db.engine, "post", capture_state="installing")
    before = snapshot(db.engine)

    assert repo.retry_operator_work(post.id, "entry-1").outcome is (
        OperatorRetryOutcome.COLLECTION_NOT_FOUND
    )
    assert snapshot(db.engine) == before
    with db.engine.connect() as connection:
        assert connection.execute(select(schema.work.c.content_id)).all() == []


# --- bad input changes nothing ----------------------------------------------------------------

BAD_CALLS = [
    pytest.param(lambda r: r.find_operator_page(""), r"collection slug", id="list-no-slug"),
    pytest.param(
        lambda r: r.find_operator_page("post", state="bogus"), r"valid state", id="list-bad-state"
    ),
    pytest.param(
        lambda r: r.find_operator_page("post", limit=0), r"operator limit", id="list-limit-0"
    ),
    pytest.param(
        lambda r: r.find_operator_page("post", limit=101), r"operator limit", id="list-limit-101"
    ),
    pytest.param(
        lambda r: r.find_operator_page("post", limit=True), r"operator limit", id="list-limit-bool"
    ),
    pytest.param(
        lambda r: r.find_operator_page("post", limit="5"), r"operator limit", id="list-limit-text"
    ),
    pytest.param(
        lambda r: r.retry_operator_work("", "entry-1"),
        r"collection and content",
        id="retry-no-collection",
    ),
    pytest.param(
        lambda r: r.retry_operator_work("x", ""), r"collection and content", id="retry-no-content"
    ),
    pytest.param(
        lambda r: r.retry_operator_work("x", None), r"collection and content", id="retry-none"
    ),
]


@pytest.mark.parametrize(("call", "message"), BAD_CALLS)
def test_bad_operator_input_is_rejected_before_any_sql(db, repo, post, call, message):
    insert_work(db.engine, **post_work(post, "entry-1", "failed"))
    before = snapshot(db.engine)
    with pytest.raises(ValueError, match=message):
        call(repo)
    assert snapshot(db.engine) == before
