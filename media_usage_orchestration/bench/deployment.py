"""The production setup of deploy/README.md on this machine, for the deployment tests and the
benchmarks that need it: deploy/dagster.yaml unmodified as `$DAGSTER_HOME/dagster.yaml` on a
scratch PostgreSQL database (the five `DAGSTER_PG_*` variables point at it), a gRPC code server
(`dagster api grpc`), one `dagster-daemon run` over a workspace that names the server, and the
webserver (the UI's GraphQL: Terminate, re-execution, launches go through it as an operator's
clicks do).

Each process leads a process group of its own; the run workers the code server starts join its
group, as they share its container in a deployment, so `kill_code_server` kills them with it.
Everything is stopped by pid on the way out, whatever the way.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
import dagster as dg
import yaml

from media_usage_orchestration.bench.daemon import group_members, stop_process_group
from media_usage_orchestration.bench.instance import DEPLOY_INSTANCE_YAML
from media_usage_orchestration.emdash_double.scratch import scratch_database
from media_usage_orchestration.local.daemon_lane import LOCATION_NAME, PROJECT_WORKSPACE
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV, URL

READY_TIMEOUT_SECONDS = 180.0
STOP_INTERRUPT_SECONDS = 3.0
POLL_SECONDS = 0.25
LOG_TAIL_LINES = 40
REPOSITORY_NAME = "__repository__"
T = TypeVar("T")


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _executable(name: str) -> str:
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise click.ClickException(f"{name} is not installed in this environment")
    return found


def instance_environment(storage: URL) -> dict[str, str]:
    """The five variables deploy/dagster.yaml reads, naming the instance database."""
    return {
        "DAGSTER_PG_HOST": storage.host or "127.0.0.1",
        "DAGSTER_PG_PORT": str(storage.port or 5432),
        "DAGSTER_PG_USER": storage.username or "postgres",
        "DAGSTER_PG_PASSWORD": storage.password or "",
        "DAGSTER_PG_DB": storage.database or "",
    }


@dataclass
class ProductionSetup:
    directory: Path
    environment: dict[str, str]
    code_port: int
    web_port: int
    instance: dg.DagsterInstance
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.directory / "dagster_home"

    @property
    def workspace(self) -> Path:
        return self.directory / "workspace.yaml"

    # --- processes ---------------------------------------------------------------------------

    def _start(self, name: str, command: list[str]) -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "ab")  # noqa: SIM115 (the process owns it)
        try:
            process = subprocess.Popen(
                command,
                cwd=PROJECT_WORKSPACE.parent,
                env=self.environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        self.processes[name] = process
        return process

    def start_code_server(self) -> subprocess.Popen:
        """The code location served over gRPC (as deploy/README.md starts it), ready."""
        process = self._start(
            "code_server",
            [
                _executable("dagster"),
                "api",
                "grpc",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.code_port),
                "-m",
                "media_usage_orchestration.definitions",
                "--location-name",
                LOCATION_NAME,
            ],
        )
        self.wait_for(lambda: self._serving(process), "the code server to serve")
        return process

    def _serving(self, process: subprocess.Popen) -> bool:
        if process.poll() is not None:
            raise click.ClickException(f"the code server exited:\n{self.log_tail('code_server')}")
        return _grpc_serving(self.code_port)

    def kill_code_server(self) -> list[int]:
        """SIGKILL the code server and every run worker it started (its process group), as
        when its container dies; the pids killed."""
        process = self.processes["code_server"]
        pids = sorted(group_members(process.pid))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        return pids

    def start_daemon(self) -> subprocess.Popen:
        return self._start(
            "daemon",
            [
                _executable("dagster-daemon"),
                "run",
                "-w",
                str(self.workspace),
                "--log-level",
                "info",
            ],
        )

    def start_webserver(self) -> subprocess.Popen:
        process = self._start(
            "webserver",
            [
                _executable("dagster-webserver"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.web_port),
                "-w",
                str(self.workspace),
            ],
        )
        self.wait_for(lambda: self._web_ready(process), "the webserver to answer")
        return process

    def _web_ready(self, process: subprocess.Popen) -> bool:
        if process.poll() is not None:
            raise click.ClickException(f"the webserver exited:\n{self.log_tail('webserver')}")
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.web_port}/server_info", timeout=2
            ) as answer:
                return answer.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """Stop every process by its group: an interrupt first, then SIGTERM and SIGKILL. The
        daemon finishes its loops' iterations on an interrupt, which can take half a minute:
        nothing here needs them finished, so it gets a few seconds. The code server is not
        interrupted: with run workers in its group it never exits on an interrupt alone, and
        SIGTERM ends each worker's run as a termination would."""
        for name in ("webserver", "daemon", "code_server"):
            process = self.processes.pop(name, None)
            if process is not None:
                interrupt = 0.0 if name == "code_server" else STOP_INTERRUPT_SECONDS
                stop_process_group(process, interrupt_seconds=interrupt)

    def log_tail(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        if not path.exists():
            return ""
        lines = path.read_text("utf-8", errors="replace").splitlines()
        return "\n".join(lines[-LOG_TAIL_LINES:])

    # --- waiting -----------------------------------------------------------------------------

    def wait_for(
        self, found: Callable[[], T], what: str, timeout: float = READY_TIMEOUT_SECONDS
    ) -> T:
        """Poll `found()` until it returns something truthy; fail with the logs after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = found()
            if value:
                return value
            if time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {name}\n{self.log_tail(name)}" for name in sorted(self.processes)
                )
                raise TimeoutError(f"waited {timeout:.0f} s for {what}\n{logs}")
            time.sleep(POLL_SECONDS)

    # --- the UI's GraphQL ----------------------------------------------------------------------

    def graphql(self, query: str, variables: Mapping[str, Any] | None = None) -> dict:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.web_port}/graphql",
            data=json.dumps({"query": query, "variables": dict(variables or {})}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as error:
            # A mutation whose resolver failed answers 500 with its error as data (a
            # PythonError), as the UI shows it.
            text = error.read()
            try:
                body = json.loads(text)
            except ValueError:
                body = {}
            if "data" not in body:
                raise RuntimeError(f"GraphQL refused ({error.code}): {text[:2000]!r}") from None
        if body.get("errors"):
            raise RuntimeError(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def launch(
        self,
        job_name: str,
        run_config: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """Launch a run as the Launchpad does (it goes through the queue); its run id."""
        data = self.graphql(
            LAUNCH_RUN,
            {
                "params": {
                    "selector": {
                        "repositoryLocationName": LOCATION_NAME,
                        "repositoryName": REPOSITORY_NAME,
                        "jobName": job_name,
                    },
                    "runConfigData": dict(run_config or {}),
                    "executionMetadata": {
                        "tags": [
                            {"key": key, "value": value} for key, value in (tags or {}).items()
                        ]
                    },
                }
            },
        )
        return _launched_run_id(data["launchRun"])

    def backfill(
        self, job_name: str, partitions: list[str], tags: Mapping[str, str] | None = None
    ) -> str:
        """A backfill of the job's partitions, as the UI launches one; its id."""
        data = self.graphql(
            LAUNCH_BACKFILL,
            {
                "params": {
                    "selector": {
                        "partitionSetName": f"{job_name}_partition_set",
                        "repositorySelector": {
                            "repositoryLocationName": LOCATION_NAME,
                            "repositoryName": REPOSITORY_NAME,
                        },
                    },
                    "partitionNames": partitions,
                    "tags": [{"key": key, "value": value} for key, value in (tags or {}).items()],
                }
            },
        )
        result = data["launchPartitionBackfill"]
        if result.get("__typename") != "LaunchBackfillSuccess":
            raise RuntimeError(f"backfill refused: {result}")
        return result["backfillId"]

    def terminate(self, run_id: str, *, force: bool = False) -> dict:
        """The Runs page's Terminate (SAFE_TERMINATE), or its force termination."""
        policy = "MARK_AS_CANCELED_IMMEDIATELY" if force else "SAFE_TERMINATE"
        data = self.graphql(TERMINATE_RUN, {"runId": run_id, "policy": policy})
        return data["terminateRun"]

    def reexecute_from_failure(self, run_id: str) -> str:
        """The run page's "Re-execute from failure"; the new run's id."""
        data = self.graphql(
            REEXECUTE_RUN, {"params": {"parentRunId": run_id, "strategy": "FROM_FAILURE"}}
        )
        return _launched_run_id(data["launchPipelineReexecution"])


# --- when a run moved --------------------------------------------------------------------------

MOMENT_EVENTS = {
    dg.DagsterEventType.RUN_ENQUEUED,
    dg.DagsterEventType.RUN_STARTING,
    dg.DagsterEventType.RUN_START,
}


@dataclass(frozen=True)
class RunMoments:
    """When a run was queued, dequeued (handed to the launcher), and its worker started."""

    run_id: str
    job_name: str
    queued: float | None
    launched: float | None
    started: float | None

    @property
    def queue_wait(self) -> float | None:
        if self.queued is None or self.launched is None:
            return None
        return self.launched - self.queued

    @property
    def process_start(self) -> float | None:
        if self.launched is None or self.started is None:
            return None
        return self.started - self.launched


def run_moments(instance: dg.DagsterInstance, run_id: str) -> RunMoments:
    """The first event of each moment in the run's event log (only those events are read)."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        raise ValueError(f"no run {run_id} in the instance")
    first: dict[dg.DagsterEventType, float] = {}
    for record in instance.get_records_for_run(run_id, of_type=MOMENT_EVENTS).records:
        kind = record.event_log_entry.dagster_event_type
        if kind is not None:
            first.setdefault(kind, record.timestamp)
    return RunMoments(
        run_id,
        run.job_name,
        first.get(dg.DagsterEventType.RUN_ENQUEUED),
        first.get(dg.DagsterEventType.RUN_STARTING),
        first.get(dg.DagsterEventType.RUN_START),
    )


def _launched_run_id(result: dict) -> str:
    if result.get("__typename") != "LaunchRunSuccess":
        raise RuntimeError(f"launch refused: {result}")
    return result["run"]["runId"]


LAUNCH_RUN = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on InvalidStepError { invalidStepKey }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
LAUNCH_BACKFILL = """
mutation Backfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""
TERMINATE_RUN = """
mutation Terminate($runId: String!, $policy: TerminateRunPolicy) {
  terminateRun(runId: $runId, terminatePolicy: $policy) {
    __typename
    ... on TerminateRunSuccess { run { runId status } }
    ... on TerminateRunFailure { message }
    ... on PythonError { message }
  }
}
"""
REEXECUTE_RUN = """
mutation Reexecute($params: ReexecutionParams) {
  launchPipelineReexecution(reexecutionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
  }
}
"""


def _grpc_serving(port: int) -> bool:
    """Whether the code server answers the standard gRPC health check with SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        return answer.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False
    finally:
        channel.close()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _write_workspace(path: Path, port: int) -> None:
    workspace = {
        "load_from": [
            {
                "grpc_server": {
                    "host": "127.0.0.1",
                    "port": port,
                    "location_name": LOCATION_NAME,
                }
            }
        ]
    }
    path.write_text(yaml.safe_dump(workspace), "utf-8")


@contextlib.contextmanager
def production_setup(
    cms_url: str,
    *,
    instance_server: str,
    environment: Mapping[str, str] | None = None,
    webserver: bool = True,
) -> Iterator[ProductionSetup]:
    """The production setup on a new instance database on `instance_server` (dropped
    afterwards) for the CMS database at `cms_url`: code server, daemon and (unless told not
    to) webserver, all started and ready; stopped on exit."""
    directory = Path(tempfile.mkdtemp(prefix="media_usage_deployment_"))
    setup: ProductionSetup | None = None
    try:
        with scratch_database(instance_server, "media_usage_dagster") as storage:
            home = directory / "dagster_home"
            home.mkdir()
            shutil.copyfile(DEPLOY_INSTANCE_YAML, home / "dagster.yaml")
            code_port = free_port()
            _write_workspace(directory / "workspace.yaml", code_port)
            variables = {
                **os.environ,
                **instance_environment(storage),
                "DAGSTER_HOME": str(home),
                DATABASE_URL_ENV: cms_url,
                "PYTHONUNBUFFERED": "1",
                **(environment or {}),
            }
            with _environment(variables):
                instance = dg.DagsterInstance.get()
            setup = ProductionSetup(directory, variables, code_port, free_port(), instance)
            try:
                setup.start_code_server()
                setup.start_daemon()
                if webserver:
                    setup.start_webserver()
                yield setup
            finally:
                setup.stop()
                instance.dispose()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _environment(variables: Mapping[str, str]) -> Iterator[None]:
    """This process's environment as `variables` for the block (the instance reads its
    `{env: ...}` settings when it is built)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


__all__ = [
    "ProductionSetup",
    "RunMoments",
    "free_port",
    "instance_environment",
    "production_setup",
    "run_moments",
]
