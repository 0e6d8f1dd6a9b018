"""The production instance configuration, deploy/dagster.yaml, loaded unmodified.

Each test copies the file into a fresh DAGSTER_HOME, points its DAGSTER_PG_* variables at a
throwaway PostgreSQL database and builds the instance the way the webserver, the daemon and
the run workers do (`DagsterInstance.get()`). The tests then check the settings that the
deployment guide (deploy/README.md) relies on, run a job against that instance, and let the
real run-queue daemon dequeue runs under the one-run-per-collection limit and launch them
through the code server, as in production.
"""

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.remote_representation.grpc_server_registry import GrpcServerRegistry
from dagster._core.scheduler.instigation import InstigatorType
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._daemon.controller import DAEMON_GRPC_SERVER_HEARTBEAT_TTL
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)
from dagster._grpc.constants import GrpcServerCommand
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_TAG, QUEUE_TAG, queue_tags
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV
from tests.support.databases import (
    TestDatabase,
    installed_database,
    postgres_admin_url,
    postgres_schema,
    require_postgres,
)
from tests.support.reconciliation_runs import (
    COMPLETE_RUN,
    DEFINITIONS_TARGET,
    MAINTENANCE_JOB,
    PARTITION_TAG,
    PARTITIONS,
    RECONCILIATION_JOB,
    assert_coverage_complete,
    remote_repository,
    run_events,
    step_outcomes,
    write_collections,
)
from tests.support.sensor_loop import resources

DEPLOY_INSTANCE_YAML = Path(__file__).resolve().parents[2] / "deploy" / "dagster.yaml"
# One run at a time per collection and workflow: every reconciliation run carries
# media_usage/queue=reconciliation:<slug> from its partition, deletion runs deletion:<slug>.
ONE_RUN_PER_COLLECTION_AND_WORKFLOW = [
    {"key": QUEUE_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
]
RUN_WORKER_TIMEOUT_SECONDS = 120


@pytest.fixture
def instance_database() -> Iterator[URL]:
    """A PostgreSQL database of its own for the Dagster instance storage, dropped afterwards."""
    require_postgres()
    name = f"dagster_{uuid.uuid4().hex[:16]}"
    admin = create_engine(postgres_admin_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(postgres_admin_url()).set(database=name)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def instance(instance_database: URL, tmp_path, monkeypatch) -> Iterator[dg.DagsterInstance]:
    """The instance every deployed process builds from $DAGSTER_HOME/dagster.yaml."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(DEPLOY_INSTANCE_YAML, home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("DAGSTER_PG_HOST", instance_database.host or "127.0.0.1")
    monkeypatch.setenv("DAGSTER_PG_PORT", str(instance_database.port or 5432))
    monkeypatch.setenv("DAGSTER_PG_USER", instance_database.username or "postgres")
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", instance_database.password or "")
    monkeypatch.setenv("DAGSTER_PG_DB", instance_database.database)
    with dg.DagsterInstance.get() as instance:
        yield instance


def _stored(instance_database: URL, sql: str, **params) -> list[tuple]:
    """Rows read straight from the instance's PostgreSQL database, not through Dagster."""
    engine = create_engine(instance_database.set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(sql), params)]
    finally:
        engine.dispose()


def test_the_deploy_instance_stores_everything_in_postgres_and_queues_one_run_per_collection(
    instance, instance_database
):
    assert (
        DEPLOY_INSTANCE_YAML.read_bytes()
        == (Path(instance.root_directory) / "dagster.yaml").read_bytes()
    )
    assert isinstance(instance.run_storage, PostgresRunStorage)
    assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
    assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
    storage_url = make_url(instance.run_storage.postgres_url)
    assert storage_url.drivername == "postgresql+psycopg2"  # never psycopg 3 (SQLAlchemy 2.1)
    assert storage_url.database == instance_database.database
    # Dagster created its tables in the throwaway database.
    assert {"runs", "event_logs", "jobs"} <= {
        name
        for (name,) in _stored(
            instance_database,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'",
        )
    }

    assert isinstance(instance.run_coordinator, dg.QueuedRunCoordinator)
    queue = instance.get_concurrency_config().run_queue_config
    assert queue is not None
    assert queue.tag_concurrency_limits == ONE_RUN_PER_COLLECTION_AND_WORKFLOW
    assert queue.max_concurrent_runs == 8
    assert instance.run_coordinator.dequeue_use_threads
    # A queued work run for a new edit starts within a second of its submission.
    assert instance.run_coordinator.dequeue_interval_seconds == 1

    assert instance.run_monitoring_enabled
    assert instance.run_monitoring_max_resume_run_attempts == 0
    assert instance.run_monitoring_poll_interval_seconds == 60
    assert instance.run_retries_enabled
    assert instance.run_retries_max_retries == 2
    assert instance.run_retries_retry_on_asset_or_op_failure is False

    # The tick history the guide states: days kept per tick status.
    sensor_days = instance.get_tick_retention_settings(InstigatorType.SENSOR)
    assert {"SKIPPED": 1, "SUCCESS": 14, "FAILURE": 30}.items() <= {
        status.value: days for status, days in sensor_days.items()
    }.items()
    schedule_days = instance.get_tick_retention_settings(InstigatorType.SCHEDULE)
    assert set(schedule_days.values()) == {30}


def test_a_job_runs_on_the_deploy_instance_and_its_run_and_events_land_in_postgres(
    db, instance, instance_database
):
    collections = write_collections(db.engine, {"pages": 2, "posts": 2})
    activate(db.engine)

    result = MAINTENANCE_JOB.execute_in_process(instance=instance, resources=resources(db))

    assert result.success
    run = instance.get_run_by_id(result.run_id)
    assert run is not None and run.status is dg.DagsterRunStatus.SUCCESS
    records = instance.get_records_for_run(result.run_id).records
    event_types = [record.event_log_entry.dagster_event_type for record in records]
    assert dg.DagsterEventType.RUN_START in event_types
    assert event_types.count(dg.DagsterEventType.STEP_SUCCESS) == 2
    assert event_types[-1] is dg.DagsterEventType.RUN_SUCCESS
    assert len(instance.all_logs(result.run_id)) == len(records)
    # The maintenance job keeps the collection partitions in the instance storage.
    assert sorted(instance.get_dynamic_partitions(PARTITIONS)) == sorted(collections)

    # The same facts, read from the PostgreSQL database itself.
    assert _stored(
        instance_database, "SELECT status FROM runs WHERE run_id = :run_id", run_id=run.run_id
    ) == [("SUCCESS",)]
    stored_types = [
        event_type
        for (event_type,) in _stored(
            instance_database,
            "SELECT dagster_event_type FROM event_logs WHERE run_id = :run_id ORDER BY id",
            run_id=run.run_id,
        )
    ]
    assert stored_types == [event_type.value if event_type else None for event_type in event_types]
    assert sorted(
        key
        for (key,) in _stored(
            instance_database,
            "SELECT partition FROM dynamic_partitions WHERE partitions_def_name = :name",
            name=PARTITIONS,
        )
    ) == sorted(collections)


@pytest.fixture
def postgres_cms(instance_database: URL) -> Iterator[TestDatabase]:
    """A PostgreSQL CMS database (a schema of its own) with EmDash's schema installed: the
    dialect a deployment with several run workers uses."""
    with postgres_schema() as url, installed_database("postgres", url) as cms:
        yield cms


@contextlib.contextmanager
def code_server(instance: dg.DagsterInstance) -> Iterator[WorkspaceProcessContext]:
    """The project's code location in a gRPC code server, loaded the way dagster-daemon loads
    it. On exit it waits for the server to stop, which it does once the run workers it started
    have exited, so no process touches the instance database after the test."""
    with (
        GrpcServerRegistry(
            instance_ref=instance.get_ref(),
            server_command=GrpcServerCommand.API_GRPC,
            heartbeat_ttl=DAEMON_GRPC_SERVER_HEARTBEAT_TTL,
            startup_timeout=instance.code_server_process_startup_timeout,
            wait_for_processes_on_shutdown=True,
        ) as registry,
        WorkspaceProcessContext(
            instance, DEFINITIONS_TARGET, grpc_server_registry=registry
        ) as workspace,
    ):
        yield workspace


def _submit(instance, workspace, remote_job, slug: str) -> str:
    """Create and submit a reconciliation run as the sensor asks for it: its partition and the
    partition's tags (collection and queue). The queued run coordinator only enqueues it."""
    run = instance.create_run_for_job(
        job_def=RECONCILIATION_JOB,
        tags={PARTITION_TAG: slug, **queue_tags("reconciliation", slug)},
        remote_job_origin=remote_job.get_remote_origin(),
        job_code_origin=remote_job.get_python_origin(),
    )
    submitted = instance.submit_run(run.run_id, workspace.create_request_context())
    return submitted.run_id


def _status(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRunStatus:
    run = instance.get_run_by_id(run_id)
    assert run is not None
    return run.status


@pytest.mark.slow
def test_the_daemon_dequeues_one_run_per_collection_and_a_run_worker_executes_it(
    postgres_cms, instance, monkeypatch
):
    db = postgres_cms
    collections = write_collections(db.engine, {"pages": 3, "posts": 3})
    activate(db.engine)
    assert MAINTENANCE_JOB.execute_in_process(instance=instance, resources=resources(db)).success
    # The code server and the run workers it starts read the CMS database URL from here.
    monkeypatch.setenv(DATABASE_URL_ENV, db.url)

    with (
        code_server(instance) as workspace,
        QueuedRunCoordinatorDaemon(interval_seconds=5) as queue_daemon,
    ):
        remote_job = remote_repository(workspace).get_full_job(RECONCILIATION_JOB.name)
        posts = _submit(instance, workspace, remote_job, "posts")
        posts_again = _submit(instance, workspace, remote_job, "posts")
        pages = _submit(instance, workspace, remote_job, "pages")
        for run_id, slug in ((posts, "posts"), (posts_again, "posts"), (pages, "pages")):
            run = instance.get_run_by_id(run_id)
            assert run is not None and run.status is dg.DagsterRunStatus.QUEUED
            assert (run.tags[COLLECTION_TAG], run.tags[PARTITION_TAG]) == (slug, slug)
            assert run.tags[QUEUE_TAG] == f"reconciliation:{slug}"

        # One daemon iteration: the first posts run and the pages run start; the second posts
        # run waits, since the first holds the collection's only slot.
        list(queue_daemon.run_iteration(workspace))

        assert _status(instance, posts_again) is dg.DagsterRunStatus.QUEUED
        started = [*IN_PROGRESS_RUN_STATUSES, dg.DagsterRunStatus.SUCCESS]
        assert _status(instance, posts) in started
        assert _status(instance, pages) in started

        instance.run_launcher.join(timeout=RUN_WORKER_TIMEOUT_SECONDS)
        assert _status(instance, posts) is dg.DagsterRunStatus.SUCCESS
        assert _status(instance, pages) is dg.DagsterRunStatus.SUCCESS
        assert _status(instance, posts_again) is dg.DagsterRunStatus.QUEUED

        # The slot is free: the next iteration starts the waiting run.
        list(queue_daemon.run_iteration(workspace))
        instance.run_launcher.join(timeout=RUN_WORKER_TIMEOUT_SECONDS)
        assert _status(instance, posts_again) is dg.DagsterRunStatus.SUCCESS

    # Each run worker wrote its events to the PostgreSQL instance from its own process.
    for run_id in (posts, posts_again, pages):
        (start,) = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_START)
        assert start.dagster_event is not None and start.dagster_event.pid != os.getpid()
    assert step_outcomes(run_events(instance, posts)) == COMPLETE_RUN
    assert step_outcomes(run_events(instance, pages)) == COMPLETE_RUN
    assert step_outcomes(run_events(instance, posts_again)) == {
        "claim_reconciliation": "already_complete"
    }
    assert_coverage_complete(db.engine, list(collections.values()))
