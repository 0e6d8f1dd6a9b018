"""The project's local Dagster instance directory (`.dagster_home`): which one the demo may
clear, and whether a running `make dev` (UI and daemon) is using it.

"In use" has two signs, either enough:
- the pid file `make dev` writes (its own pid: the recipe `exec`s `dg dev`) names a live
  process whose command line is a `dev` command. A dead pid, or a pid reused by another
  program, is stale and ignored.
- a Dagster daemon heartbeat in the instance younger than `HEARTBEAT_FRESH_SECONDS`: a daemon
  started on this directory some other way (`dagster dev`, `dagster-daemon run`). The daemon
  heartbeats every 30 s, so an older one means no daemon is alive; it is ignored.
The pid file answers at once (before the daemon's first heartbeat, and without opening the
instance); the heartbeat covers what the pid file cannot see.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

LOCAL_INSTANCE_MARKER = ".media_usage_local_instance"
DEV_PID_FILE = "media_usage_dev.pid"
HEARTBEAT_FRESH_SECONDS = 90
KEPT_ON_RESET = ("dagster.yaml", LOCAL_INSTANCE_MARKER)


def instance_in_use(dagster_home: Path) -> str | None:
    """Why the instance in `dagster_home` is in use, or None when nothing uses it."""
    pid = live_dev_pid(dagster_home)
    if pid is not None:
        return f"`make dev` (pid {pid}) is using {dagster_home}"
    age = fresh_heartbeat_age(dagster_home)
    if age is not None:
        return (
            f"a Dagster daemon is using {dagster_home} (heartbeat {age:.0f} s ago; a stopped "
            f"daemon's last heartbeat is ignored after {HEARTBEAT_FRESH_SECONDS} s)"
        )
    return None


def live_dev_pid(dagster_home: Path) -> int | None:
    """The pid in `make dev`'s pid file when that process is alive and still a `dev` command."""
    try:
        pid = int((dagster_home / DEV_PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    if pid <= 0 or not _is_alive(pid):
        return None
    arguments = _command_line(pid)
    if arguments is not None and "dev" not in arguments:
        return None  # the pid now belongs to another program
    return pid


def fresh_heartbeat_age(dagster_home: Path) -> float | None:
    """Seconds since the newest daemon heartbeat, when younger than `HEARTBEAT_FRESH_SECONDS`.
    An instance without history has none (and is not opened, so nothing is created)."""
    if not (dagster_home / "history").is_dir():
        return None
    import dagster as dg

    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        beats = instance.get_daemon_heartbeats().values()
    if not beats:
        return None
    age = time.time() - max(beat.timestamp for beat in beats)
    return age if age < HEARTBEAT_FRESH_SECONDS else None


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    return True


def _command_line(pid: int) -> list[str] | None:
    """The process's arguments (Linux `/proc`), or None where they cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_foreign_instance(dagster_home: Path) -> bool:
    """A directory holding something other than an empty config, without the project's
    marker: an instance this project did not create, which it never clears."""
    if not dagster_home.exists() or (dagster_home / LOCAL_INSTANCE_MARKER).exists():
        return False
    return any(path.name != "dagster.yaml" for path in dagster_home.iterdir())
