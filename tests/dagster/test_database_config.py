"""The database URL comes from the environment only: no job offers it as run config."""

import os
import shutil
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import dagster as dg

from media_usage_orchestration.definitions import defs
from media_usage_orchestration.resources import database as database_module
from media_usage_orchestration.resources.database import (
    MAX_SHARED_ENGINES,
    MediaUsageDatabase,
    shared_engine,
)
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV

REPOSITORY = Path(__file__).resolve().parents[2]


def _database_config_fields(job: dg.JobDefinition) -> dict:
    resources = job.run_config_schema.config_type.fields["resources"].config_type.fields
    return dict(resources["database"].config_type.fields["config"].config_type.fields)


def test_no_job_offers_a_database_url_in_run_config():
    names = [job.name for job in defs.resolve_all_job_defs()]
    assert "media_usage_work" in names
    for name in names:
        job = defs.resolve_job_def(name)
        assert _database_config_fields(job) == {}, name


def test_the_resource_reads_the_environment_at_execution(monkeypatch, tmp_path):
    url = f"sqlite:///{tmp_path / 'from_env.db'}"
    monkeypatch.setenv(DATABASE_URL_ENV, url)
    assert MediaUsageDatabase().resolved_url() == url


def test_a_bound_url_survives_run_initialization(db, monkeypatch):
    monkeypatch.setenv(DATABASE_URL_ENV, "sqlite:////nonexistent/never-opened.db")

    @dg.op
    def resolved(database: MediaUsageDatabase) -> str:
        return database.resolved_url()

    @dg.job
    def show_url():
        resolved()

    result = show_url.execute_in_process(resources={"database": MediaUsageDatabase.for_url(db.url)})
    assert result.output_for_node("resolved") == db.url


def test_dg_check_defs_passes(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("")
    dg_command = shutil.which("dg", path=str(Path(sys.executable).parent))
    assert dg_command is not None
    completed = subprocess.run(
        [dg_command, "check", "defs"],
        cwd=REPOSITORY,
        env={**os.environ, "DAGSTER_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]


def _ticked_engine(resource: MediaUsageDatabase):
    """The engine a sensor tick gets: the resource initialized without a run."""
    with dg.build_resources({"database": resource}) as initialized:
        engine = initialized.database.engine
    return engine


def test_sensor_ticks_share_one_engine_per_url_and_runs_own_theirs(db):
    resource = MediaUsageDatabase.for_url(db.url)
    first, second = _ticked_engine(resource), _ticked_engine(resource)
    assert first is second
    with first.connect() as connection:  # not disposed by the ticks' teardown
        assert connection.exec_driver_sql("SELECT 1").scalar() == 1

    engines = []

    @dg.op
    def run_engine(database: MediaUsageDatabase) -> None:
        with database.engine.connect():  # leaves a pooled connection unless disposed
            engines.append(database.engine)

    @dg.job
    def one_run():
        run_engine()

    assert one_run.execute_in_process(resources={"database": resource}).success
    [run_engine_used] = engines
    assert run_engine_used is not first
    assert run_engine_used.pool.checkedin() == 0  # disposed at the run's end


def test_shared_engines_beyond_the_limit_are_disposed(tmp_path, monkeypatch):
    monkeypatch.setattr(database_module, "_shared_engines", OrderedDict())
    urls = [f"sqlite:///{tmp_path / f'{n}.db'}" for n in range(MAX_SHARED_ENGINES + 1)]
    oldest = shared_engine(urls[0])
    with oldest.connect():
        pass
    assert oldest.pool.checkedin() == 1
    for url in urls[1:]:
        shared_engine(url)
    assert list(database_module._shared_engines) == urls[1:]
    assert oldest.pool.checkedin() == 0
    assert shared_engine(urls[-1]) is database_module._shared_engines[urls[-1]]
