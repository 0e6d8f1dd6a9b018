"""A real `dagster-daemon run` for the live bench: the project's workspace.yaml (the daemon
starts its code server from it, and the code server the run workers) on a temporary
DAGSTER_HOME whose dagster.yaml is deploy/dagster.yaml with the bench's storage
(`instance.deployed_settings`), the sensors running as they do by default.

The daemon starts in a process group of its own, which its code server and run workers join;
on the way out (whatever the way) it is asked to stop with an interrupt, as Ctrl-C stops it,
then the whole group is terminated and, if need be, killed, so no process outlives the bench.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import dagster as dg

from media_usage_orchestration.bench.instance import deployed_settings
from media_usage_orchestration.dagster_kit.dagster_internals import (
    InstigatorType,
    instance_from_dir,
)
from media_usage_orchestration.local.daemon_lane import PROJECT_WORKSPACE
from media_usage_orchestration.partitions import media_usage_collections
from media_usage_orchestration.resources.automation import WORK_LINGER_ENV
from media_usage_orchestration.sensors.work import media_usage_work_sensor
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV

# The code server imports the definitions before the first tick: seconds, more on a busy machine.
READY_TIMEOUT_SECONDS = 180.0
STOP_TIMEOUT_SECONDS = 30.0
KILL_TIMEOUT_SECONDS = 10.0
POLL_SECONDS = 0.5
LOG_TAIL_LINES = 30


@dataclass(frozen=True)
class RunningDaemon:
    home: Path
    process: subprocess.Popen
    log: Path
    instance: dg.DagsterInstance

    def sensor_ticks(self, sensor_name: str, after: float, before: float) -> list:
        """The sensor's ticks between two wall-clock times, oldest first."""
        ticks = []
        for state in self.instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
            if state.instigator_name == sensor_name:
                ticks += self.instance.get_ticks(
                    state.instigator_origin_id,
                    state.selector_id,
                    after=float(after),
                    before=float(before),
                )
        return sorted(ticks, key=lambda tick: tick.timestamp)

    def log_tail(self) -> str:
        lines = self.log.read_text("utf-8", errors="replace").splitlines()
        return "\n".join(lines[-LOG_TAIL_LINES:])


@contextlib.contextmanager
def running_daemon(database_url: str, collection_slugs: Sequence[str]) -> Iterator[RunningDaemon]:
    """A daemon on a fresh instance whose collection partitions exist (as the maintenance
    lane keeps them in a deployment), its work sensor ticking; stopped on exit."""
    directory = Path(tempfile.mkdtemp(prefix="media_usage_live_"))
    try:
        with deployed_settings(database_url) as settings:
            home = directory / "dagster_home"
            home.mkdir()
            # JSON is YAML: the settings as Dagster reads them, without a YAML writer.
            (home / "dagster.yaml").write_text(json.dumps(settings, indent=2), "utf-8")
            with instance_from_dir(str(home)) as instance:
                instance.add_dynamic_partitions(media_usage_collections.name, collection_slugs)
                with _daemon_process(home, database_url) as (process, log):
                    daemon = RunningDaemon(home, process, log, instance)
                    _wait_until_ticking(daemon)
                    yield daemon
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def daemon_command() -> list[str]:
    """`dagster-daemon run` of this environment over the project's workspace file."""
    executable = Path(sys.executable).with_name("dagster-daemon")
    found = str(executable) if executable.exists() else shutil.which("dagster-daemon")
    if found is None:
        raise click.ClickException("dagster-daemon is not installed in this environment")
    return [found, "run", "-w", str(PROJECT_WORKSPACE), "--log-level", "info"]


def daemon_environment(home: Path, database_url: str) -> dict[str, str]:
    """What the daemon, its code server and the run workers read: this environment (so the
    work linger set in it applies), the instance directory and the measured database."""
    environment = dict(os.environ)
    environment.update(
        {"DAGSTER_HOME": str(home), DATABASE_URL_ENV: database_url, "PYTHONUNBUFFERED": "1"}
    )
    if WORK_LINGER_ENV in os.environ:
        environment[WORK_LINGER_ENV] = os.environ[WORK_LINGER_ENV]
    return environment


@contextlib.contextmanager
def _daemon_process(home: Path, database_url: str) -> Iterator[tuple[subprocess.Popen, Path]]:
    log = home / "daemon.log"
    previous = signal.getsignal(signal.SIGTERM)
    with open(log, "wb") as output:
        process = subprocess.Popen(
            daemon_command(),
            cwd=PROJECT_WORKSPACE.parent,
            env=daemon_environment(home, database_url),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    # A bench terminated while the daemon runs still stops it (the finally below runs); only
    # the main thread may set a handler.
    handles_terminate = threading.current_thread() is threading.main_thread()
    if handles_terminate:
        signal.signal(signal.SIGTERM, _exit_on_terminate)
    try:
        yield process, log
    finally:
        stop_process_group(process)
        if handles_terminate:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_terminate(_signal: int, _frame) -> None:
    raise SystemExit(128 + signal.SIGTERM)


def stop_process_group(
    process: subprocess.Popen, interrupt_seconds: float = STOP_TIMEOUT_SECONDS
) -> None:
    """Interrupt the daemon (it stops its daemons and its code server), then, after at most
    `interrupt_seconds`, terminate and, failing that, kill whatever is left of its process
    group."""
    group = process.pid  # the leader of its own session and group
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=interrupt_seconds)
    for each in (signal.SIGTERM, signal.SIGKILL):
        if not group_alive(group):
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, each)
        deadline = time.monotonic() + KILL_TIMEOUT_SECONDS
        while group_alive(group) and time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.1)
    process.wait()


def group_alive(group: int) -> bool:
    """Whether any process of the group is still running (zombies awaiting their parent's
    wait do not count: they run nothing)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return any(running_in_group(group))


def running_in_group(group: int) -> Iterator[int]:
    """The pids of the group's processes that are not zombies."""
    yield from group_members(group, zombies=False)


def group_members(group: int, *, zombies: bool = True) -> set[int]:
    """The pids of a process group's processes (its zombies too unless told not to)."""
    members = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the command: state, ppid, pgrp
        if int(fields[2]) == group and (zombies or fields[0] != "Z"):
            members.add(int(entry.name))
    return members


def _wait_until_ticking(daemon: RunningDaemon) -> None:
    """Until the work sensor has ticked once: the code server is up and the sensors run."""
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            raise click.ClickException(
                f"dagster-daemon exited ({daemon.process.returncode}):\n{daemon.log_tail()}"
            )
        if daemon.sensor_ticks(media_usage_work_sensor.name, 0.0, time.time()):
            return
        time.sleep(POLL_SECONDS)
    raise click.ClickException(
        f"the work sensor did not tick within {READY_TIMEOUT_SECONDS:.0f} s:\n{daemon.log_tail()}"
    )


__all__ = [
    "RunningDaemon",
    "daemon_command",
    "group_members",
    "running_daemon",
    "running_in_group",
    "stop_process_group",
]
