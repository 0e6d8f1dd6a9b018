"""Checks that never lie, as a property: after any interleaving of edits, work runs, operator
retries, reconciliations, an operator's "Execute" of a check and ticks, the latest evaluation of
`coverage_complete` and `queue_healthy` as Dagster reports it (the API the alert sensor and the
UI read), the collection asset's latest observation, and the alert sensor's cursor all agree
with `media-usage status` once the queue sensor has ticked. Both dialects, a real instance, real
runs; the interleavings come from seeded random choices, so a failure names its seed and
reproduces. The exact case that once kept a false alarm for 9 minutes (the content fixed and
projected, then the table's retry reopening the projected entry while a run lingered) is the
last test."""

from __future__ import annotations

import random

import dagster as dg
import pytest

from media_usage_orchestration.assets.coverage_history import (
    coverage_assets,
    coverage_history_key,
)
from media_usage_orchestration.assets.health import COVERAGE_CHECK, QUEUE_CHECK
from media_usage_orchestration.assets.queue import queue_key, with_queue_assets
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import sample_entry
from media_usage_orchestration.processing.operator.actions import collection_statuses
from media_usage_orchestration.sensors.alerts import (
    ALERT_WEBHOOK_ENV,
    announced_failing,
    media_usage_alert_sensor,
)
from media_usage_orchestration.sensors.queue import media_usage_queue_sensor
from tests.support.reconciliation_runs import (
    activate_with_job,
    oversized_entry,
    run_partition,
    write_collections,
)
from tests.support.sensor_loop import resources
from tests.support.webhook import receiving

pytestmark = pytest.mark.slow

SLUG = "articles"
BROKEN = "broken-entry"
CHECKS = {
    COVERAGE_CHECK: dg.AssetCheckKey(coverage_history_key(SLUG), COVERAGE_CHECK),
    QUEUE_CHECK: dg.AssetCheckKey(queue_key(SLUG), QUEUE_CHECK),
}
# One seeded interleaving per seed and dialect, each of STEPS actions.
SEEDS = (11, 23, 37)
STEPS = 14


class World:
    """One collection, the project's jobs run in process, the queue and alert sensors ticked by
    hand, every event stored as the daemon stores it."""

    def __init__(self, db, instance: dg.DagsterInstance) -> None:
        self.db, self.instance = db, instance
        self.choose = random.Random(0)
        self.writer = CmsWriter(db.engine)
        self.edits = 0
        self.alert_cursor: str | None = None
        self.checks_job = self.definitions().resolve_job_def("execute")

    # --- actions ---------------------------------------------------------------------------------

    def edit(self) -> None:
        self.edits += 1
        entry = sample_entry("art", 1)
        self.writer.update_entry(SLUG, entry["id"], {"title": f"edit {self.edits}"})

    def break_content(self) -> None:
        if self._has(BROKEN):
            self.writer.update_entry(SLUG, BROKEN, {"body": oversized_entry(BROKEN)["body"]})
        else:
            self.writer.insert_entry(SLUG, oversized_entry(BROKEN))

    def fix_content(self) -> None:
        if self._has(BROKEN):
            self.writer.update_entry(SLUG, BROKEN, {"body": []})

    def work(self) -> None:
        job = defs.resolve_job_def("media_usage_work")
        assert job.execute_in_process(instance=self.instance, resources=resources(self.db)).success

    def retry(self) -> None:
        config = {"ops": {"reopen_failed_work": {"config": {"collection": SLUG}}}}
        if self._has(BROKEN) and self.choose.random() < 0.5:  # the table's one-entry retry
            config["ops"]["reopen_failed_work"]["config"]["content_id"] = BROKEN
        job = defs.resolve_job_def("retry_media_usage_work")
        job.execute_in_process(
            instance=self.instance, resources=resources(self.db), run_config=config
        )

    def reconcile(self) -> None:
        run_partition(self.db, self.instance, SLUG, tags={"media_usage/force": "true"})

    def execute_checks(self) -> None:
        """An operator's "Execute": another writer of the checks' evaluations."""
        run = self.checks_job.execute_in_process(
            instance=self.instance, resources=resources(self.db)
        )
        assert run.success

    def tick(self) -> None:
        with dg.build_sensor_context(
            instance=self.instance, resources=resources(self.db)
        ) as context:
            data = media_usage_queue_sensor.evaluate_tick(context)
        for event in data.asset_events:
            self.instance.report_runless_asset_event(event)

    def alert_tick(self) -> None:
        with dg.build_sensor_context(
            instance=self.instance, cursor=self.alert_cursor, definitions=self.definitions()
        ) as context:
            self.alert_cursor = media_usage_alert_sensor.evaluate_tick(context).cursor

    @staticmethod
    def definitions() -> dg.Definitions:
        """The project's definitions with the collection's assets and checks, as the code
        location loads them, and a job executing both checks (the UI's "Execute")."""
        collection = with_queue_assets(
            dg.Definitions(
                assets=coverage_assets([SLUG]),
            )
        )
        execute = dg.define_asset_job(
            "execute", selection=dg.AssetSelection.checks(*CHECKS.values())
        )
        return dg.Definitions.merge(defs, collection, dg.Definitions(jobs=[execute]))

    def _has(self, content_id: str) -> bool:
        with self.db.engine.connect() as connection:
            return bool(
                connection.exec_driver_sql(
                    f"SELECT COUNT(*) FROM ec_{SLUG} WHERE id = '{content_id}'"
                ).scalar()
            )

    # --- what must agree -------------------------------------------------------------------------

    def assert_agrees_with_status(self, story: list[str]) -> None:
        [status] = [
            row for row in collection_statuses(self.db.engine) if row.collection_slug == SLUG
        ]
        expected = {
            COVERAGE_CHECK: status.failed_work == 0
            and status.status != "failed"
            and status.reconciliation_state != "failed",
            QUEUE_CHECK: status.failed_work == 0 and status.stuck_work == 0,
        }
        latest = {
            name: self.instance.get_latest_asset_check_evaluation_record(key).evaluation.passed
            for name, key in CHECKS.items()
        }
        assert latest == expected, (story, status)
        [observed] = self.instance.fetch_observations(coverage_history_key(SLUG), limit=1).records
        numbers = observed.asset_observation.metadata
        shown = {name: numbers[name].value for name in ("pending_work", "failed_work", "sources")}
        assert shown == {
            "pending_work": status.pending_work,
            "failed_work": status.failed_work,
            "sources": status.sources,
        }, story
        self.alert_tick()
        announced = {target.check_name for target in announced_failing(self.alert_cursor)}
        assert announced == {name for name, passed in expected.items() if not passed}, story


ACTIONS = (
    "edit",
    "break_content",
    "fix_content",
    "work",
    "work",
    "retry",
    "reconcile",
    "execute_checks",
)


@pytest.fixture
def world(db, webhook_env) -> World:
    write_collections(db.engine, {SLUG: 6})
    with receiving() as receiver, dg.DagsterInstance.ephemeral() as instance:
        webhook_env.setenv(ALERT_WEBHOOK_ENV, receiver.url)
        activate_with_job(db, instance)
        assert run_partition(db, instance, SLUG).success
        yield World(db, instance)


@pytest.mark.parametrize("seed", SEEDS)
def test_after_any_interleaving_the_latest_evaluations_are_the_status(world, seed):
    choose = world.choose = random.Random(seed)
    story: list[str] = []
    world.tick()
    world.assert_agrees_with_status(story)
    for _ in range(STEPS):
        action = choose.choice(ACTIONS)
        story.append(action)
        getattr(world, action)()
        # Within one sensor interval: the next tick of the queue sensor.
        world.tick()
        world.assert_agrees_with_status(story)


def test_the_exact_case_fix_then_retry_while_a_run_lingers(world):
    """The content fixed and its work projected, then the table's retry reopening the projected
    entry (as EmDash's retryOperatorWork does), a stale "coverage stale" evaluation stored by
    another run in between, and the lingering run projecting again: the latest evaluation is
    the status after each tick, and the alert sensor announces nothing."""
    story = ["break", "work"]
    world.break_content()
    world.work()
    world.tick()
    world.assert_agrees_with_status(story)  # failing, announced

    story += ["fix", "work"]
    world.fix_content()
    world.work()
    world.tick()
    world.assert_agrees_with_status(story)  # recovered

    story += ["retry the projected entry", "stale evaluation from another run"]
    config = {"collection": SLUG, "content_id": BROKEN}
    defs.resolve_job_def("retry_media_usage_work").execute_in_process(
        instance=world.instance,
        resources=resources(world.db),
        run_config={"ops": {"reopen_failed_work": {"config": config}}},
    )
    world.instance.report_runless_asset_event(
        dg.AssetCheckEvaluation(
            asset_key=CHECKS[COVERAGE_CHECK].asset_key,
            check_name=COVERAGE_CHECK,
            passed=False,
            description="coverage stale",
        )
    )
    world.tick()
    world.assert_agrees_with_status(story)

    story.append("the lingering run projects again")
    world.work()
    world.tick()
    world.assert_agrees_with_status(story)
