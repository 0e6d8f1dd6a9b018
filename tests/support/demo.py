"""What `make dev` sees of the demo's instance: its own `dagster.yaml` (queued runs, the default
run launcher: a run worker process per run), the workspace.yaml code location, and the UI's
GraphQL queries for partition status and re-execution."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)
from dagster_graphql.client.query import LAUNCH_PIPELINE_REEXECUTION_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql

from media_usage_orchestration.local.daemon_lane import LOCATION_NAME, PROJECT_WORKSPACE
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV

REPOSITORY = "__repository__"
RUN_SECONDS = 180
# The code server stops once its calls and runs have finished, or after 60 s.
CODE_SERVER_EXIT_SECONDS = 90

PARTITION_STATUS_QUERY = """
query ($repositorySelector: RepositorySelector!, $partitionSetName: String!) {
  partitionSetOrError(repositorySelector: $repositorySelector,
                      partitionSetName: $partitionSetName) {
    __typename
    ... on PythonError { message }
    ... on PartitionSet { partitionStatusesOrError { __typename
      ... on PythonError { message }
      ... on PartitionStatuses { results { partitionName runStatus } } } } } }
"""


@contextlib.contextmanager
def dev_context(home: Path, url: str, monkeypatch) -> Iterator[WorkspaceProcessContext]:
    """The instance as `make dev` opens it (no overrides) and the workspace.yaml location, its
    code server reading `url` as the database. On exit it waits until the processes it
    started are gone, as after stopping `make dev`: the code server outlives the context
    until its run processes have exited, and those still write to the instance after their
    runs have finished ("Process for run exited")."""
    monkeypatch.setenv(DATABASE_URL_ENV, url)
    before = _live_descendants(os.getpid())
    with (
        dg.DagsterInstance.from_config(str(home)) as instance,
        WorkspaceProcessContext(
            instance, WorkspaceFileTarget(paths=[str(PROJECT_WORKSPACE)])
        ) as context,
    ):
        started = _live_descendants(os.getpid()) - before
        yield context
    _wait_until_gone(started | (_live_descendants(os.getpid()) - before))


def _live_descendants(pid: int) -> set[int]:
    """The processes below `pid` that have not exited (zombies count as exited)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(stat)
        if fields is not None and fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _wait_until_gone(pids: set[int]) -> None:
    deadline = time.monotonic() + CODE_SERVER_EXIT_SECONDS
    while alive := {pid for pid in pids if _is_running(pid)}:
        if time.monotonic() > deadline:
            raise AssertionError(f"Processes {sorted(alive)} outlived `make dev`'s context")
        time.sleep(0.2)  # other processes finishing


def _is_running(pid: int) -> bool:
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return fields is not None and fields[0] != "Z"


def _stat_fields(stat: Path) -> list[str] | None:
    """A process's `/proc/<pid>/stat` fields after its command name (state first, then the
    parent's pid); None once the process is gone."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def graphql(context: WorkspaceProcessContext, query: str, **variables: Any) -> dict[str, Any]:
    result = execute_dagster_graphql(context.create_request_context(), query, variables=variables)
    assert result.errors is None, result.errors
    return result.data


def partition_statuses(context: WorkspaceProcessContext, job_name: str) -> dict[str, str]:
    """The job's Partitions tab: partition name -> run status."""
    data = graphql(
        context,
        PARTITION_STATUS_QUERY,
        repositorySelector={"repositoryLocationName": LOCATION_NAME, "repositoryName": REPOSITORY},
        partitionSetName=f"{job_name}_partition_set",
    )
    statuses = data["partitionSetOrError"]["partitionStatusesOrError"]
    assert statuses["__typename"] == "PartitionStatuses", statuses
    return {row["partitionName"]: row["runStatus"] for row in statuses["results"]}


def reexecute_all_steps(context: WorkspaceProcessContext, run_id: str) -> str:
    """The UI's "Re-execute all"; returns the new run's id."""
    data = graphql(
        context,
        LAUNCH_PIPELINE_REEXECUTION_MUTATION,
        reexecutionParams={"parentRunId": run_id, "strategy": "ALL_STEPS"},
    )
    launched = data["launchPipelineReexecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def dequeue_and_wait(context: WorkspaceProcessContext, run_ids: list[str]) -> list[dg.DagsterRun]:
    """One pass of the run queue daemon (the default launcher starts a run worker process per
    run), then the runs once they have finished."""
    with QueuedRunCoordinatorDaemon(interval_seconds=1) as daemon:
        list(daemon.run_iteration(context))
    instance = context.instance
    deadline = time.monotonic() + RUN_SECONDS
    while True:
        runs = [instance.get_run_by_id(run_id) for run_id in run_ids]
        if all(run.is_finished for run in runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.5)  # the run workers are other processes


def step_failures(instance: dg.DagsterInstance, run_id: str) -> str:
    """The error messages of the run's failed steps."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    return "\n".join(
        record.event_log_entry.dagster_event.event_specific_data.error.message
        for record in records.records
    )


def directory_snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` with a digest of its content."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


@contextlib.contextmanager
def process_named_dev() -> Iterator[int]:
    """A live process whose command line carries `dev`, as `make dev`'s `dg dev` does."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; print(flush=True); sys.stdin.read()", "dev"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        # Until the child has exec'd, its command line is still its parent's: wait for it.
        process.stdout.readline()
        yield process.pid
    finally:
        process.stdin.close()
        process.wait(timeout=30)
        process.stdout.close()


def exited_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(timeout=30)
    return process.pid
