"""The UI smoke test: the real webserver loads the code location and launches a run.

`dagster-webserver` starts on a free loopback port against the repository's workspace.yaml,
with a throwaway instance (SQLite run storage, runs launched at once into a subprocess run
worker) and MEDIA_USAGE_DATABASE_URL pointing at the test database. Through GraphQL the location
must be LOADED with every job, sensor and schedule; `media_usage_maintenance`, launched with
DagsterGraphQLClient, must reach SUCCESS, carry its workflow tag, and leave its effect in the
database (reconciliations seeded) and in the instance (collection partitions synced); then
`media_usage_instance_pruning` succeeds and leaves that young run alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV
from tests.dagster.test_definitions_contract import JOBS, LOCATION, SCHEDULES, SENSORS
from tests.support.reconciliation_runs import PROJECT_ROOT, write_collections
from tests.support.states import all_rows

pytestmark = [
    pytest.mark.slow,
    # DagsterGraphQLClient still calls gql's deprecated `execute(variable_values=...)`.
    pytest.mark.filterwarnings(
        "ignore:Using variable_values and operation_name:DeprecationWarning"
    ),
]

REPOSITORY = "__repository__"
MAINTENANCE_JOB = "media_usage_maintenance"
PRUNING_JOB = "media_usage_instance_pruning"
RECONCILIATION_JOB = "media_usage_reconciliation"
WORKFLOW_TAG = "media_usage/workflow"

STARTUP_SECONDS = 120
RUN_SECONDS = 120
STOP_SECONDS = 30

INSTANCE_YAML = """\
run_coordinator:
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
run_launcher:
  module: dagster._core.launcher
  class: DefaultRunLauncher
telemetry:
  enabled: false
"""

WORKSPACE_QUERY = """
{ workspaceOrError { __typename ... on PythonError { message }
  ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message }
    ... on RepositoryLocation { repositories { name
      jobs { name } sensors { name } schedules { name cronSchedule } } } } } } } }
"""

PARTITION_KEYS_QUERY = """
query ($selector: PipelineSelector!) { pipelineOrError(params: $selector) { __typename
  ... on PythonError { message }
  ... on Pipeline { partitionKeysOrError { partitionKeys } } } }
"""

RUN_QUERY = """
query ($runId: ID!) { runOrError(runId: $runId) { __typename
  ... on PythonError { message }
  ... on Run { jobName status tags { key value } } } }
"""

TERMINAL_STATUSES = {
    dg.DagsterRunStatus.SUCCESS,
    dg.DagsterRunStatus.FAILURE,
    dg.DagsterRunStatus.CANCELED,
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


@dataclass
class Webserver:
    process: subprocess.Popen
    port: int
    stderr_path: Path

    def stderr_tail(self, characters: int = 4000) -> str:
        text = self.stderr_path.read_text(errors="replace")
        return f"\n--- webserver stderr (tail) ---\n{text[-characters:]}"

    @contextlib.contextmanager
    def answering(self, what: str) -> Iterator[None]:
        """Turn a failed request into a test failure that shows the webserver's stderr."""
        try:
            yield
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            pytest.fail(f"{what}: {error!r}{self.stderr_tail()}")
        except DagsterGraphQLClientError as error:
            pytest.fail(f"{what}: {error!r} {error.body!r}{self.stderr_tail()}")

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with self.answering("GraphQL query"), urllib.request.urlopen(request, timeout=60) as got:
            body = json.loads(got.read())
        assert not body.get("errors"), f"{body['errors']}{self.stderr_tail()}"
        return body["data"]

    def submit_job_execution(self, job_name: str) -> str:
        client = DagsterGraphQLClient("127.0.0.1", port_number=self.port, timeout=60)
        with self.answering(f"launching {job_name}"):
            return client.submit_job_execution(job_name)

    def get_run_status(self, run_id: str) -> dg.DagsterRunStatus:
        client = DagsterGraphQLClient("127.0.0.1", port_number=self.port, timeout=60)
        with self.answering(f"the status of run {run_id}"):
            return client.get_run_status(run_id)


def _stop(process: subprocess.Popen) -> None:
    """Stop the webserver with its whole process group (code server and run workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_SECONDS)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=STOP_SECONDS)


def _start(dagster_home: Path, env: dict[str, str], stderr_path: Path) -> Webserver:
    port = _free_port()
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [
                os.path.join(os.path.dirname(sys.executable), "dagster-webserver"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-w",
                str(PROJECT_ROOT / "workspace.yaml"),
            ],
            cwd=PROJECT_ROOT,
            env={**env, "DAGSTER_HOME": str(dagster_home)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,  # a file, never a pipe: run logs could fill a pipe and block
            start_new_session=True,  # its code server and run workers share the group
        )
    return Webserver(process, port, stderr_path)


@contextlib.contextmanager
def running_webserver(
    tmp_path: Path, database_url: str, dagster_home: Path | None = None
) -> Iterator[Webserver]:
    """A webserver that answers /server_info, stopped with its process group on exit; on a
    throwaway instance unless `dagster_home` names one."""
    if dagster_home is None:
        dagster_home = tmp_path / "dagster_home"
        dagster_home.mkdir()
        (dagster_home / "dagster.yaml").write_text(INSTANCE_YAML)
    env = {
        **os.environ,
        DATABASE_URL_ENV: database_url,
        "MEDIA_USAGE_AUTOMATION": "stopped",
        "DAGSTER_DISABLE_TELEMETRY": "1",
    }
    for attempt in range(3):
        webserver = _start(dagster_home, env, tmp_path / f"webserver-{attempt}.stderr")
        try:
            deadline = time.monotonic() + STARTUP_SECONDS
            while (info := _get(f"http://127.0.0.1:{webserver.port}/server_info")) is None:
                if webserver.process.poll() is not None:
                    break
                assert time.monotonic() < deadline, (
                    f"the webserver did not answer in {STARTUP_SECONDS} s{webserver.stderr_tail()}"
                )
                time.sleep(0.5)
            else:
                assert info["dagster_version"] == dg.__version__, info
                yield webserver
                return
            stderr = webserver.stderr_tail()
            # Another process took the free port between the probe and the bind: try another.
            if "address already in use" not in stderr.lower() or attempt == 2:
                pytest.fail(f"the webserver exited with {webserver.process.returncode}{stderr}")
        finally:
            _stop(webserver.process)


def _named_jobs(names: Iterable[str]) -> list[str]:
    """Job names without Dagster's implicit ones (`__ASSET_JOB`), which the UI does not list."""
    return sorted(name for name in names if not name.startswith("__"))


def _location_entries(webserver: Webserver) -> list[dict]:
    """The workspace's location entries, once none of them is still loading."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        data = webserver.graphql(WORKSPACE_QUERY)["workspaceOrError"]
        assert data["__typename"] == "Workspace", f"{data}{webserver.stderr_tail()}"
        entries = data["locationEntries"]
        if entries and all(entry["loadStatus"] != "LOADING" for entry in entries):
            return entries
        assert time.monotonic() < deadline, (
            f"the code location was still loading after {STARTUP_SECONDS} s: {entries}"
            f"{webserver.stderr_tail()}"
        )
        time.sleep(0.5)


def _partition_keys(webserver: Webserver, job_name: str) -> list[str]:
    selector = {
        "repositoryLocationName": LOCATION,
        "repositoryName": REPOSITORY,
        "pipelineName": job_name,
    }
    data = webserver.graphql(PARTITION_KEYS_QUERY, {"selector": selector})["pipelineOrError"]
    assert data["__typename"] == "Pipeline", f"{data}{webserver.stderr_tail()}"
    return sorted(data["partitionKeysOrError"]["partitionKeys"])


def _wait_for_run(webserver: Webserver, run_id: str) -> dg.DagsterRunStatus:
    deadline = time.monotonic() + RUN_SECONDS
    while (status := webserver.get_run_status(run_id)) not in TERMINAL_STATUSES:
        assert webserver.process.poll() is None, (
            f"the webserver exited during run {run_id} ({status}){webserver.stderr_tail()}"
        )
        assert time.monotonic() < deadline, (
            f"run {run_id} was still {status.value} after {RUN_SECONDS} s{webserver.stderr_tail()}"
        )
        time.sleep(0.5)
    return status


def test_the_webserver_loads_the_location_and_runs_the_maintenance_job(db, tmp_path):
    collections = write_collections(db.engine, {"articles": 2, "pages": 2})
    activate(db.engine)
    assert all_rows(db.engine, schema.reconciliations) == []

    with running_webserver(tmp_path, db.url) as webserver:
        [entry] = _location_entries(webserver)
        assert (entry["name"], entry["loadStatus"]) == (LOCATION, "LOADED"), entry
        location = entry["locationOrLoadError"]
        assert location["__typename"] == "RepositoryLocation", location
        [repository] = location["repositories"]
        assert repository["name"] == REPOSITORY
        assert _named_jobs(job["name"] for job in repository["jobs"]) == _named_jobs(JOBS)
        assert sorted(sensor["name"] for sensor in repository["sensors"]) == sorted(SENSORS)
        assert {
            schedule["name"]: schedule["cronSchedule"] for schedule in repository["schedules"]
        } == {name: cron for name, (_job, cron, _zone) in SCHEDULES.items()}
        assert _partition_keys(webserver, RECONCILIATION_JOB) == []

        run_id = webserver.submit_job_execution(MAINTENANCE_JOB)
        status = _wait_for_run(webserver, run_id)
        assert status is dg.DagsterRunStatus.SUCCESS, (
            f"run {run_id} ended {status.value}{webserver.stderr_tail()}"
        )

        run = webserver.graphql(RUN_QUERY, {"runId": run_id})["runOrError"]
        assert run["__typename"] == "Run", run
        assert (run["jobName"], run["status"]) == (MAINTENANCE_JOB, "SUCCESS")
        tags = {tag["key"]: tag["value"] for tag in run["tags"]}
        assert tags.get(WORKFLOW_TAG) == "maintenance", tags
        # The run worker synced the instance's partitions from the test database's registry.
        assert _partition_keys(webserver, RECONCILIATION_JOB) == sorted(collections)

        # The pruning op reads the code location's definitions, which only a launched run has:
        # nothing is old enough yet, and the maintenance run stays.
        pruning = webserver.submit_job_execution(PRUNING_JOB)
        status = _wait_for_run(webserver, pruning)
        assert status is dg.DagsterRunStatus.SUCCESS, (
            f"run {pruning} ended {status.value}{webserver.stderr_tail()}"
        )
        assert webserver.graphql(RUN_QUERY, {"runId": run_id})["runOrError"]["__typename"] == "Run"

    # The run worker wrote to the database MEDIA_USAGE_DATABASE_URL named: one pending
    # reconciliation seeded per untrusted collection.
    seeded = {
        row["collection_id"]: (row["state"], row["phase"])
        for row in all_rows(db.engine, schema.reconciliations)
    }
    assert seeded == {collection.id: ("pending", "scan") for collection in collections.values()}
