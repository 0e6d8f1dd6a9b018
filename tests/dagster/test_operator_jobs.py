"""Operator jobs from the Launchpad: each is EmDash's guarded operator retry, reporting its
outcome in the `outcome` output's metadata and the run's outcome tag, never stealing a live
lease; bad input fails the run at once and changes nothing."""

import dagster as dg
import pytest
from sqlalchemy import update

from media_usage_orchestration import jobs
from media_usage_orchestration.dagster_kit.run_tags import OUTCOME_TAG
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.processing.reconciliation import driver, steps
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.deletion.records import DeletionPhase
from tests.support.cli import trusted_collection
from tests.support.deletions import tombstone, tombstone_row
from tests.support.operator_states import (
    fail_reconciliation,
    failed_tombstone,
    failed_work,
    leased_reconciliation,
    leased_tombstone,
    leased_work,
    reconciliation_row,
    removed_during_retry,
    seeded_reconciliation,
    work_of,
    work_row,
)
from tests.support.sensor_loop import resources_for, step_report
from tests.support.states import IMAGE_ONLY, all_rows, backdate, set_status, snapshot, status_row

WORK = jobs.retry_media_usage_work_job
DELETION = jobs.retry_collection_deletion_job
RECONCILIATION = jobs.retry_media_usage_reconciliation_job


@pytest.fixture(scope="module")
def instance():
    """One instance for the module: each run is found by its own id, and a new instance
    costs about a second."""
    with dg.DagsterInstance.ephemeral() as instance:
        yield instance


def _node(job: dg.JobDefinition) -> str:
    return job.graph.node_names()[0]


def _run(job: dg.JobDefinition, db, instance, config: dict, raise_on_error: bool = True):
    run_config = {"ops": {_node(job): {"config": config}}}
    dg.validate_run_config(job, run_config)
    return job.execute_in_process(
        run_config=run_config,
        instance=instance,
        resources=resources_for(db.url),
        raise_on_error=raise_on_error,
    )


def _outcome(job: dg.JobDefinition, db, instance, config: dict) -> dict:
    """Run the job; its outcome metadata, checked against the run's outcome tag."""
    result = _run(job, db, instance, config)
    metadata = step_report(result.all_events, _node(job))
    assert instance.get_run_by_id(result.run_id).tags[OUTCOME_TAG] == metadata["outcome"]
    return metadata


def _unchanged_outcome(job: dg.JobDefinition, db, instance, config: dict) -> dict:
    before = snapshot(db.engine)
    metadata = _outcome(job, db, instance, config)
    assert snapshot(db.engine) == before
    return metadata


def _assert_refused(job: dg.JobDefinition, db, instance, config: dict, message: str) -> None:
    """Bad input: the run fails once (no retry) with the message, and nothing changed."""
    before = snapshot(db.engine)
    result = _run(job, db, instance, config, raise_on_error=False)
    assert not result.success, config
    failure = result.failure_data_for_node(_node(job))
    assert message in failure.user_failure_data.description, (config, failure)
    retried = [event for event in result.all_events if event.is_step_up_for_retry]
    assert retried == [], config
    assert snapshot(db.engine) == before, config
    # The run failed in its first op: its outcome tag says why (the refusal's code).
    code = failure.user_failure_data.metadata["code"].value
    outcome = instance.get_run_by_id(result.run_id).tags[OUTCOME_TAG]
    assert outcome == code.lower().removeprefix("media_usage_"), (config, outcome)


# --- retry_media_usage_work: every failed entry -----------------------------------------------


def _fail_captured_work(engine, collection_id: str, content_ids: list[str]) -> None:
    """The work the capture triggers enqueued, failed for good."""
    with engine.begin() as connection:
        connection.execute(
            update(schema.work)
            .where(schema.work.c.collection_id == collection_id)
            .where(schema.work.c.content_id.in_(content_ids))
            .values(state="failed", attempt_count=5, last_error_code="MEDIA_USAGE_SNAPSHOT_FAILED")
        )


def test_work_job_reopens_every_failed_entry_of_the_collection(db, instance):
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    activate(db.engine)
    cms.insert_entries("posts", [{"id": f"entry-{i}", "hero": f"m-{i}"} for i in range(4)])
    _fail_captured_work(db.engine, posts.id, ["entry-1", "entry-2"])
    epoch = status_row(db.engine, "posts")["change_epoch"]

    metadata = _outcome(WORK, db, instance, {"collection": "posts"})

    assert metadata == {
        "outcome": "pending",
        "collection": "posts",
        "pending": 2,
        "lease_active": 0,
        "conflict": 0,
        "not_found": 0,
        "changed": 2,
        "more_failed": False,
    }
    reopened = {row["content_id"]: row for row in all_rows(db.engine, schema.work)}
    for content_id in ("entry-1", "entry-2"):
        row = reopened[content_id]
        assert (row["state"], row["attempt_count"], row["work_version"]) == ("pending", 0, 2)
        assert row["last_error_code"] is None
    assert reopened["entry-0"]["work_version"] == 1  # untouched
    assert status_row(db.engine, "posts")["change_epoch"] == epoch + 2


def test_work_job_is_bounded_by_its_limit(db, instance):
    posts = trusted_collection(db)
    for content_id in ("entry-1", "entry-2", "entry-3"):
        failed_work(db.engine, posts, content_id)

    metadata = _outcome(WORK, db, instance, {"collection": "posts", "limit": 2})

    assert (metadata["pending"], metadata["more_failed"]) == (2, True)
    assert len(all_rows(db.engine, schema.work, state="failed")) == 1


def test_work_job_reports_a_conflict_among_failed_entries_as_partial(db, instance):
    posts = trusted_collection(db)
    failed_work(db.engine, posts, "entry-1")
    removed_during_retry(db, "entry-1")

    metadata = _outcome(WORK, db, instance, {"collection": "posts"})

    assert (metadata["outcome"], metadata["conflict"], metadata["changed"]) == ("partial", 1, 0)


def test_work_job_without_failed_work_changes_nothing(db, instance):
    posts = trusted_collection(db)
    work_of(db.engine, posts, "entry-1", "pending")
    metadata = _unchanged_outcome(WORK, db, instance, {"collection": "posts"})
    assert (metadata["outcome"], metadata["changed"]) == ("no_failed_work", 0)


# --- retry_media_usage_work: one entry ---------------------------------------------------------


def test_work_job_for_one_entry_creates_work_for_absent_content(db, instance):
    posts = trusted_collection(db)
    config = {"collection": "posts", "content_id": "gone-entry"}

    metadata = _outcome(WORK, db, instance, config)

    assert metadata == {
        "outcome": "pending",
        "changed": True,
        "collection": "posts",
        "content_id": "gone-entry",
    }
    created = work_row(db.engine, posts, "gone-entry")
    assert (created["state"], created["collection_slug"]) == ("pending", "posts")


def test_work_job_for_pending_work_changes_nothing(db, instance):
    posts = trusted_collection(db)
    work_of(db.engine, posts, "entry-1", "pending")
    config = {"collection": "posts", "content_id": "entry-1"}
    metadata = _unchanged_outcome(WORK, db, instance, config)
    assert (metadata["outcome"], metadata["changed"]) == ("pending", False)


def test_work_job_never_takes_a_live_lease(db, instance):
    posts = trusted_collection(db)
    claimed = leased_work(db.engine, posts, "entry-1")
    config = {"collection": "posts", "content_id": "entry-1"}

    metadata = _unchanged_outcome(WORK, db, instance, config)

    assert (metadata["outcome"], metadata["changed"]) == ("lease_active", False)
    assert metadata["lease_expires_at"] == claimed.lease_expires_at
    assert claimed.lease_token not in str(metadata)


def test_work_job_reports_work_removed_during_the_retry_as_conflict(db, instance):
    posts = trusted_collection(db)
    failed_work(db.engine, posts, "entry-1")
    removed_during_retry(db, "entry-1")
    config = {"collection": "posts", "content_id": "entry-1"}
    assert _outcome(WORK, db, instance, config)["outcome"] == "conflict"


def test_work_job_for_a_collection_without_active_capture_is_not_found(db, instance):
    trusted_collection(db)
    set_status(db.engine, "posts", capture_state="installing")
    config = {"collection": "posts", "content_id": "entry-1"}
    assert _unchanged_outcome(WORK, db, instance, config)["outcome"] == "not_found"


def test_work_job_refuses_bad_input(db, instance):
    posts = trusted_collection(db)
    failed_work(db.engine, posts, "entry-1")
    cases = [
        ({"collection": "nope"}, "Collection 'nope' does not exist"),
        ({"collection": "nope", "content_id": "entry-1"}, "Collection 'nope' does not exist"),
        ({"collection": "Posts"}, "Invalid collection slug"),
        ({"collection": "posts", "limit": 0}, "from 1 to 100"),
        ({"collection": "posts", "limit": 101}, "from 1 to 100"),
        ({"collection": "posts", "content_id": ""}, "A content ID is required"),
    ]
    for config, message in cases:
        _assert_refused(WORK, db, instance, config, message)


# --- retry_collection_deletion -----------------------------------------------------------------


@pytest.mark.parametrize("by", ["collection_id", "collection"])
def test_deletion_job_reopens_a_failed_tombstone_in_its_phase(db, instance, by):
    posts = CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)
    failed_tombstone(db.engine, posts, DeletionPhase.SOURCES)
    config = {"collection_id": posts.id} if by == "collection_id" else {"collection": "posts"}

    metadata = _outcome(DELETION, db, instance, config)

    assert metadata == {"outcome": "pending", "changed": True, **config}
    row = tombstone_row(db.engine, posts.id)
    assert (row["state"], row["phase"], row["attempt_count"]) == ("pending", "sources", 0)


def test_deletion_job_never_takes_a_live_lease(db, instance):
    posts = CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)
    claim = leased_tombstone(db.engine, posts)

    metadata = _unchanged_outcome(DELETION, db, instance, {"collection_id": posts.id})

    assert metadata["outcome"] == "lease_active"
    assert metadata["lease_expires_at"] == claim.lease_expires_at
    assert claim.lease_token not in str(metadata)


def test_deletion_job_on_a_pending_tombstone_is_a_conflict(db, instance):
    posts = CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)
    tombstone(db.engine, posts, DeletionPhase.WORK, force=True)
    metadata = _unchanged_outcome(DELETION, db, instance, {"collection": "posts"})
    assert (metadata["outcome"], metadata["changed"]) == ("conflict", False)


@pytest.mark.parametrize(
    "config", [{"collection_id": "no-such-id"}, {"collection": "posts"}], ids=["id", "slug"]
)
def test_deletion_job_without_a_tombstone_is_not_found(db, instance, config):
    CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)
    assert _unchanged_outcome(DELETION, db, instance, config)["outcome"] == "not_found"


def test_deletion_job_refuses_bad_input(db, instance):
    posts = CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)
    failed_tombstone(db.engine, posts)
    cases = [
        ({}, "exactly one of collection id or slug"),
        ({"collection_id": posts.id, "collection": "posts"}, "exactly one of"),
        ({"collection": "Posts"}, "Invalid collection slug"),
        ({"collection_id": ""}, "A collection ID is required"),
    ]
    for config, message in cases:
        _assert_refused(DELETION, db, instance, config, message)


# --- retry_media_usage_reconciliation ----------------------------------------------------------


def test_reconciliation_job_reopens_a_failed_run_as_a_fresh_scan(db, instance):
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    activate(db.engine)
    attempt = steps.claim_collection(db.engine, posts.id)
    assert attempt.claim is not None
    fail_reconciliation(db.engine, posts)

    metadata = _outcome(RECONCILIATION, db, instance, {"collection": "posts"})

    assert metadata == {"outcome": "pending", "changed": True, "collection": "posts"}
    row = reconciliation_row(db.engine, posts)
    assert (row["state"], row["attempt_count"], row["target_epoch"]) == ("pending", 0, None)
    assert driver.run_to_completion(db.engine, posts.id).value == "completed"
    assert status_row(db.engine, "posts")["status"] == "complete"


def test_reconciliation_job_never_takes_a_live_lease_but_reopens_an_expired_one(db, instance):
    articles = seeded_reconciliation(db.engine)
    claim = leased_reconciliation(db.engine, articles)

    held = _unchanged_outcome(RECONCILIATION, db, instance, {"collection": "articles"})
    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=articles.id)
    expired = _outcome(RECONCILIATION, db, instance, {"collection": "articles"})

    assert (held["outcome"], held["lease_expires_at"]) == ("lease_active", claim.lease_expires_at)
    assert claim.lease_token not in str(held) and claim.run_token not in str(held)
    assert (expired["outcome"], expired["changed"]) == ("pending", True)
    assert reconciliation_row(db.engine, articles)["lease_token"] is None


def test_reconciliation_job_on_a_pending_run_is_a_conflict(db, instance):
    seeded_reconciliation(db.engine)
    metadata = _unchanged_outcome(RECONCILIATION, db, instance, {"collection": "articles"})
    assert metadata["outcome"] == "conflict"


def test_reconciliation_job_without_a_reconciliation_is_not_found(db, instance):
    trusted_collection(db, "articles")
    metadata = _unchanged_outcome(RECONCILIATION, db, instance, {"collection": "articles"})
    assert metadata["outcome"] == "not_found"


def test_reconciliation_job_refuses_bad_input(db, instance):
    fail_reconciliation(db.engine, seeded_reconciliation(db.engine))
    cases = [
        ({"collection": "nope"}, "Collection 'nope' does not exist"),
        ({"collection": "1bad"}, "Invalid collection slug"),
    ]
    for config, message in cases:
        _assert_refused(RECONCILIATION, db, instance, config, message)
