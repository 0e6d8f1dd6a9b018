"""What the UI shows for a collection equals `media-usage status` for it, after every kind of
run that changes the collection: the `media_usage_index` partition's latest materialization
carries the status numbers, no run evaluates `coverage_complete`, and after the queue sensor's
next tick its latest evaluation carries the same numbers and fails exactly on what an operator
must act on (failed work, a failed reconciliation)."""

import dagster as dg
import pytest

from media_usage_orchestration.assets.coverage_history import coverage_history_key
from media_usage_orchestration.assets.health import COVERAGE_CHECK, QUEUE_CHECK
from media_usage_orchestration.assets.index import MEDIA_USAGE_INDEX
from media_usage_orchestration.assets.queue import queue_key
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import sample_entry
from media_usage_orchestration.processing.operator.actions import collection_statuses
from media_usage_orchestration.sensors.queue import media_usage_queue_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.work.repository import WorkRepository
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


def _tick(db, instance: dg.DagsterInstance) -> None:
    """The queue sensor's tick, its events stored as the daemon stores them."""
    with dg.build_sensor_context(instance=instance, resources=resources(db)) as context:
        data = media_usage_queue_sensor.evaluate_tick(context)
    for event in data.asset_events:
        instance.report_runless_asset_event(event)


def _check(
    instance: dg.DagsterInstance, slug: str, check: str = COVERAGE_CHECK
) -> dg.AssetCheckEvaluation:
    asset = coverage_history_key(slug) if check == COVERAGE_CHECK else queue_key(slug)
    record = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(asset, check))
    return record.evaluation


def _evaluated_in_runs(instance: dg.DagsterInstance) -> list[str]:
    return [
        record.run_id
        for slug in ("articles", "pages")
        for record in instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(coverage_history_key(slug), COVERAGE_CHECK), limit=100
        )
        if record.run_id
    ]


def assert_page_equals_status(db, instance: dg.DagsterInstance, slug: str) -> bool:
    """The page's numbers and, after a queue sensor tick, the check's against the status;
    returns the check's verdict."""
    status, page = _status(db, slug), _page(instance, slug)
    assert page["coverage"] == status.status
    assert {name: page[name] for name in SHOWN} == {name: getattr(status, name) for name in SHOWN}
    assert page["error_code"] == (status.last_error_code or "-")
    assert _evaluated_in_runs(instance) == []  # no run evaluates the check
    _tick(db, instance)
    # The numbers on the collection's own asset (observed when they change), the verdict on its
    # check (evaluated when it changes).
    [observed] = instance.fetch_observations(coverage_history_key(slug), limit=1).records
    numbers = observed.asset_observation.metadata
    assert numbers["coverage"].value == status.status
    assert {name: numbers[name].value for name in SHOWN} == {
        name: getattr(status, name) for name in SHOWN
    }
    check = _check(instance, slug)
    # Everything here changed moments ago: only what an operator must act on fails.
    assert check.passed is (status.failed_work == 0 and status.status != "failed")
    assert check.severity is dg.AssetCheckSeverity.ERROR
    return check.passed


def test_the_asset_page_equals_status_after_every_kind_of_run(db):
    write_collections(db.engine, {"articles": 12, "pages": 8})
    writer = CmsWriter(db.engine)
    with dg.DagsterInstance.ephemeral() as instance:
        # Activation: capture installed, coverage on its way (not a failure yet).
        activate_with_job(db, instance)
        for slug in ("articles", "pages"):
            assert assert_page_equals_status(db, instance, slug) is True
            assert "making progress" in _check(instance, slug).description

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

        # An operator's retry reopens the failed item: no failed work, pending again.
        retry = _job("retry_media_usage_work").execute_in_process(
            instance=instance,
            resources=resources(db),
            run_config={"ops": {"reopen_failed_work": {"config": {"collection": "pages"}}}},
        )
        assert retry.success
        assert assert_page_equals_status(db, instance, "pages") is True
        assert _page(instance, "pages")["operator_retry"] == "work"
        assert (_status(db, "pages").failed_work, _status(db, "pages").pending_work) == (0, 1)

        # Stuck work: a claimed item whose lease expired. The queue's check says so.
        [claimed] = WorkRepository(db.engine).claim_due_batch(1, 60)
        backdate(db.engine, schema.work, "lease_expires_at", 120, content_id=claimed.content_id)
        _tick(db, instance)
        assert _status(db, "pages").stuck_work == 1
        [observed] = instance.fetch_observations(coverage_history_key("pages"), limit=1).records
        assert observed.asset_observation.metadata["stuck_work"].value == 1
        assert _check(instance, "pages").passed  # the queue's concern, not the coverage's
        evaluation = _check(instance, "pages", QUEUE_CHECK)
        assert not evaluation.passed
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
