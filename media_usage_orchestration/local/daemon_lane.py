"""Launch runs through a persistent Dagster instance the way the daemon and the Launchpad do.

The code location comes from the project's `workspace.yaml` (the one `make dev` loads, served
by a gRPC code server), so every run carries that location's origin: the UI lists it on its
job's Runs tab, counts it in the job's partition status and re-executes it. Sensor ticks go
through the sensor daemon's own `execute_sensor_iteration` (run keys, dynamic partitions, tick
history); other runs are created from the remote job and submitted, as the Launchpad does.

Runs are executed synchronously in this process (`SyncInMemoryRunLauncher` and the immediate
run coordinator, as instance overrides: `dagster.yaml` itself is left as it is). Dagster's
clock runs behind the wall clock and is moved forward past every sensor's minimum interval
between rounds, so no one waits for it and it never gets ahead of the wall clock.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, redirect_stderr
from pathlib import Path
from typing import Any

import dagster as dg

from media_usage_orchestration.dagster_kit.dagster_internals import (
    SINGLETON_REPOSITORY_NAME,
    SYNCHRONOUS_EXECUTION,
    WorkspaceFileTarget,
    WorkspaceProcessContext,
    dagster_clock,
    execute_sensor_iteration,
    instance_from_dir,
)
from media_usage_orchestration.dagster_kit.run_tags import OUTCOME_TAG
from media_usage_orchestration.partitions import media_usage_collections
from media_usage_orchestration.resources.automation import WORK_LINGER_ENV
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV

PROJECT_WORKSPACE = Path(__file__).resolve().parents[2] / "workspace.yaml"
LOCATION_NAME = "media_usage_orchestration"
# One step past the longest minimum interval of the project's sensors (60 s).
SENSOR_ROUND_SECONDS = 61
MAX_SENSOR_ROUNDS = 60
DAEMON_LOGGER = "media_usage.sensor_daemon"
FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE)


def synchronous_instance(dagster_home: Path) -> dg.DagsterInstance:
    """The instance in `dagster_home`, executing every launched run before `launch` returns."""
    return instance_from_dir(str(dagster_home), overrides=dict(SYNCHRONOUS_EXECUTION))


class DagsterClock:
    """Dagster's clock, `behind` seconds behind the wall clock and running at its speed;
    `advance` moves it forward (never past the wall clock)."""

    def __init__(self, behind: float) -> None:
        self._offset = -behind

    def now(self) -> float:
        return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        if self._offset + seconds > 0:
            raise RuntimeError("Dagster's clock would get ahead of the wall clock")
        self._offset += seconds

    @contextmanager
    def applied(self) -> Iterator[None]:
        with dagster_clock(self.now):
            yield


class DaemonLane:
    """Runs of the workspace's code location, launched through `instance`."""

    def __init__(self, instance: dg.DagsterInstance, workspace: WorkspaceProcessContext) -> None:
        self.instance = instance
        self.workspace = workspace
        self.clock = DagsterClock(behind=SENSOR_ROUND_SECONDS * (MAX_SENSOR_ROUNDS + 1))
        self._seen: set[str] = set()
        self._logger = logging.getLogger(DAEMON_LOGGER)

    def code_location(self):
        return self.workspace.create_request_context().get_code_location(LOCATION_NAME)

    def repository(self):
        return self.code_location().get_repository(SINGLETON_REPOSITORY_NAME)

    def launch(self, job_name: str, run_config: Mapping[str, Any] | None = None) -> dg.DagsterRun:
        """A run created from the remote job and submitted, as the Launchpad does; returns it
        finished."""
        location = self.code_location()
        remote_job = self.repository().get_full_job(job_name)
        config = dict(run_config or {})
        with self.clock.applied():
            plan = location.get_execution_plan(
                remote_job, config, step_keys_to_execute=None, known_state=None
            )
            run = self.instance.create_run(
                job_name=job_name,
                run_id=None,
                run_config=config,
                resolved_op_selection=None,
                step_keys_to_execute=None,
                status=dg.DagsterRunStatus.NOT_STARTED,
                op_selection=None,
                root_run_id=None,
                parent_run_id=None,
                tags=dict(remote_job.run_tags or {}),
                job_snapshot=remote_job.job_snapshot,
                execution_plan_snapshot=plan.execution_plan_snapshot,
                parent_job_snapshot=remote_job.parent_job_snapshot,
                remote_job_origin=remote_job.get_remote_origin(),
                job_code_origin=remote_job.get_python_origin(),
                asset_selection=None,
                asset_check_selection=None,
                asset_graph=self.repository().asset_graph,
            )
            self.instance.submit_run(run.run_id, self.workspace.create_request_context())
        self._seen.add(run.run_id)
        return self._finished(run.run_id)

    def run_lane(self, on_run: Callable[[dg.DagsterRun], None] | None = None) -> int:
        """Rounds of sensor-daemon iterations, each past every sensor's minimum interval, until
        a round launches no run and adds no partition; returns the rounds."""
        for rounds in range(1, MAX_SENSOR_ROUNDS + 1):
            partitions = self._partition_count()
            self.clock.advance(SENSOR_ROUND_SECONDS)
            with self.clock.applied():
                list(
                    execute_sensor_iteration(
                        self.workspace,
                        self._logger,
                        threadpool_executor=None,
                        submit_threadpool_executor=None,
                    )
                )
            launched = self._new_runs()
            for run in launched:
                if on_run is not None:
                    on_run(run)
            if not launched and self._partition_count() == partitions:
                return rounds
        raise RuntimeError(f"The sensors still asked for runs after {MAX_SENSOR_ROUNDS} rounds")

    def sensor_ticks(self, sensor_name: str, limit: int | None = None) -> list[Any]:
        sensor = self.repository().get_sensor(sensor_name)
        return list(
            self.instance.get_ticks(sensor.get_remote_origin_id(), sensor.selector_id, limit=limit)
        )

    def _new_runs(self) -> list[dg.DagsterRun]:
        runs = [run for run in self.instance.get_runs() if run.run_id not in self._seen]
        self._seen.update(run.run_id for run in runs)
        return [self._finished(run.run_id) for run in reversed(runs)]

    def _finished(self, run_id: str) -> dg.DagsterRun:
        run = self.instance.get_run_by_id(run_id)
        if run is None or run.status not in FINISHED:
            raise RuntimeError(f"Run {run_id} did not finish in this process")
        return run

    def _partition_count(self) -> int:
        return len(self.instance.get_dynamic_partitions(media_usage_collections.name))


def run_outcome(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str | None:
    """The run's `media_usage/outcome` tag, else the outcome metadata of the last op that
    reported one."""
    if OUTCOME_TAG in run.tags:
        return run.tags[OUTCOME_TAG]
    outcome = None
    for record in instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.STEP_OUTPUT
    ).records:
        metadata = record.event_log_entry.dagster_event.event_specific_data.metadata
        if "outcome" in metadata:
            outcome = metadata["outcome"].value
    return outcome


@contextmanager
def quiet_run_logs() -> Iterator[None]:
    """The runs' console logs (all in the instance's event log) kept off the terminal; the
    sensor daemon's warnings and errors still reach it."""
    terminal = sys.stderr
    handler = logging.StreamHandler(terminal)
    handler.setLevel(logging.WARNING)
    daemon_logger = logging.getLogger(DAEMON_LOGGER)
    daemon_logger.addHandler(handler)
    try:
        with open(os.devnull, "w") as sink, redirect_stderr(sink):
            yield
    finally:
        daemon_logger.removeHandler(handler)


@contextmanager
def lane_environment(url: str) -> Iterator[None]:
    """What the code server and the runs read, restored afterwards: `MEDIA_USAGE_DATABASE_URL`
    set to `url`, and work runs that end once drained (here runs execute one at a time, in
    this process: a run waiting for more work would hold the whole lane)."""
    settings = {DATABASE_URL_ENV: url, WORK_LINGER_ENV: "0"}
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def open_daemon_lane(
    instance: dg.DagsterInstance, database_url: str, workspace_file: Path = PROJECT_WORKSPACE
) -> Iterator[DaemonLane]:
    """A runner over the workspace file's code location, its code server started with
    `database_url` as the database."""
    if not workspace_file.is_file():
        raise FileNotFoundError(f"No workspace file at {workspace_file}")
    with (
        lane_environment(database_url),
        WorkspaceProcessContext(
            instance,
            WorkspaceFileTarget(paths=[str(workspace_file)]),
            code_server_log_level="WARNING",
        ) as ws,
    ):
        entry = ws.create_request_context().get_code_location_entries().get(LOCATION_NAME)
        if entry is None or entry.code_location is None:
            error = entry.load_error if entry is not None else None
            raise RuntimeError(f"The code location {LOCATION_NAME} did not load: {error}")
        yield DaemonLane(instance, ws)


@contextmanager
def open_daemon_lane_in_background(
    instance: dg.DagsterInstance, database_url: str, workspace_file: Path = PROJECT_WORKSPACE
) -> Iterator[Callable[[], DaemonLane]]:
    """`open_daemon_lane`, its code server started in a thread while the caller goes on (the
    server takes seconds to import the definitions); the yielded function waits for it. The
    database must exist before the first sensor tick, not before the server starts."""
    with ExitStack() as stack, ThreadPoolExecutor(max_workers=1) as pool:
        started = pool.submit(
            stack.enter_context, open_daemon_lane(instance, database_url, workspace_file)
        )
        try:
            yield started.result
        finally:
            started.exception()  # the stack must hold the runner before it closes
