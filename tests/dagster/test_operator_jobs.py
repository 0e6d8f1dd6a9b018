"""Operator jobs from the Launchpad: each is EmDash's guarded operator retry, reporting its
outcome and never stealing a live lease."""

import dagster as dg
import pytest
from sqlalchemy import update

from media_usage_orchestration import jobs
from media_usage_orchestration.cms import CmsWriter
from media_usage_orchestration.processing import reconciliation
from media_usage_orchestration.processing.activation import activate
from media_usage_orchestration.store import schema
from media_usage_orchestration.store.deletions import DeletionPhase, DeletionRepository
from tests.dagster.sensor_loop import output_metadata, resources_for
from tests.store.deletion_helpers import tombstone
from tests.support import IMAGE_ONLY, all_rows, one, status_row


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def _run(job: dg.JobDefinition, db, instance, config: dict, raise_on_error: bool = True):
    node = job.graph.node_names()[0]
    run_config = {"ops": {node: {"config": config}}}
    dg.validate_run_config(job, run_config)
    return job.execute_in_process(
        run_config=run_config,
        instance=instance,
        resources=resources_for(db.url),
        raise_on_error=raise_on_error,
    )


def _metadata(result: dg.ExecuteInProcessResult) -> dict:
    node = result.job_def.graph.node_names()[0]
    return output_metadata(result, node)


def _fail_work(engine, collection_id: str, content_ids: list[str]) -> None:
    with engine.begin() as connection:
        connection.execute(
            update(schema.work)
            .where(schema.work.c.collection_id == collection_id)
            .where(schema.work.c.content_id.in_(content_ids))
            .values(state="failed", attempt_count=5, last_error_code="MEDIA_USAGE_SNAPSHOT_FAILED")
        )


def test_retry_media_usage_work_reopens_every_failed_entry_of_the_collection(db, instance):
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    activate(db.engine)
    cms.insert_entries("posts", [{"id": f"entry-{i}", "hero": f"m-{i}"} for i in range(4)])
    _fail_work(db.engine, posts.id, ["entry-1", "entry-2"])
    epoch = status_row(db.engine, "posts")["change_epoch"]

    result = _run(jobs.retry_media_usage_work_job, db, instance, {"collection": "posts"})

    assert _metadata(result)["reopened"] == 2
    reopened = {row["content_id"]: row for row in all_rows(db.engine, schema.work)}
    for content_id in ("entry-1", "entry-2"):
        row = reopened[content_id]
        assert (row["state"], row["attempt_count"], row["work_version"]) == ("pending", 0, 2)
        assert row["last_error_code"] is None
    assert reopened["entry-0"]["work_version"] == 1  # untouched
    assert status_row(db.engine, "posts")["change_epoch"] == epoch + 2


def test_retry_media_usage_work_of_named_entries_creates_work_for_absent_content(db, instance):
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    activate(db.engine)
    config = {"collection": "posts", "content_ids": ["gone-entry"]}
    result = _run(jobs.retry_media_usage_work_job, db, instance, config)
    assert _metadata(result)["reopened"] == 1
    created = one(db.engine, schema.work, content_id="gone-entry")
    assert created["collection_id"] == posts.id and created["state"] == "pending"


def test_retry_media_usage_work_refuses_an_unknown_collection(db, instance):
    result = _run(
        jobs.retry_media_usage_work_job, db, instance, {"collection": "nope"}, raise_on_error=False
    )
    assert not result.success
    assert all_rows(db.engine, schema.work) == []


def test_retry_collection_deletion_reopens_a_failed_tombstone_in_its_phase(db, instance):
    posts = CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)
    tombstone(db.engine, posts, DeletionPhase.SOURCES, force=True)
    table = schema.collection_deletions
    with db.engine.begin() as connection:
        connection.execute(
            update(table).values(state="failed", attempt_count=5, last_error_code="X_FAILED")
        )

    result = _run(jobs.retry_collection_deletion_job, db, instance, {"collection_id": posts.id})

    assert _metadata(result)["outcome"] == "pending"
    row = one(db.engine, table, collection_id=posts.id)
    assert (row["state"], row["phase"], row["attempt_count"]) == ("pending", "sources", 0)


def test_retry_collection_deletion_never_steals_a_live_lease(db, instance):
    posts = CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)
    tombstone(db.engine, posts, DeletionPhase.WORK, force=True)
    claim = DeletionRepository(db.engine).claim(posts.id, DeletionPhase.WORK, 300)

    result = _run(jobs.retry_collection_deletion_job, db, instance, {"collection_id": posts.id})

    metadata = _metadata(result)
    assert metadata["outcome"] == "lease_active"
    assert metadata["lease_expires_at"] == claim.lease_expires_at
    assert one(db.engine, schema.collection_deletions)["lease_token"] == claim.lease_token
    missing = _run(
        jobs.retry_collection_deletion_job,
        db,
        instance,
        {"collection_id": "no-such-id"},
        raise_on_error=False,
    )
    assert not missing.success


def test_retry_reconciliation_reopens_a_failed_run_and_respects_a_live_lease(db, instance):
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    activate(db.engine)
    attempt = reconciliation.claim_collection(db.engine, posts.id)
    assert attempt.claim is not None

    held = _run(jobs.retry_media_usage_reconciliation_job, db, instance, {"collection": "posts"})
    assert _metadata(held)["outcome"] == "lease_active"

    table = schema.reconciliations
    with db.engine.begin() as connection:
        connection.execute(
            update(table).values(
                state="failed", lease_token=None, lease_expires_at=None, attempt_count=5
            )
        )
    reopened = _run(jobs.retry_media_usage_reconciliation_job, db, instance, {"collection": "posts"})
    assert _metadata(reopened)["outcome"] == "reopened"
    row = one(db.engine, table, collection_id=posts.id)
    assert (row["state"], row["attempt_count"], row["target_epoch"]) == ("pending", 0, None)
    assert reconciliation.run_to_completion(db.engine, posts.id).value == "completed"
    assert status_row(db.engine, "posts")["status"] == "complete"
