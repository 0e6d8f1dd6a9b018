"""`media-usage work list` and `work retry`: the operator page of spec 9.1 and the guarded
retry of 9.2, with every outcome, bad input and exit code."""

from __future__ import annotations

import pytest

from media_usage_orchestration.store.core import schema
from tests.support.cli import (
    EXIT_OK,
    EXIT_PROBLEM,
    assert_all_refused,
    assert_unchanged,
    invoke,
    invoke_json,
    trusted_collection,
)
from tests.support.operator_states import (
    FAILED_CODE,
    expire_work_lease,
    failed_work,
    leased_work,
    removed_during_retry,
    work_of,
    work_row,
)
from tests.support.states import backdate, set_status, snapshot, status_row

HIDDEN_FIELDS = {"work_version", "lease_token", "change_epoch"}


@pytest.fixture
def posts(db):
    return trusted_collection(db)


# --- list -------------------------------------------------------------------------------------


def test_list_pages_newest_first_through_an_opaque_cursor(db, posts):
    for age, content_id in enumerate(["entry-c", "entry-b", "entry-a"]):
        failed_work(db.engine, posts, content_id)
        backdate(db.engine, schema.work, "updated_at", 10 * age, content_id=content_id)

    first = invoke_json(db, "work", "list", "--collection", "posts", "--limit", "2")
    assert [item["content_id"] for item in first["items"]] == ["entry-c", "entry-b"]
    assert first["next_cursor"]
    second = invoke_json(
        db,
        "work",
        "list",
        "--collection",
        "posts",
        "--limit",
        "2",
        "--cursor",
        first["next_cursor"],
    )
    assert [item["content_id"] for item in second["items"]] == ["entry-a"]
    assert second["next_cursor"] is None
    item = second["items"][0]
    assert (item["state"], item["attempt_count"], item["last_error_code"]) == (
        "failed",
        5,
        FAILED_CODE,
    )
    assert not HIDDEN_FIELDS & set(item)


def test_list_filters_by_state_and_never_shows_a_lease_token(db, posts):
    failed_work(db.engine, posts, "entry-failed")
    claimed = leased_work(db.engine, posts, "entry-leased")

    page = invoke_json(db, "work", "list", "--collection", "posts", "--state", "leased")

    assert [item["content_id"] for item in page["items"]] == ["entry-leased"]
    assert page["items"][0]["lease_expires_at"] == claimed.lease_expires_at
    table = invoke(db, "work", "list", "--collection", "posts")
    assert table.exit_code == EXIT_OK
    assert "entry-failed" in table.stdout and "entry-leased" in table.stdout
    for output in (str(page), table.stdout):
        assert claimed.lease_token not in output


def test_an_empty_list_says_so(db, posts):
    result = invoke(db, "work", "list", "--collection", "posts")
    assert (result.exit_code, result.stdout.strip()) == (EXIT_OK, "Work of posts: none")


BAD_LIST_INPUT = [
    (("--collection", "nope"), "Collection 'nope' does not exist"),
    (("--collection", "Posts"), "Invalid collection slug"),
    (("--collection", "posts", "--cursor", "not-a-cursor"), "Invalid cursor"),
    (("--collection", "posts", "--cursor", "e30="), "Invalid cursor"),  # base64 of {}
    (("--collection", "posts", "--limit", "0"), "from 1 to 100"),
    (("--collection", "posts", "--limit", "101"), "from 1 to 100"),
    (("--collection", "posts", "--state", "done"), "'done' is not one of"),
    ((), "Missing option '--collection'"),
]


def test_bad_list_input_is_a_usage_error(db, posts):
    failed_work(db.engine, posts, "entry-1")
    assert_all_refused(db, ("work", "list"), BAD_LIST_INPUT)


# --- retry one entry --------------------------------------------------------------------------


def test_retry_reopens_failed_work_and_invalidates_coverage(db, posts):
    failed_work(db.engine, posts, "entry-1")

    report = invoke_json(db, "work", "retry", "--collection", "posts", "--content-id", "entry-1")

    assert (report["outcome"], report["changed"]) == ("pending", True)
    assert report["item"]["state"] == "pending" and not HIDDEN_FIELDS & set(report["item"])
    row = work_row(db.engine, posts, "entry-1")
    assert (row["state"], row["work_version"], row["attempt_count"]) == ("pending", 2, 0)
    status = status_row(db.engine, "posts")
    assert (status["status"], status["change_epoch"]) == ("stale", 1)


def test_retry_message_for_a_reopened_entry(db, posts):
    result = invoke(db, "work", "retry", "--collection", "posts", "--content-id", "gone-entry")
    assert result.exit_code == EXIT_OK, result.output
    assert result.stdout.strip() == "Work posts/gone-entry: pending (reopened, it will run again)"
    assert work_row(db.engine, posts, "gone-entry")["state"] == "pending"


def test_retry_of_pending_work_changes_nothing(db, posts):
    work_of(db.engine, posts, "entry-1", "pending")
    result = assert_unchanged(
        db, ("work", "retry", "--collection", "posts", "--content-id", "entry-1"), EXIT_OK
    )
    assert "pending (already pending, unchanged)" in result.stdout


def test_retry_never_takes_a_live_lease_nor_shows_its_token(db, posts):
    claimed = leased_work(db.engine, posts, "entry-1")
    before = snapshot(db.engine)

    report = invoke_json(
        db,
        "work",
        "retry",
        "--collection",
        "posts",
        "--content-id",
        "entry-1",
        exit_code=EXIT_PROBLEM,
    )
    text = assert_unchanged(
        db, ("work", "retry", "--collection", "posts", "--content-id", "entry-1"), EXIT_PROBLEM
    )

    assert report == {
        "outcome": "lease_active",
        "changed": False,
        "lease_expires_at": claimed.lease_expires_at,
        "item": None,
    }
    assert f"until {claimed.lease_expires_at}" in text.stdout
    assert claimed.lease_token not in text.stdout
    assert snapshot(db.engine) == before


def test_an_expired_lease_is_reopened(db, posts):
    leased_work(db.engine, posts, "entry-1")
    expire_work_lease(db.engine, posts, "entry-1")
    report = invoke_json(db, "work", "retry", "--collection", "posts", "--content-id", "entry-1")
    assert (report["outcome"], report["changed"]) == ("pending", True)
    assert work_row(db.engine, posts, "entry-1")["lease_token"] is None


def test_work_removed_during_the_retry_is_a_conflict(db, posts):
    failed_work(db.engine, posts, "entry-1")
    removed_during_retry(db, "entry-1")

    result = invoke(db, "work", "retry", "--collection", "posts", "--content-id", "entry-1")

    assert result.exit_code == EXIT_PROBLEM
    assert "conflict" in result.stdout
    assert work_row(db.engine, posts, "entry-1") is None


def test_a_collection_without_active_capture_is_not_found(db, posts):
    set_status(db.engine, "posts", capture_state="installing")
    result = assert_unchanged(
        db, ("work", "retry", "--collection", "posts", "--content-id", "entry-1"), EXIT_PROBLEM
    )
    assert "not_found" in result.stdout


# --- retry every failed entry -----------------------------------------------------------------


def test_all_failed_reopens_each_failed_entry_and_counts_outcomes(db, posts):
    for content_id in ("entry-1", "entry-2"):
        failed_work(db.engine, posts, content_id)
    work_of(db.engine, posts, "entry-3", "pending")

    report = invoke_json(db, "work", "retry", "--collection", "posts", "--all-failed")

    assert report == {
        "collection": "posts",
        "outcome": "pending",
        "counts": {"pending": 2, "lease_active": 0, "conflict": 0, "not_found": 0},
        "changed": 2,
        "more_failed": False,
    }
    assert work_row(db.engine, posts, "entry-3")["work_version"] == 1


def test_all_failed_is_bounded_and_says_more_remain(db, posts):
    for content_id in ("entry-1", "entry-2", "entry-3"):
        failed_work(db.engine, posts, content_id)

    result = invoke(db, "work", "retry", "--collection", "posts", "--all-failed", "--limit", "2")

    assert result.exit_code == EXIT_OK, result.output
    assert "2 pending" in result.stdout and "more failed work remains" in result.stdout
    states = sorted(work_row(db.engine, posts, f"entry-{n}")["state"] for n in (1, 2, 3))
    assert states == ["failed", "pending", "pending"]


def test_all_failed_with_a_conflict_exits_1(db, posts):
    failed_work(db.engine, posts, "entry-1")
    removed_during_retry(db, "entry-1")
    report = invoke_json(
        db, "work", "retry", "--collection", "posts", "--all-failed", exit_code=EXIT_PROBLEM
    )
    assert (report["outcome"], report["counts"]["conflict"]) == ("partial", 1)


def test_all_failed_without_failed_work_changes_nothing(db, posts):
    work_of(db.engine, posts, "entry-1", "pending")
    result = assert_unchanged(
        db, ("work", "retry", "--collection", "posts", "--all-failed"), EXIT_OK
    )
    assert "no failed work" in result.stdout


BAD_RETRY_INPUT = [
    (("--collection", "nope", "--content-id", "entry-1"), "Collection 'nope' does not exist"),
    (("--collection", "nope", "--all-failed"), "Collection 'nope' does not exist"),
    (("--collection", "no slug", "--all-failed"), "Invalid collection slug"),
    (("--collection", "posts"), "exactly one of --content-id or --all-failed"),
    (("--collection", "posts", "--content-id", "entry-1", "--all-failed"), "exactly one of"),
    (("--collection", "posts", "--content-id", ""), "A content ID is required"),
    (("--collection", "posts", "--content-id", "x" * 2049), "A content ID is required"),
    (("--collection", "posts", "--all-failed", "--limit", "0"), "from 1 to 100"),
    (("--collection", "posts", "--all-failed", "--limit", "101"), "from 1 to 100"),
]


def test_bad_retry_input_is_a_usage_error(db, posts):
    failed_work(db.engine, posts, "entry-1")
    assert_all_refused(db, ("work", "retry"), BAD_RETRY_INPUT)
