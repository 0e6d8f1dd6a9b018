"""Every run of one collection carries `media_usage/collection` with its slug, however it was
launched: from the Launchpad (no tags), as a backfill's partitioned run, as an operator retry
or a deletion. The Runs filter on that tag finds them."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest

from media_usage_orchestration import jobs
from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_TAG
from media_usage_orchestration.definitions import defs
from tests.support.reconciliation_runs import PARTITIONS
from tests.support.reconciliation_steps import (
    captured_collection,
    image_entry,
    untrusted_collection,
)
from tests.support.sensor_loop import resources

SLUG = "articles"


def launch(db, instance, job: dg.JobDefinition, ops: dict[str, Any] | None = None, **options):
    """A run as the Launchpad starts it: run config only, no tags."""
    job = defs.resolve_job_def(job.name)
    run_config = {"ops": {name: {"config": config} for name, config in (ops or {}).items()}}
    dg.validate_run_config(job, run_config)
    result = job.execute_in_process(
        run_config=run_config,
        instance=instance,
        resources=resources(db),
        raise_on_error=False,
        **options,
    )
    assert result.success, result.all_events
    return result.run_id


def runs_tagged(instance, slug: str) -> set[str]:
    found = instance.get_runs(filters=dg.RunsFilter(tags={COLLECTION_TAG: slug}))
    return {run.run_id for run in found}


@pytest.fixture
def collection(db):
    return untrusted_collection(db.engine, SLUG, ["entry-1", "entry-2"])


def test_a_partitioned_reconciliation_run_is_tagged_with_its_partition(db, collection):
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(PARTITIONS, [SLUG])
        # A backfill launches exactly this: the job with a partition key and no collection tag.
        run_id = launch(db, instance, jobs.media_usage_reconciliation, partition_key=SLUG)
        assert runs_tagged(instance, SLUG) == {run_id}
        assert instance.get_run_by_id(run_id).tags[COLLECTION_TAG] == SLUG


@pytest.mark.parametrize(
    ("job", "ops"),
    [
        (jobs.retry_media_usage_work_job, {"reopen_failed_work": {"collection": SLUG}}),
        (
            jobs.retry_media_usage_work_job,
            {"reopen_failed_work": {"collection": SLUG, "content_id": "entry-1"}},
        ),
        (
            jobs.retry_media_usage_reconciliation_job,
            {"reopen_reconciliation": {"collection": SLUG}},
        ),
        (jobs.retry_collection_deletion_job, {"reopen_collection_deletion": {"collection": SLUG}}),
    ],
    ids=["retry_work", "retry_work_item", "retry_reconciliation", "retry_deletion_by_slug"],
)
def test_an_operator_retry_run_is_tagged_with_its_collection(db, collection, job, ops):
    with dg.DagsterInstance.ephemeral() as instance:
        run_id = launch(db, instance, job, ops)
        assert runs_tagged(instance, SLUG) == {run_id}


def test_every_deletion_run_is_tagged_with_the_slug_the_tombstone_keeps(db):
    collection = captured_collection(db.engine, SLUG, [image_entry("entry-1")])
    with dg.DagsterInstance.ephemeral() as instance:
        request = launch(
            db,
            instance,
            jobs.request_collection_deletion,
            {"request_deletion": {"collection": SLUG, "force": True}},
        )
        # The registry row is gone now: the slug comes from the tombstone.
        by_id = {"collection_id": collection.id}
        retry = launch(
            db, instance, jobs.retry_collection_deletion_job, {"reopen_collection_deletion": by_id}
        )
        background = launch(
            db, instance, jobs.media_usage_collection_deletion, {"claim_deletion": by_id}
        )
        assert runs_tagged(instance, SLUG) == {request, retry, background}


def test_a_run_of_another_collection_is_not_found_under_this_slug(db, collection):
    untrusted_collection(db.engine, "pages", ["entry-1"])
    with dg.DagsterInstance.ephemeral() as instance:
        launch(
            db,
            instance,
            jobs.retry_media_usage_reconciliation_job,
            {"reopen_reconciliation": {"collection": "pages"}},
        )
        assert runs_tagged(instance, SLUG) == set()
        assert len(runs_tagged(instance, "pages")) == 1


def test_a_bad_slug_is_refused_and_never_tagged(db, collection):
    with dg.DagsterInstance.ephemeral() as instance:
        job = defs.resolve_job_def(jobs.retry_media_usage_reconciliation_job.name)
        result = job.execute_in_process(
            run_config={"ops": {"reopen_reconciliation": {"config": {"collection": "Bad Slug"}}}},
            instance=instance,
            resources=resources(db),
            raise_on_error=False,
        )
        assert not result.success
        assert COLLECTION_TAG not in instance.get_run_by_id(result.run_id).tags
