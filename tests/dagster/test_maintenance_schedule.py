"""The maintenance schedule launches a run only when the maintenance job has something to do:
an idle, fully covered deployment skips every tick, and each kind of pending maintenance is
seen by the probe (and really is changed by the job)."""

from __future__ import annotations

import datetime

import dagster as dg
import pytest

from media_usage_orchestration.processing.reconciliation.driver import run_to_completion
from media_usage_orchestration.processing.reconciliation.maintenance import settle_reconciliations
from media_usage_orchestration.processing.reconciliation.model import ReconciliationOutcome
from media_usage_orchestration.schedules import media_usage_maintenance_schedule
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from tests.support.reconciliation_runs import PARTITIONS
from tests.support.reconciliation_steps import mark_failed, untrusted_collection
from tests.support.sensor_loop import resources
from tests.support.states import set_status

TICKS_IN_AN_HOUR = 30


def evaluate(db, instance: dg.DagsterInstance, minute: int = 0):
    scheduled = datetime.datetime(2026, 11, 30, 4, minute, tzinfo=datetime.UTC)
    with dg.build_schedule_context(
        instance=instance, scheduled_execution_time=scheduled, resources=resources(db)
    ) as context:
        return media_usage_maintenance_schedule.evaluate_tick(context)


def covered(db, instance: dg.DagsterInstance, slug: str = "articles"):
    """A collection whose coverage is complete, its partition present: nothing to maintain."""
    collection = untrusted_collection(db.engine, slug, ["entry-1", "entry-2"])
    assert run_to_completion(db.engine, collection.id) is ReconciliationOutcome.COMPLETED
    instance.add_dynamic_partitions(PARTITIONS, [slug])
    return collection


def test_an_idle_fully_covered_deployment_launches_no_run_in_an_hour(db):
    with dg.instance_for_test() as instance:
        covered(db, instance)
        ticks = [evaluate(db, instance, minute) for minute in range(0, 60, 2)]

        assert len(ticks) == TICKS_IN_AN_HOUR
        assert all(not tick.run_requests for tick in ticks)
        assert {tick.skip_message for tick in ticks} == {"nothing to settle, seed or sync"}
        # Skipping was safe: the job would have changed nothing.
        assert not any(settle_reconciliations(db.engine).counts.values())


def test_inactive_capture_with_partitions_in_sync_launches_no_run(db):
    with dg.instance_for_test() as instance:
        untrusted_collection(db.engine, "articles", ["entry-1"], activate_capture=False)
        instance.add_dynamic_partitions(PARTITIONS, ["articles"])

        tick = evaluate(db, instance)

        assert not tick.run_requests
        assert settle_reconciliations(db.engine).inactive


def _seed(db, instance):
    untrusted_collection(db.engine, "articles", ["entry-1"])
    instance.add_dynamic_partitions(PARTITIONS, ["articles"])


def _seeded_row(db, instance):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    instance.add_dynamic_partitions(PARTITIONS, ["articles"])
    assert ReconciliationRepository(db.engine).seed_collection(collection.id)
    return collection


def _obsolete(db, instance):
    _seeded_row(db, instance)
    set_status(db.engine, "articles", status="complete", reconciliation_required=0)


def _failed(db, instance):
    collection = _seeded_row(db, instance)
    mark_failed(db.engine, collection, target_epoch=0)
    set_status(db.engine, "articles", change_epoch=2)


def _stuck(db, instance):
    mark_failed(db.engine, _seeded_row(db, instance), target_epoch=None)


def _partition_missing(db, instance):
    covered(db, instance)
    covered(db, instance, "pages")
    instance.delete_dynamic_partition(PARTITIONS, "pages")


def _partition_of_a_deleted_collection(db, instance):
    covered(db, instance)
    instance.add_dynamic_partitions(PARTITIONS, ["deleted_long_ago"])


# kind of pending maintenance -> (set-up, the probe's name for it, the settle count it moves)
PENDING = {
    "seed": (_seed, "seed", "seeded"),
    "obsolete": (_obsolete, "obsolete", "obsolete_deleted"),
    "failed": (_failed, "failed", "failed_reset"),
    "stuck": (_stuck, "stuck", "stuck_pinned"),
    "partition_missing": (_partition_missing, "partitions", None),
    "partition_extra": (_partition_of_a_deleted_collection, "partitions", None),
}


@pytest.mark.parametrize("kind", sorted(PENDING))
def test_every_kind_of_pending_maintenance_launches_a_run(db, kind):
    set_up, probe_name, settle_count = PENDING[kind]
    with dg.instance_for_test() as instance:
        set_up(db, instance)

        tick = evaluate(db, instance)

        [request] = tick.run_requests
        assert probe_name in request.tags["media_usage/maintenance"].split(",")
        dg.validate_run_config(media_usage_maintenance_schedule.job, request.run_config)
    if settle_count is not None:
        # The probe tracks work the job really does.
        assert settle_reconciliations(db.engine).counts[settle_count] >= 1
