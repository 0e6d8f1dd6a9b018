"""Pruning the Dagster instance (`ops/instance_pruning.py`) on a real instance: the project's
finished runs past their age go with their events; a run in flight, another project's run, a
run holding an asset's or check's latest event, and a run of a backfill in progress stay; the
hourly schedule launches nothing while nothing is past its age. Ages are judged against a `now`
moved forward instead of backdated runs."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

from media_usage_orchestration.dagster_kit.run_tags import WORKFLOW_TAG
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.jobs import media_usage_instance_pruning
from media_usage_orchestration.ops.instance_pruning import (
    BACKFILL_TAG,
    ProjectGraph,
    PruningPolicy,
    delete_runs,
    prunable_runs,
    prune,
)
from media_usage_orchestration.schedules import media_usage_instance_pruning_schedule

DAY = 86_400
WORK = {WORKFLOW_TAG: "work"}
PARTS = dg.StaticPartitionsDefinition(["a", "b"])


@dg.asset(partitions_def=PARTS)
def index() -> None:
    return None


@dg.asset
def library() -> None:
    return None


@dg.asset_check(asset=library)
def library_ok() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=True)


PROJECT = ProjectGraph(
    workflows=("work", "check"),
    asset_keys=(index.key, library.key),
    check_keys=(library_ok.check_key,),
)


def _run(instance: dg.DagsterInstance, status: dg.DagsterRunStatus, **tags: str) -> str:
    run = dg.DagsterRun(job_name="media_usage_work", status=status, tags={**WORK, **tags})
    instance.add_run(run)
    instance.report_engine_event("a step happened", run)
    return run.run_id


DEFAULT_POLICY = PruningPolicy()


def _pruned(instance, policy=DEFAULT_POLICY, days_later: float = 20) -> set[str]:
    now = time.time() + days_later * DAY
    return {run.run_id for run in prunable_runs(instance, PROJECT, policy, now)}


def test_old_finished_runs_go_with_their_events_and_the_rest_stays(instance):
    done = _run(instance, dg.DagsterRunStatus.SUCCESS)
    canceled = _run(instance, dg.DagsterRunStatus.CANCELED)
    failed = _run(instance, dg.DagsterRunStatus.FAILURE)
    running = _run(instance, dg.DagsterRunStatus.STARTED)
    starting = _run(instance, dg.DagsterRunStatus.STARTING)
    foreign = dg.DagsterRun(job_name="someone_elses_job", status=dg.DagsterRunStatus.SUCCESS)
    instance.add_run(foreign)

    assert _pruned(instance, days_later=1) == set()
    assert _pruned(instance, days_later=20) == {done, canceled}  # failures kept 60 days
    doomed = prunable_runs(instance, PROJECT, PruningPolicy(), time.time() + 61 * DAY)
    assert {run.run_id for run in doomed} == {done, canceled, failed}

    assert delete_runs(instance, doomed) == 3
    for run_id in (done, canceled, failed):
        assert instance.get_run_by_id(run_id) is None
        assert instance.all_logs(run_id) == []
    for run_id in (running, starting, foreign.run_id):
        assert instance.get_run_by_id(run_id) is not None
    assert instance.all_logs(running)
    assert delete_runs(instance, doomed) == 0  # gone meanwhile: not counted twice


def test_a_pruned_runs_captured_logs_go_with_it(tmp_path):
    """The compute log manager's files (stdout and stderr captured per step, under
    $DAGSTER_HOME/storage as a deployment keeps them) are deleted with the run; another run's
    stay."""
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        _prune_with_captured_logs(instance)


def _prune_with_captured_logs(instance: dg.DagsterInstance) -> None:
    manager = instance.compute_log_manager
    assert type(manager).__name__ == "LocalComputeLogManager"
    done = _run(instance, dg.DagsterRunStatus.SUCCESS)
    running = _run(instance, dg.DagsterRunStatus.STARTED)
    paths = {}
    for run_id in (done, running):
        path = Path(manager.get_captured_local_path([run_id, "compute_logs", "step"], "out"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("captured", "utf-8")
        paths[run_id] = path

    doomed = prunable_runs(instance, PROJECT, PruningPolicy(), time.time() + 20 * DAY)
    assert delete_runs(instance, doomed) == 1

    assert not paths[done].exists()
    assert paths[running].read_text("utf-8") == "captured"


def test_at_most_the_policys_limit_is_pruned_per_run_oldest_first(instance):
    failed = _run(instance, dg.DagsterRunStatus.FAILURE)
    done = [_run(instance, dg.DagsterRunStatus.SUCCESS) for _ in range(5)]
    assert _pruned(instance, PruningPolicy(limit=2)) == set(done[:2])
    assert _pruned(instance, PruningPolicy(limit=2), days_later=61) == {failed, done[0]}


def test_a_run_holding_a_latest_materialization_or_evaluation_stays(instance):
    def materialize(assets, partition=None, checks=()):
        result = dg.materialize(
            [*assets, *checks], instance=instance, partition_key=partition, tags=WORK
        )
        assert result.success
        return result.run_id

    superseded_a = materialize([index], "a")
    latest_a = materialize([index], "a")
    latest_b = materialize([index], "b")
    superseded_library = materialize([library], checks=[library_ok])
    latest_library = materialize([library], checks=[library_ok])

    assert _pruned(instance) == {superseded_a, superseded_library}
    assert {latest_a, latest_b, latest_library}.isdisjoint(_pruned(instance))


@pytest.mark.parametrize(
    ("status", "kept"),
    [(BulkActionStatus.REQUESTED, True), (BulkActionStatus.COMPLETED_SUCCESS, False)],
)
def test_a_run_of_a_backfill_in_progress_stays(instance, status, kept):
    instance.add_backfill(
        PartitionBackfill(
            backfill_id="backfill1",
            status=status,
            from_failure=False,
            tags={},
            backfill_timestamp=time.time(),
            partition_names=["a"],
        )
    )
    run_id = _run(instance, dg.DagsterRunStatus.SUCCESS, **{BACKFILL_TAG: "backfill1"})
    assert (run_id not in _pruned(instance)) is kept


def test_the_schedule_skips_until_a_run_is_past_its_age():
    repository = defs.get_repository_def()
    with dg.instance_for_test() as instance:  # a schedule's context needs a persistent one
        _run(instance, dg.DagsterRunStatus.SUCCESS)

        def tick(days_later: float):
            with dg.build_schedule_context(
                instance=instance,
                repository_def=repository,
                scheduled_execution_time=_datetime(time.time() + days_later * DAY),
            ) as moment:
                return media_usage_instance_pruning_schedule.evaluate_tick(moment)

        assert "past its age" in tick(0).skip_message
        [request] = tick(20).run_requests
    assert request.job_name in (None, media_usage_instance_pruning.name)


def test_pruning_with_the_projects_definitions_deletes_only_what_is_old(instance):
    done = _run(instance, dg.DagsterRunStatus.SUCCESS)
    running = _run(instance, dg.DagsterRunStatus.STARTED)
    repository = defs.get_repository_def()

    assert prune(instance, repository, DEFAULT_POLICY) == 0  # young
    assert prune(instance, repository, DEFAULT_POLICY, now=time.time() + 20 * DAY) == 1
    assert instance.get_run_by_id(done) is None
    assert instance.get_run_by_id(running) is not None


def _datetime(timestamp: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC)
