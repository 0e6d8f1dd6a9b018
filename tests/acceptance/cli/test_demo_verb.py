"""`media-usage demo` from the command line: what it refuses, before touching anything. The
demo itself runs end to end in tests/test_demo.py (including proceeding past stale signs of
an earlier `make dev`)."""

import os
import re
import time
from pathlib import Path

import dagster as dg
from dagster._daemon.types import DaemonHeartbeat

from media_usage_orchestration.demo import DEMO_DATABASE_MARKER_SUFFIX
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.local.instance_home import (
    DEV_PID_FILE,
    HEARTBEAT_FRESH_SECONDS,
    LOCAL_INSTANCE_MARKER,
    instance_in_use,
    live_dev_pid,
)
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import sqlite_database_file
from media_usage_orchestration.store.core.schema import missing_tables
from tests.support.cli import EXIT_PROBLEM, invoke
from tests.support.demo import directory_snapshot, exited_pid, process_named_dev
from tests.support.reconciliation_runs import PROJECT_ROOT
from tests.support.states import IMAGE_ONLY, snapshot


def test_demo_refuses_a_dagster_home_it_did_not_create(empty_db, tmp_path):
    home = tmp_path / "instance"
    (home / "storage").mkdir(parents=True)

    result = invoke(empty_db, "demo", "--dagster-home", str(home))

    assert result.exit_code == EXIT_PROBLEM, result.output
    assert "did not create" in result.output
    assert (home / "storage").is_dir() and not (home / ".media_usage_local_instance").exists()
    assert missing_tables(empty_db.engine) == [table.name for table in schema.EMDASH_TABLES]


def test_demo_refuses_a_database_that_already_holds_collections(db, tmp_path):
    """On SQLite too: only a file an earlier demo created is ever removed."""
    CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)
    before = snapshot(db.engine)

    result = invoke(db, "demo", "--dagster-home", str(tmp_path / ".dagster_home"))

    assert result.exit_code == EXIT_PROBLEM, result.output
    assert "needs an empty database" in result.output
    assert snapshot(db.engine) == before


def _previous_demo(db, home) -> None:
    """What an earlier `make demo` left: its instance directory (marker, config, history) and,
    on SQLite, the marker that lets a later demo remove the database file."""
    home.mkdir()
    (home / LOCAL_INSTANCE_MARKER).touch()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with dg.DagsterInstance.from_config(str(home)):
        pass  # creates the instance's storage, as the demo's runs do
    CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)
    demo_file = sqlite_database_file(db.url)
    if demo_file is not None:
        Path(f"{demo_file}{DEMO_DATABASE_MARKER_SUFFIX}").touch()


def _assert_refused_in_one_line(db, home, message: str) -> str:
    before = (snapshot(db.engine), directory_snapshot(home))

    result = invoke(db, "demo", "--dagster-home", str(home))

    assert result.exit_code == EXIT_PROBLEM, result.output
    assert result.output.strip().count("\n") == 0, result.output
    assert message in result.output and "nothing was changed" in result.output
    assert "Traceback" not in result.output
    assert (snapshot(db.engine), directory_snapshot(home)) == before
    return result.output


def test_demo_refuses_an_instance_a_running_make_dev_uses(db, tmp_path):
    home = tmp_path / ".dagster_home"
    _previous_demo(db, home)
    with process_named_dev() as pid:
        (home / DEV_PID_FILE).write_text(f"{pid}\n")
        _assert_refused_in_one_line(db, home, f"`make dev` (pid {pid}) is using")


def test_demo_refuses_an_instance_a_live_daemon_heartbeats_into(db, tmp_path):
    """A daemon started some other way leaves no pid file; its heartbeat says it is alive."""
    home = tmp_path / ".dagster_home"
    _previous_demo(db, home)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time() - 5, "SENSOR", "live", None))
    output = _assert_refused_in_one_line(db, home, "a Dagster daemon is using")
    assert re.search(r"\(heartbeat \d+ s ago", output), output


def test_stale_signs_of_make_dev_leave_the_instance_free(tmp_path):
    """A pid file whose process has exited, or whose pid now runs another program, and a
    heartbeat older than the daemon's interval allows: nothing uses the instance."""
    home = tmp_path / ".dagster_home"
    home.mkdir()
    assert instance_in_use(home) is None
    for stale_pid in (exited_pid(), os.getpid(), "not a pid"):
        (home / DEV_PID_FILE).write_text(f"{stale_pid}\n")
        assert live_dev_pid(home) is None
    with dg.DagsterInstance.from_config(str(home)) as instance:
        old = time.time() - HEARTBEAT_FRESH_SECONDS - 1
        instance.add_daemon_heartbeat(DaemonHeartbeat(old, "SENSOR", "gone", None))
    assert instance_in_use(home) is None
    with process_named_dev() as pid:
        (home / DEV_PID_FILE).write_text(f"{pid}\n")
        assert live_dev_pid(home) == pid


def test_make_dev_writes_the_pid_file_the_demo_reads():
    """The recipe execs `dg dev` after writing its shell's pid, so the file holds dg's pid."""
    recipe = (PROJECT_ROOT / "Makefile").read_text().split("\ndev:", 1)[1].split("\n\n", 1)[0]
    assert f'echo $$$$ > "$$DAGSTER_HOME/{DEV_PID_FILE}"' in recipe
    assert "exec dg dev " in recipe
