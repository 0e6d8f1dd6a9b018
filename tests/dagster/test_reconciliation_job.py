"""The reconciliation job end to end on both dialects: executed in process per partition, driven
by its sensor, re-executed from a failure, backfilled over two partitions; the maintenance job
and its schedule; the automation switch.

Content is written before capture is activated (by the activation job), so every collection
starts untrusted and only a reconciliation makes its coverage complete. Each end-to-end test
ends with the oracle: the stored index equals what extraction computes from the content.
"""

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.execution.backfill import BulkActionStatus
from dagster._core.test_utils import create_run_for_test

from media_usage_orchestration.local.in_process_lane import execute_request
from media_usage_orchestration.processing.reconciliation import steps
from media_usage_orchestration.schedules import media_usage_maintenance_schedule
from media_usage_orchestration.sensors.reconciliation import media_usage_reconciliation_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV
from tests.support import reconstructable_jobs
from tests.support.projection import canonical_key
from tests.support.reconciliation_runs import (
    COLLECTION_ID_TAG,
    COLLECTION_TAG,
    COMPLETE_RUN,
    FAILED_CODE,
    MAINTENANCE_JOB,
    OUTCOME_TAG,
    PARTITION_TAG,
    PARTITIONS,
    PROJECT_ROOT,
    RECONCILIATION_JOB,
    RECONCILIATION_OPS,
    activate_with_job,
    assert_coverage_complete,
    backfill_runs,
    daemon_workspace,
    launch_partition_backfill,
    outcome_of,
    resources,
    run_events,
    run_partition,
    step_outcomes,
    tick,
    write_collections,
)
from tests.support.sensor_loop import drain, plain, requested_partition_keys
from tests.support.states import all_rows, count, one, status_row

SIZES = {"articles": 500, "pages": 500, "posts": 500}
SLUGS = sorted(SIZES)


def _untrusted(db, slug: str) -> bool:
    status = status_row(db.engine, slug)
    return (status["capture_state"], status["reconciliation_required"]) == ("active", 1)


# --- the job, in process ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_job_reconciles_three_collections_of_500_entries(db):
    collections = write_collections(db.engine, SIZES)
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        assert all(_untrusted(db, slug) for slug in SLUGS)
        instance.add_dynamic_partitions(PARTITIONS, SLUGS)

        for slug in SLUGS:
            result = run_partition(db, instance, slug)

            assert result.success
            assert step_outcomes(result.all_events) == COMPLETE_RUN
            assert outcome_of(result.all_events, "scan_pages")["pages"] == 10
            assert outcome_of(result.all_events, "drain_collection_work")["completed"] == 500
            assert outcome_of(result.all_events, "scan_sources")["pages"] == 10
            run = instance.get_run_by_id(result.run_id)
            assert (run.tags[PARTITION_TAG], run.tags[OUTCOME_TAG]) == (slug, "completed")
            assert status_row(db.engine, slug)["status"] == "complete"

    assert_coverage_complete(db.engine, list(collections.values()))
    assert count(db.engine, schema.sources) == 1500


# --- what a run reports -------------------------------------------------------------------------


def _outcome_tag_writes(instance: dg.DagsterInstance, monkeypatch) -> list[str]:
    """The `media_usage/outcome` values written to the instance's runs from now on."""
    written = []
    add_run_tags = instance.add_run_tags

    def recording(run_id, new_tags):
        if OUTCOME_TAG in new_tags:
            written.append(new_tags[OUTCOME_TAG])
        return add_run_tags(run_id, new_tags)

    monkeypatch.setattr(instance, "add_run_tags", recording)
    return written


def _outputs(result: dg.ExecuteInProcessResult) -> dict[str, list[str]]:
    outputs: dict[str, list[str]] = {}
    for event in result.all_node_events:
        if event.is_successful_output:
            outputs.setdefault(event.step_key, []).append(event.step_output_data.output_name)
    return outputs


def _messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [entry.user_message for entry in instance.all_logs(run_id)]


def test_each_op_reports_on_the_one_output_it_yields_and_the_last_tags_the_run(db, monkeypatch):
    write_collections(db.engine, {"articles": 3})
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        written = _outcome_tag_writes(instance, monkeypatch)
        result = run_partition(db, instance, "articles")
        run = instance.get_run_by_id(result.run_id)
        messages = _messages(instance, result.run_id)

    assert step_outcomes(result.all_events) == COMPLETE_RUN
    # The claim handed on carries what its op did; the last op stops the run on `outcome`.
    assert _outputs(result) == {
        **{op_name: ["lease"] for op_name in RECONCILIATION_OPS[:-1]},
        "finalize_coverage": ["outcome"],
    }
    assert outcome_of(result.all_events, "drain_collection_work")["completed"] == 3
    # Written once, by the op with the run's final word; its end skips nothing, so no line.
    assert (written, run.tags[OUTCOME_TAG]) == (["completed"], "completed")
    assert not [message for message in messages if message.startswith("stopping here")]


def test_an_op_that_stops_the_run_early_tags_it_and_says_why(db, monkeypatch):
    write_collections(db.engine, {"articles": 60})  # two scan pages
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        written = _outcome_tag_writes(instance, monkeypatch)
        budget = {"ops": {"scan_pages": {"config": {"max_pages": 1}}}}
        result = run_partition(db, instance, "articles", run_config=budget)
        run = instance.get_run_by_id(result.run_id)
        messages = _messages(instance, result.run_id)

    assert result.success
    assert _outputs(result) == {
        "claim_reconciliation": ["lease"],
        "prepare_run": ["lease"],
        "scan_pages": ["outcome"],
    }
    assert outcome_of(result.all_events, "scan_pages") == {
        "outcome": "budget_exhausted",
        "pages": 1,
        "restarts": 0,
    }
    assert (written, run.tags[OUTCOME_TAG]) == (["budget_exhausted"], "budget_exhausted")
    assert "stopping here: budget_exhausted" in messages


def test_the_last_op_a_run_executes_tags_it_though_it_hands_the_claim_on(db, monkeypatch):
    write_collections(db.engine, {"articles": 3})
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        written = _outcome_tag_writes(instance, monkeypatch)
        result = run_partition(db, instance, "articles", op_selection=["claim_reconciliation"])
        run = instance.get_run_by_id(result.run_id)

    assert _outputs(result) == {"claim_reconciliation": ["lease"]}
    assert outcome_of(result.all_events, "claim_reconciliation")["outcome"] == "claimed"
    assert (written, run.tags[OUTCOME_TAG]) == (["claimed"], "claimed")


# --- the sensor path ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_sensor_path_reaches_complete_coverage(db):
    collections = write_collections(db.engine, SIZES)
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        sensor = media_usage_reconciliation_sensor
        drained = drain(instance, resources(db), [sensor], max_rounds=6)
        for result in drained.of(sensor):
            assert step_outcomes(result.all_events) == COMPLETE_RUN
        ticks = [
            (
                requested_partition_keys(data),
                list(data.run_requests or []),
                data.skip_message,
            )
            for data in drained.ticks_of(sensor)
        ]

        # The activation run recorded each collection's coverage, which added its partition,
        # so the first tick asks for the runs at once.
        assert sorted(instance.get_dynamic_partitions(PARTITIONS)) == SLUGS
        assert [(added, len(requests)) for added, requests, _ in ticks] == [([], 3), ([], 0)]
        assert ticks[-1][2] == "no collection needs a reconciliation run now"
        requests = ticks[0][1]
        assert sorted(request.partition_key for request in requests) == SLUGS
        for request in requests:
            collection = collections[request.partition_key]
            assert request.run_key.startswith(f"reconcile:{collection.id}:")
            assert (request.tags[COLLECTION_ID_TAG], request.tags[COLLECTION_TAG]) == (
                collection.id,
                collection.slug,
            )
        assert len(instance.get_runs(filters=dg.RunsFilter(job_name=RECONCILIATION_JOB.name))) == 3

    assert_coverage_complete(db.engine, list(collections.values()))


def test_the_sensor_asks_for_no_run_while_that_collection_has_one_in_flight(db):
    collections = write_collections(db.engine, {"articles": 2, "pages": 2})
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        instance.add_dynamic_partitions(PARTITIONS, ["articles", "pages"])
        create_run_for_test(
            instance,
            job_name=RECONCILIATION_JOB.name,
            status=dg.DagsterRunStatus.STARTED,
            tags={COLLECTION_ID_TAG: collections["articles"].id},
        )

        data = tick(db, instance)

    assert [request.partition_key for request in data.run_requests] == ["pages"]
    assert not data.dynamic_partitions_requests


# --- re-execution from failure --------------------------------------------------------------------


def test_re_execution_from_failure_resumes_the_run_at_its_checkpoint(db, monkeypatch):
    """The source walk raises once after its first page: the step fails with the failure
    recorded on the row. Re-executed from failure, only the failed op and the one after it
    run; they regain the row at its checkpoint and finish the reconciliation."""
    collections = write_collections(db.engine, {"articles": 120})
    articles = collections["articles"]
    monkeypatch.setenv(DATABASE_URL_ENV, db.url)
    walked = []

    def source_page_failing_once(engine, claim, *lease_seconds):
        walked.append(claim.lease_token)
        if len(walked) == 2:
            raise RuntimeError("injected")
        return source_page(engine, claim, *lease_seconds)

    source_page = steps.source_page
    monkeypatch.setattr(steps, "source_page", source_page_failing_once)
    job = dg.reconstructable(reconstructable_jobs.media_usage_reconciliation)
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        instance.add_dynamic_partitions(PARTITIONS, ["articles"])

        with dg.execute_job(job, instance=instance, tags={PARTITION_TAG: "articles"}) as failed:
            assert not failed.success
            failed_events = failed.all_events
            failed_run_id = failed.run_id
        assert step_outcomes(failed_events) == {
            op_name: COMPLETE_RUN[op_name] for op_name in RECONCILIATION_OPS[:4]
        }
        [failure] = [event for event in failed_events if event.is_step_failure]
        assert failure.step_key == "scan_sources"
        assert plain(failure.step_failure_data.user_failure_data.metadata) == {"outcome": "retry"}
        assert instance.get_run_by_id(failed_run_id).tags[OUTCOME_TAG] == "retry"
        row = one(db.engine, schema.reconciliations, collection_id=articles.id)
        assert (row["state"], row["attempt_count"], row["last_error_code"]) == (
            "retry",
            1,
            FAILED_CODE,
        )
        first_page_end = canonical_key(articles, "art-e00049")
        assert (row["phase"], row["source_cursor"]) == ("sources", first_page_end)

        options = dg.ReexecutionOptions.from_failure(failed_run_id, instance)
        # The UI copies the parent's partition tag onto the re-execution; execute_job does not.
        tags = {PARTITION_TAG: "articles"}
        with dg.execute_job(
            job, instance=instance, reexecution_options=options, tags=tags
        ) as resumed:
            assert resumed.success
            resumed_events = resumed.all_events
            run = instance.get_run_by_id(resumed.run_id)
        # The claim went from op to op in memory and back from the database, never pickled.
        stored = list(Path(instance.storage_directory()).rglob("*"))
    assert stored == []
    assert [
        event.event_specific_data.metadata
        for event in failed_events + resumed_events
        if event.event_type_value == "HANDLED_OUTPUT"
        and "path" in event.event_specific_data.metadata
    ] == []

    assert run.parent_run_id == failed_run_id
    assert (run.tags[PARTITION_TAG], run.tags[OUTCOME_TAG]) == ("articles", "completed")
    assert step_outcomes(resumed_events) == {
        "scan_sources": "exhausted",
        "finalize_coverage": "completed",
    }
    # Resumed after the first page: the two remaining pages of 120 sources.
    assert outcome_of(resumed_events, "scan_sources")["pages"] == 2
    assert_coverage_complete(db.engine, [articles])


# --- a backfill over two partitions ---------------------------------------------------------------


@pytest.mark.slow
def test_a_backfill_over_two_partitions_reconciles_both(db, monkeypatch):
    """The operator's backfill as the UI launches it: the `launchPartitionBackfill` mutation
    stores a job backfill over two partitions, and the real backfill daemon iteration submits
    one run per partition through the project's code location (served by a gRPC code
    server); the synchronous launcher executes each run as it is submitted. Driving the
    daemon's own iteration covers what a daemon process would do, in seconds."""
    collections = write_collections(db.engine, {"articles": 60, "pages": 60, "posts": 60})
    monkeypatch.setenv(DATABASE_URL_ENV, db.url)
    with dg.instance_for_test(
        synchronous_run_coordinator=True, synchronous_run_launcher=True
    ) as instance:
        activate_with_job(db, instance)
        instance.add_dynamic_partitions(PARTITIONS, SLUGS)
        with daemon_workspace(instance) as workspace:
            backfill_id = launch_partition_backfill(
                workspace, ["articles", "pages"], {"media_usage/requested_by": "operator"}
            )
            runs = backfill_runs(instance, workspace, backfill_id)

        assert instance.get_backfill(backfill_id).status in (
            BulkActionStatus.COMPLETED,
            BulkActionStatus.COMPLETED_SUCCESS,
        )
        assert sorted(run.tags[PARTITION_TAG] for run in runs) == ["articles", "pages"]
        for run in runs:
            assert run.status is dg.DagsterRunStatus.SUCCESS
            assert run.tags["media_usage/requested_by"] == "operator"
            assert step_outcomes(run_events(instance, run.run_id)) == COMPLETE_RUN

    assert_coverage_complete(db.engine, [collections["articles"], collections["pages"]])
    assert _untrusted(db, "posts")
    assert all_rows(db.engine, schema.sources, collection_id=collections["posts"].id) == []


# --- maintenance --------------------------------------------------------------------------------


def test_the_maintenance_schedule_runs_the_job_that_settles_seeds_and_syncs(db):
    collections = write_collections(db.engine, {"articles": 3, "pages": 3})
    with dg.instance_for_test() as instance:
        activate_with_job(db, instance)
        # Activation added both partitions; the registry and the partitions then drift apart:
        # one collection lost its partition, and one partition outlived its collection.
        instance.delete_dynamic_partition(PARTITIONS, "articles")
        instance.add_dynamic_partitions(PARTITIONS, ["deleted_long_ago"])
        scheduled = datetime.datetime(2026, 11, 30, 4, 2, tzinfo=datetime.UTC)
        with dg.build_schedule_context(
            instance=instance, scheduled_execution_time=scheduled, resources=resources(db)
        ) as context:
            data = media_usage_maintenance_schedule.evaluate_tick(context)

        [request] = data.run_requests
        dg.validate_run_config(MAINTENANCE_JOB, request.run_config)
        result = execute_request(instance, resources(db), MAINTENANCE_JOB.name, request).result
        assert result.success
        run = instance.get_run_by_id(result.run_id)
        assert run.tags["dagster/schedule_name"] == media_usage_maintenance_schedule.name
        settled = _result_metadata(result, "settle_and_seed_reconciliations")
        synced = _result_metadata(result, "sync_collection_partitions")
        assert sorted(instance.get_dynamic_partitions(PARTITIONS)) == ["articles", "pages"]

    assert (settled["inactive"], settled["seeded"], settled["obsolete_deleted"]) == (False, 2, 0)
    assert (synced["added"], synced["removed"], synced["collections"]) == (
        "articles",
        "deleted_long_ago",
        2,
    )
    for collection in collections.values():
        row = one(db.engine, schema.reconciliations, collection_id=collection.id)
        assert (row["state"], row["phase"], row["target_epoch"]) == ("pending", "scan", None)


def _result_metadata(result: dg.ExecuteInProcessResult, node: str) -> dict:
    [output] = [event for event in result.events_for_node(node) if event.is_successful_output]
    return plain(output.step_output_data.metadata)


# --- the automation switch ------------------------------------------------------------------------

_STATUSES = """
import json
from media_usage_orchestration.definitions import defs
statuses = {sensor.name: sensor.default_status.value for sensor in defs.sensors}
statuses.update({s.name: s.default_status.value for s in defs.schedules})
print(json.dumps(statuses))
"""


@pytest.mark.parametrize(
    ("automation", "expected"),
    [(None, "RUNNING"), ("stopped", "STOPPED"), (" Stopped ", "STOPPED")],
)
def test_sensors_and_the_schedules_run_by_default_and_the_switch_stops_them(automation, expected):
    environment = {
        key: value for key, value in os.environ.items() if key != "MEDIA_USAGE_AUTOMATION"
    }
    if automation is not None:
        environment["MEDIA_USAGE_AUTOMATION"] = automation
    completed = subprocess.run(
        [sys.executable, "-c", _STATUSES],
        env=environment,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    statuses = json.loads(completed.stdout.strip().splitlines()[-1])
    assert statuses == {
        "media_usage_work_sensor": expected,
        "media_usage_reconciliation_sensor": expected,
        "media_usage_collection_deletion_sensor": expected,
        "media_usage_projection_gc_sensor": expected,
        "media_usage_alert_sensor": expected,
        "media_usage_scrubber_sensor": expected,
        "media_usage_queue_sensor": expected,
        "media_usage_run_health_sensor": expected,
        "media_usage_maintenance_schedule": expected,
        "media_usage_instance_pruning_schedule": expected,
    }
