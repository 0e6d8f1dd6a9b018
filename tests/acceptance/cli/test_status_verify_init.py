"""`media-usage init`, `status` and `verify`: coverage per collection, the oracle, exit codes."""

from __future__ import annotations

import pytest
from sqlalchemy import delete
from sqlalchemy.engine import make_url

from media_usage_orchestration.console import status_table
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.processing.reconciliation import driver
from media_usage_orchestration.store.core import schema
from tests.support.cli import (
    EXIT_OK,
    EXIT_PROBLEM,
    assert_refused,
    assert_unchanged,
    invoke,
    invoke_json,
)
from tests.support.operator_states import (
    FAILED_CODE,
    expire_work_lease,
    failed_work,
    leased_work,
)
from tests.support.states import IMAGE_ONLY, snapshot

ENTRIES = 3


@pytest.fixture
def covered(db):
    """`posts`, captured and reconciled: complete coverage, one image per entry."""
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    activate(db.engine)
    cms.insert_entries("posts", [{"id": f"entry-{i}", "hero": f"m-{i}"} for i in range(ENTRIES)])
    assert driver.run_to_completion(db.engine, posts.id).value == "completed"
    return posts


def test_init_is_repeatable_and_shows_the_url_without_its_password(db):
    result = invoke(db, "init")
    assert result.exit_code == EXIT_OK, result.output
    assert "0 objects added" in result.stdout


def test_status_shows_coverage_index_and_work_per_collection(db, covered):
    CmsWriter(db.engine).create_collection("drafts", IMAGE_ONLY)

    statuses = invoke_json(db, "status")

    drafts, posts = statuses
    assert posts == {
        "collection_id": covered.id,
        "collection_slug": "posts",
        "capture_state": "active",
        "status": "complete",
        "change_epoch": posts["change_epoch"],
        "reconciliation_required": False,
        "entries": ENTRIES,
        "sources": ENTRIES,
        "occurrences": ENTRIES,
        "pending_work": 0,
        "failed_work": 0,
        "last_error_code": None,
        "started_at": posts["started_at"],
        "completed_at": posts["completed_at"],
        "problem_code": None,
        "problem": None,
        "stuck_work": 0,
        "failed_work_codes": {},
        # What coverage_complete judges progress by.
        "status_updated_at": posts["status_updated_at"],
        "reconciliation_state": None,  # finalized: its row is gone
        "reconciliation_updated_at": None,
    }
    assert posts["started_at"] <= posts["completed_at"] <= posts["status_updated_at"]
    assert drafts["collection_slug"] == "drafts" and drafts["entries"] == 0
    table = invoke(db, "status")
    assert table.exit_code == EXIT_OK and "posts" in table.stdout and "drafts" in table.stdout
    assert status_table(db.engine).row_count == 2


def test_status_exits_1_while_failed_work_waits_for_a_retry(db, covered):
    failed_work(db.engine, covered, "entry-1")

    statuses = invoke_json(db, "status", exit_code=EXIT_PROBLEM)
    result = assert_unchanged(db, ("status",), EXIT_PROBLEM)

    assert statuses[0]["failed_work"] == 1
    assert statuses[0]["failed_work_codes"] == {FAILED_CODE: 1}
    assert "Failed work or coverage waits for a retry: posts" in result.stderr


def test_status_counts_leased_work_whose_lease_expired_as_stuck(db, covered):
    leased_work(db.engine, covered, "entry-1")
    (live,) = invoke_json(db, "status")
    expire_work_lease(db.engine, covered, "entry-1")
    (expired,) = invoke_json(db, "status")

    assert (live["pending_work"], live["stuck_work"]) == (1, 0)
    assert (expired["pending_work"], expired["stuck_work"]) == (1, 1)
    assert "stuck" in invoke(db, "status").stdout


def test_status_of_a_collection_without_a_status_row_has_no_coverage(db):
    CmsWriter(db.engine).create_collection("legacy", IMAGE_ONLY)
    (never,) = invoke_json(db, "status")
    with db.engine.begin() as connection:
        connection.execute(delete(schema.index_status))
    (missing,) = invoke_json(db, "status")

    assert (never["status"], never["capture_state"], never["change_epoch"]) == ("never", None, 0)
    assert (missing["status"], missing["capture_state"], missing["change_epoch"]) == (
        None,
        None,
        None,
    )
    assert (missing["entries"], missing["reconciliation_required"]) == (0, None)


def test_verify_passes_on_a_true_index(db, covered):
    result = invoke(db, "verify")
    assert result.exit_code == EXIT_OK, result.output
    assert "No drift" in result.stdout
    report = invoke_json(db, "verify", "--collection", "posts")
    assert (report["has_drift"], report["difference_count"]) == (False, 0)
    assert report["collections"][0]["entry_count"] == ENTRIES


def test_verify_exits_1_on_drift(db, covered):
    with db.engine.begin() as connection:
        connection.execute(delete(schema.occurrences))

    report = invoke_json(db, "verify", exit_code=EXIT_PROBLEM)
    text = invoke(db, "verify")

    assert report["has_drift"] and report["difference_count"] == ENTRIES
    assert {each["kind"] for each in report["differences"]} == {"missing_occurrence"}
    assert text.exit_code == EXIT_PROBLEM and f"{ENTRIES} differences" in text.stdout


def test_verify_refuses_an_unknown_collection(db, covered):
    assert_refused(db, ("verify", "--collection", "nope"), "Collection 'nope' does not exist")


# --- the database password --------------------------------------------------------------------

PASSWORD = "s3cret"
EVERY_VERB = [
    ("init",),
    ("status",),
    ("verify",),
    ("work", "list", "--collection", "posts"),
    ("work", "retry", "--collection", "posts", "--all-failed"),
    ("work", "retry", "--collection", "posts", "--content-id", "entry-1"),
    ("deletions", "list"),
    ("deletions", "retry", "--collection", "posts"),
    ("reconciliations", "list"),
    ("reconciliations", "retry", "--collection", "posts"),
]


def test_no_verb_prints_the_password(db, covered):
    """Through the environment variable; PostgreSQL's trust auth ignores the password."""
    from click.testing import CliRunner

    from media_usage_orchestration.cli import main

    url = make_url(db.url)
    if db.is_postgres:
        url = url.set(password=PASSWORD)
    environment = {"MEDIA_USAGE_DATABASE_URL": url.render_as_string(hide_password=False)}
    before = snapshot(db.engine)
    for arguments in EVERY_VERB:
        result = CliRunner(env=environment).invoke(main, list(arguments))
        assert result.exit_code in (EXIT_OK, EXIT_PROBLEM), (arguments, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), arguments
        assert PASSWORD not in result.output, arguments
    assert snapshot(db.engine)["_emdash_collections"] == before["_emdash_collections"]
