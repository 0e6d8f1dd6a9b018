"""`media-usage deletions list` and `deletions retry` (spec 9.3): by collection id or slug,
every outcome, bad input and exit code."""

from __future__ import annotations

import pytest

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.deletion.records import DeletionPhase
from tests.support.cli import (
    EXIT_OK,
    EXIT_PROBLEM,
    assert_all_refused,
    assert_unchanged,
    invoke,
    invoke_json,
)
from tests.support.deletions import tombstone, tombstone_row
from tests.support.operator_states import (
    failed_tombstone,
    leased_tombstone,
)
from tests.support.states import IMAGE_ONLY, backdate


@pytest.fixture
def cms(db) -> CmsWriter:
    return CmsWriter(db.engine)


def test_list_shows_failed_tombstones_by_default_newest_first(db, cms):
    old, new, busy = (cms.create_collection(slug, IMAGE_ONLY) for slug in ("old", "new", "busy"))
    failed_tombstone(db.engine, old)
    failed_tombstone(db.engine, new)
    claim = leased_tombstone(db.engine, busy)
    table = schema.collection_deletions
    backdate(db.engine, table, "updated_at", 60, collection_id=old.id)

    first = invoke_json(db, "deletions", "list", "--limit", "1")
    second = invoke_json(db, "deletions", "list", "--limit", "1", "--cursor", first["next_cursor"])
    leased = invoke_json(db, "deletions", "list", "--state", "leased")

    assert [item["collection_slug"] for item in first["items"]] == ["new"]
    assert ([item["collection_slug"] for item in second["items"]], second["next_cursor"]) == (
        ["old"],
        None,
    )
    item = second["items"][0]
    assert (item["state"], item["phase"], item["last_error_code"]) == (
        "failed",
        "sources",
        "X_FAILED",
    )
    assert leased["items"][0]["lease_expires_at"] == claim.lease_expires_at
    assert "lease_token" not in leased["items"][0]
    text = invoke(db, "deletions", "list")
    assert text.exit_code == EXIT_OK and "new" in text.stdout and "old" in text.stdout
    assert claim.lease_token not in text.stdout + str(leased)


def test_an_empty_list_says_so(db):
    result = invoke(db, "deletions", "list", "--state", "retry")
    assert (result.exit_code, result.stdout.strip()) == (
        EXIT_OK,
        "Collection deletions (retry): none",
    )


def test_bad_list_input_is_a_usage_error(db, cms):
    failed_tombstone(db.engine, cms.create_collection("posts", IMAGE_ONLY))
    assert_all_refused(
        db,
        ("deletions", "list"),
        [
            (("--limit", "0"), "from 1 to 100"),
            (("--limit", "101"), "from 1 to 100"),
            (("--cursor", "%%%"), "Invalid cursor"),
            (("--state", "gone"), "'gone' is not one of"),
        ],
    )


@pytest.mark.parametrize("by", ["--collection-id", "--collection"])
def test_retry_reopens_a_failed_tombstone_in_its_phase(db, cms, by):
    posts = cms.create_collection("posts", IMAGE_ONLY)
    failed_tombstone(db.engine, posts, DeletionPhase.SOURCES)
    name = posts.id if by == "--collection-id" else "posts"

    report = invoke_json(db, "deletions", "retry", by, name)

    assert (report["outcome"], report["changed"]) == ("pending", True)
    assert report["item"]["phase"] == "sources" and "lease_token" not in report["item"]
    row = tombstone_row(db.engine, posts.id)
    assert (row["state"], row["phase"], row["attempt_count"], row["last_error_code"]) == (
        "pending",
        "sources",
        0,
        None,
    )


def test_retry_message_names_the_deletion(db, cms):
    failed_tombstone(db.engine, cms.create_collection("posts", IMAGE_ONLY))
    result = invoke(db, "deletions", "retry", "--collection", "posts")
    assert result.exit_code == EXIT_OK, result.output
    assert result.stdout.strip() == "Deletion of posts: pending (reopened, it will run again)"


def test_retry_never_takes_a_live_lease_nor_shows_its_token(db, cms):
    posts = cms.create_collection("posts", IMAGE_ONLY)
    claim = leased_tombstone(db.engine, posts)

    result = assert_unchanged(db, ("deletions", "retry", "--collection-id", posts.id), EXIT_PROBLEM)
    report = invoke_json(db, "deletions", "retry", "--collection", "posts", exit_code=EXIT_PROBLEM)

    assert f"lease_active (a worker holds it until {claim.lease_expires_at}" in result.stdout
    assert report == {
        "outcome": "lease_active",
        "changed": False,
        "lease_expires_at": claim.lease_expires_at,
        "item": None,
    }
    assert claim.lease_token not in result.stdout
    assert tombstone_row(db.engine, posts.id)["lease_token"] == claim.lease_token


def test_retry_of_a_pending_tombstone_is_a_conflict(db, cms):
    posts = cms.create_collection("posts", IMAGE_ONLY)
    tombstone(db.engine, posts, DeletionPhase.WORK, force=True)
    result = assert_unchanged(db, ("deletions", "retry", "--collection", "posts"), EXIT_PROBLEM)
    assert "Deletion of posts: conflict" in result.stdout


@pytest.mark.parametrize("by", ["--collection-id", "--collection"])
def test_retry_without_a_tombstone_is_not_found(db, cms, by):
    cms.create_collection("posts", IMAGE_ONLY)
    name = "no-such-id" if by == "--collection-id" else "posts"
    report = invoke_json(db, "deletions", "retry", by, name, exit_code=EXIT_PROBLEM)
    assert report == {"outcome": "not_found", "changed": False, "item": None}
    assert_unchanged(db, ("deletions", "retry", by, name), EXIT_PROBLEM)


def test_bad_retry_input_is_a_usage_error(db, cms):
    failed_tombstone(db.engine, cms.create_collection("posts", IMAGE_ONLY))
    assert_all_refused(
        db,
        ("deletions", "retry"),
        [
            ((), "exactly one of collection id or slug"),
            (("--collection-id", "x", "--collection", "posts"), "exactly one of"),
            (("--collection", "Posts!"), "Invalid collection slug"),
            (("--collection-id", ""), "A collection ID is required"),
        ],
    )
