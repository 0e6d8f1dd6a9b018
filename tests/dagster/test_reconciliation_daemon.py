"""Real sensor-daemon ticks for the reconciliation sensor.

The project's code location is served by a gRPC code server (as `dagster-daemon` loads it) and
each tick goes through the daemon's own `execute_sensor_iteration`: run-key dedup, dynamic
partition requests, run creation and launch. The synchronous run launcher executes every
launched run in this process before the tick returns. Dagster's clock is frozen and moved
past the sensor's 30 s interval between ticks; the database is never made to wait.
"""

import datetime
import logging

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import TickStatus
from dagster._core.test_utils import freeze_time
from dagster._daemon.sensor import execute_sensor_iteration

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, FieldSpec
from media_usage_orchestration.local.in_process_lane import RUN_KEY_TAG
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.processing.reconciliation import maintenance, steps
from media_usage_orchestration.sensors.reconciliation import media_usage_reconciliation_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV, create_database_engine
from media_usage_orchestration.store.core.schema import install_schema
from tests.support.reconciliation_runs import (
    COLLECTION_ID_TAG,
    COLLECTION_TAG,
    COMPLETE_RUN,
    OUTCOME_TAG,
    PARTITION_TAG,
    PARTITIONS,
    RECONCILIATION_JOB,
    assert_coverage_complete,
    daemon_workspace,
    remote_repository,
    run_events,
    step_outcomes,
    write_collections,
)
from tests.support.states import one, set_status, status_row

pytestmark = pytest.mark.slow

SENSOR_NAME = media_usage_reconciliation_sensor.name
SLUGS = ["articles", "pages", "posts"]


class Daemon:
    """The sensor daemon over one instance and workspace, with Dagster's clock under control."""

    def __init__(self, instance: dg.DagsterInstance, workspace) -> None:
        self.instance = instance
        self.workspace = workspace
        self.now = datetime.datetime.now(datetime.UTC)
        remote_sensor = remote_repository(workspace).get_sensor(SENSOR_NAME)
        self.origin_id = remote_sensor.get_remote_origin_id()
        self.selector_id = remote_sensor.selector_id

    def tick(self):
        """One daemon iteration, past the sensor's minimum interval; returns its tick."""
        self.now += datetime.timedelta(seconds=31)
        with freeze_time(self.now):
            list(
                execute_sensor_iteration(
                    self.workspace,
                    logging.getLogger("sensor_daemon"),
                    threadpool_executor=None,
                    submit_threadpool_executor=None,
                )
            )
        return self.instance.get_ticks(self.origin_id, self.selector_id, limit=1)[0]

    def runs(self) -> list[dg.DagsterRun]:
        return self.instance.get_runs(filters=dg.RunsFilter(job_name=RECONCILIATION_JOB.name))


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    """A SQLite database file with three collections written before capture was activated,
    a test instance, and the code location the daemon loads (it reads the URL at start)."""
    url = f"sqlite:///{tmp_path / 'media_usage.db'}"
    engine = create_database_engine(url)
    with engine.begin() as connection:
        install_schema(connection)
    collections = write_collections(engine, {slug: 20 for slug in SLUGS})
    activate(engine)
    monkeypatch.setenv(DATABASE_URL_ENV, url)
    with (
        dg.instance_for_test(
            synchronous_run_coordinator=True, synchronous_run_launcher=True
        ) as instance,
        daemon_workspace(instance) as workspace,
    ):
        yield Daemon(instance, workspace), engine, collections
    engine.dispose()


def test_a_daemon_tick_launches_one_run_per_due_collection_and_never_a_duplicate(daemon):
    daemon, engine, collections = daemon

    first = daemon.tick()
    # The sensor adds the partitions; a run can only be requested for an existing one.
    assert sorted(daemon.instance.get_dynamic_partitions(PARTITIONS)) == SLUGS
    assert (first.status, first.run_ids) == (TickStatus.SKIPPED, [])

    second = daemon.tick()

    assert second.status is TickStatus.SUCCESS
    runs = daemon.runs()
    assert sorted(run.run_id for run in runs) == sorted(second.run_ids)
    assert sorted(run.tags[PARTITION_TAG] for run in runs) == SLUGS
    for run in runs:
        collection = collections[run.tags[PARTITION_TAG]]
        assert run.status is dg.DagsterRunStatus.SUCCESS
        assert run.tags["dagster/sensor_name"] == SENSOR_NAME
        assert run.tags[RUN_KEY_TAG].startswith(f"reconcile:{collection.id}:")
        assert (run.tags[COLLECTION_ID_TAG], run.tags[COLLECTION_TAG]) == (
            collection.id,
            collection.slug,
        )
        assert run.tags[OUTCOME_TAG] == "completed"
        assert step_outcomes(run_events(daemon.instance, run.run_id)) == COMPLETE_RUN
    assert sorted(second.run_keys) == sorted(run.tags[RUN_KEY_TAG] for run in runs)
    assert_coverage_complete(engine, list(collections.values()))

    third = daemon.tick()
    assert (third.status, third.run_ids) == (TickStatus.SKIPPED, [])
    assert len(daemon.runs()) == 3

    # A schema change makes `articles` untrusted; the maintenance lane seeds its coordinator,
    # then a manual repair completes coverage before any run claims it. The run the sensor
    # asks for changes nothing (coverage is trusted again), so the next tick asks for the
    # same key and the daemon launches no duplicate.
    articles = collections["articles"]
    CmsWriter(engine).add_field("articles", FieldSpec("cover", "image"))
    assert maintenance.settle_reconciliations(engine).counts["seeded"] == 1
    set_status(engine, "articles", status="complete", reconciliation_required=0, cursor=None)

    asked = daemon.tick()
    [run] = [daemon.instance.get_run_by_id(run_id) for run_id in asked.run_ids]
    assert (run.status, run.tags[OUTCOME_TAG]) == (
        dg.DagsterRunStatus.SUCCESS,
        "already_complete",
    )
    assert one(engine, schema.reconciliations, collection_id=articles.id)["state"] == "pending"

    repeated = daemon.tick()

    assert repeated.status is TickStatus.SKIPPED
    assert repeated.run_keys == asked.run_keys == [run.tags[RUN_KEY_TAG]]
    assert repeated.run_ids == []
    assert len(daemon.runs()) == 4
    # The maintenance lane deletes the obsolete coordinator; nothing is due any more.
    assert maintenance.settle_reconciliations(engine).counts["obsolete_deleted"] == 1
    assert daemon.tick().run_keys == []


def test_a_run_that_failed_before_its_claim_is_asked_for_again(daemon, monkeypatch):
    """A run that dies before touching its coordinator (a crash at start-up, a database
    outage outlasting the retry policy) leaves the row due exactly as it was. The run key
    must still change, or the daemon would never launch that collection's run again."""
    daemon, engine, collections = daemon
    daemon.tick()
    assert maintenance.settle_reconciliations(engine).counts["seeded"] == 3
    coordinators = {
        slug: one(engine, schema.reconciliations, collection_id=collection.id)
        for slug, collection in collections.items()
    }

    def unreachable(*_args, **_kwargs):
        raise RuntimeError("injected: the run died before its claim")

    with monkeypatch.context() as patch:
        patch.setattr(steps, "claim_collection", unreachable)
        failed = daemon.tick()
    assert len(failed.run_ids) == 3
    assert {run.status for run in daemon.runs()} == {dg.DagsterRunStatus.FAILURE}
    for slug, collection in collections.items():
        assert (
            one(engine, schema.reconciliations, collection_id=collection.id) == (coordinators[slug])
        )

    retried = daemon.tick()

    assert len(retried.run_ids) == 3
    assert not set(retried.run_keys) & set(failed.run_keys)
    for run_id in retried.run_ids:
        run = daemon.instance.get_run_by_id(run_id)
        assert (run.status, run.tags[OUTCOME_TAG]) == (dg.DagsterRunStatus.SUCCESS, "completed")
    assert_coverage_complete(engine, list(collections.values()))
    assert all(status_row(engine, slug)["status"] == "complete" for slug in SLUGS)
    assert daemon.tick().run_ids == []
