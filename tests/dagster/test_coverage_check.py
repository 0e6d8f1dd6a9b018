"""What the asset page shows for a collection equals `media-usage status` for it, after every
kind of run that changes the collection: the partition's latest materialization carries the
status numbers, and its latest `coverage_complete` evaluation passes exactly when the status
says complete with no failed and no stuck work."""

import dagster as dg
import pytest
from dagster._core.event_api import PartitionKeyFilter

from media_usage_orchestration.assets.index import COVERAGE_CHECK, MEDIA_USAGE_INDEX
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import sample_entry
from media_usage_orchestration.processing.operator import collection_statuses
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.work import WorkRepository
from tests.support.reconciliation_runs import (
    OUTCOME_TAG,
    PARTITIONS,
    RESOURCE_LIMIT,
    activate_with_job,
    oversized_entry,
    run_partition,
    write_collections,
)
from tests.support.sensor_loop import plain, resources
from tests.support.states import backdate

CHECK_KEY = dg.AssetCheckKey(MEDIA_USAGE_INDEX, COVERAGE_CHECK)
# The numbers the asset page and `media-usage status` both show.
SHOWN = (
    "entries",
    "sources",
    "occurrences",
    "pending_work",
    "failed_work",
    "stuck_work",
)

pytestmark = pytest.mark.slow


def _job(name: str) -> dg.JobDefinition:
    return defs.resolve_job_def(name)


def _status(db, slug: str):
    """The row `media-usage status` prints for the collection (None once deleted)."""
    return next((s for s in collection_statuses(db.engine) if s.collection_slug == slug), None)


def _page(instance: dg.DagsterInstance, slug: str) -> dict:
    """The partition's latest materialization, as the asset page shows it."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=MEDIA_USAGE_INDEX, asset_partitions=[slug]), limit=1
    )
    return plain(records.records[0].asset_materialization.metadata)


def _check(instance: dg.DagsterInstance, slug: str) -> dg.AssetCheckEvaluation:
    [record] = instance.event_log_storage.get_asset_check_execution_history(
        CHECK_KEY, limit=1, partition_filter=PartitionKeyFilter(key=slug)
    )
    assert record.partition == slug
    return record.event.asset_check_evaluation


def assert_page_equals_status(db, instance: dg.DagsterInstance, slug: str) -> bool:
    """The page's numbers and the check's verdict against the status; returns the verdict."""
    status, page, check = _status(db, slug), _page(instance, slug), _check(instance, slug)
    assert page["coverage"] == check.metadata["coverage"].value == status.status
    assert {name: page[name] for name in SHOWN} == {name: getattr(status, name) for name in SHOWN}
    assert {name: check.metadata[name].value for name in SHOWN} == {
        name: getattr(status, name) for name in SHOWN
    }
    complete = status.status == "complete" and status.failed_work == 0 == status.stuck_work
    assert check.passed is complete
    assert check.severity is dg.AssetCheckSeverity.ERROR
    assert page["error_code"] == (status.last_error_code or "-")
    # The evaluation targets the latest materialization, so the check's Partitions tab counts
    # it (passed or failed) instead of showing the partition as not evaluated.
    [info] = instance.event_log_storage.get_asset_check_partition_info(
        [CHECK_KEY], partition_keys=[slug]
    )
    assert info.is_current
    return check.passed


def test_the_asset_page_equals_status_after_every_kind_of_run(db):
    write_collections(db.engine, {"articles": 12, "pages": 8})
    writer = CmsWriter(db.engine)
    with dg.DagsterInstance.ephemeral() as instance:
        # Activation: capture installed, coverage not trusted yet.
        activate_with_job(db, instance)
        for slug in ("articles", "pages"):
            assert assert_page_equals_status(db, instance, slug) is False

        # Reconciliation completes coverage.
        for slug in ("articles", "pages"):
            assert run_partition(db, instance, slug).success
            assert assert_page_equals_status(db, instance, slug) is True

        # A work run with nothing due is tagged with why it stopped.
        idle = _job("media_usage_work").execute_in_process(
            instance=instance, resources=resources(db)
        )
        assert instance.get_run_by_id(idle.run_id).tags[OUTCOME_TAG] == "nothing_due"

        # Work: one entry projected, one failing for good on the resource limit.
        writer.update_entry("articles", sample_entry("art", 1)["id"], {"title": "edited"})
        writer.insert_entry("pages", oversized_entry("oversized"))
        # One run per collection, each taking the collection due earliest: articles, then pages.
        projected, work = (
            _job("media_usage_work").execute_in_process(instance=instance, resources=resources(db))
            for _ in range(2)
        )
        assert projected.success and work.success  # a failure is its row's state, not the run's
        assert instance.get_run_by_id(projected.run_id).tags[OUTCOME_TAG] == "projected"
        assert assert_page_equals_status(db, instance, "articles") is True
        assert assert_page_equals_status(db, instance, "pages") is False
        assert (
            _page(instance, "pages")["work_failed"],
            _page(instance, "articles")["work_failed"],
        ) == (1, 0)
        pages = _status(db, "pages")
        assert (pages.failed_work, pages.failed_work_codes) == (1, {RESOURCE_LIMIT: 1})
        assert _check(instance, "pages").metadata["failed_work_codes"].value == (
            f"{RESOURCE_LIMIT}: 1"
        )
        assert instance.get_run_by_id(work.run_id).tags[OUTCOME_TAG] == "failed_work"
        [warning] = [
            record.user_message
            for record in instance.all_logs(work.run_id)
            if record.level == 30 and "failed for good" in record.user_message
        ]
        assert "1 item(s)" in warning and f"pages: 1 (failed work now: {RESOURCE_LIMIT}: 1)" in (
            warning
        )

        # An operator's retry reopens the failed item: no failed work, still not complete.
        retry = _job("retry_media_usage_work").execute_in_process(
            instance=instance,
            resources=resources(db),
            run_config={"ops": {"reopen_failed_work": {"config": {"collection": "pages"}}}},
        )
        assert retry.success
        assert assert_page_equals_status(db, instance, "pages") is False
        assert _page(instance, "pages")["operator_retry"] == "work"
        assert (_status(db, "pages").failed_work, _status(db, "pages").pending_work) == (0, 1)

        # Stuck work: a claimed item whose lease expired. The check job evaluates it on demand.
        [claimed] = WorkRepository(db.engine).claim_due_batch(1, 60)
        backdate(db.engine, schema.work, "lease_expires_at", 120, content_id=claimed.content_id)
        check_run = _job("media_usage_coverage_check").execute_in_process(
            instance=instance, resources=resources(db), tags={"dagster/partition": "pages"}
        )
        assert check_run.success
        assert _status(db, "pages").stuck_work == 1
        evaluation = _check(instance, "pages")
        assert (evaluation.passed, evaluation.metadata["stuck_work"].value) == (False, 1)
        assert "1 stuck work item(s)" in evaluation.description

        # Deletion: the collection leaves the status and its partition leaves the asset.
        deletion = _job("request_collection_deletion").execute_in_process(
            instance=instance,
            resources=resources(db),
            run_config={
                "ops": {"request_deletion": {"config": {"collection": "articles", "force": True}}}
            },
        )
        assert deletion.success
        assert _status(db, "articles") is None
        assert instance.get_dynamic_partitions(PARTITIONS) == ["pages"]
