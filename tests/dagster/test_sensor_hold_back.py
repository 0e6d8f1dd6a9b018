"""One queued run per collection and workflow: a run queued or in flight for a collection holds
its sensor back, even when the row it works on is due again because its lease lapsed (the run
may be dead: the run-health sensor fails it from its run lease, and the next tick asks for its
successor), and so does a failed run that the run-retry daemon is about to retry."""

import dagster as dg

from media_usage_orchestration import sensors
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.processing.reconciliation import steps
from media_usage_orchestration.resources.automation import MediaUsageAutomation
from media_usage_orchestration.sensors import work as work_sensor_module
from media_usage_orchestration.sensors.common import (
    AUTO_RETRY_RUN_ID_TAG,
    COLLECTION_ID_TAG,
    WILL_RETRY_TAG,
)
from media_usage_orchestration.sensors.work import HANDOVER_LEAD_SECONDS
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.deletion.records import DeletionPhase
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from media_usage_orchestration.store.work.repository import WorkRepository
from tests.support.deletions import tombstone
from tests.support.sensor_loop import add_requested_partitions, evaluate, resources_for
from tests.support.states import IMAGE_ONLY, backdate


def _run(instance, job_name: str, status: dg.DagsterRunStatus, tags=None) -> dg.DagsterRun:
    run = dg.DagsterRun(job_name=job_name, status=status, tags=tags or {})
    instance.add_run(run)
    return run


def _finish(instance, run: dg.DagsterRun) -> None:
    instance.report_run_failed(run, "its worker is gone")


def test_the_work_sensor_keeps_one_run_per_collection_even_past_a_lapsed_lease(db, instance):
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    activate(db.engine)
    cms.insert_entries("posts", [{"id": f"entry-{i}", "hero": f"m-{i}"} for i in range(3)])
    resources = resources_for(db.url)
    running = _run(
        instance, "media_usage_work", dg.DagsterRunStatus.STARTED, {COLLECTION_ID_TAG: posts.id}
    )

    [claimed] = WorkRepository(db.engine).claim_due_batch(1, 60)  # the "dead" run's claim
    backdate(db.engine, schema.work, "lease_expires_at", 1, content_id=claimed.content_id)
    held = evaluate(sensors.media_usage_work_sensor, instance, resources)
    assert held.run_requests == [] and "queued or running" in held.skip_message

    _finish(instance, running)  # what the run-health sensor does once its run lease expired
    [request] = evaluate(sensors.media_usage_work_sensor, instance, resources).run_requests
    assert request.tags[COLLECTION_ID_TAG] == posts.id


def test_a_work_run_waiting_to_start_is_never_joined_by_a_second_one(db, instance):
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    activate(db.engine)
    cms.insert_entries("posts", [{"id": "entry-0", "hero": "m-0"}])
    # More places than runs: only the queued run holds the collection back.
    resources = resources_for(db.url, work_runs_per_collection=3, max_work_runs=8)
    waiting = _run(
        instance, "media_usage_work", dg.DagsterRunStatus.STARTING, {COLLECTION_ID_TAG: posts.id}
    )

    for _ in range(3):  # tick after tick while it waits, as in a stall
        cms.update_entry("posts", "entry-0", {"hero": "m-new"})  # the due set moves on
        assert evaluate(sensors.media_usage_work_sensor, instance, resources).run_requests == []

    instance.report_run_canceled(waiting)  # gone; a running one leaves room for a second
    _run(instance, "media_usage_work", dg.DagsterRunStatus.STARTED, {COLLECTION_ID_TAG: posts.id})
    [request] = evaluate(sensors.media_usage_work_sensor, instance, resources).run_requests
    assert request.tags[COLLECTION_ID_TAG] == posts.id


def test_the_reconciliation_sensor_waits_for_a_run_in_flight_or_about_to_be_retried(db, instance):
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    activate(db.engine)
    resources = resources_for(db.url)
    add_requested_partitions(
        instance, evaluate(sensors.media_usage_reconciliation_sensor, instance, resources)
    )
    tags = {COLLECTION_ID_TAG: posts.id}
    running = _run(instance, "media_usage_reconciliation", dg.DagsterRunStatus.STARTED, tags)
    attempt = steps.claim_collection(db.engine, posts.id)
    assert attempt.claim is not None
    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=posts.id)
    assert (
        evaluate(sensors.media_usage_reconciliation_sensor, instance, resources).run_requests == []
    )

    # Failed by the run-health sensor; the run-retry daemon marks it and will retry it.
    _finish(instance, running)
    instance.add_run_tags(running.run_id, {WILL_RETRY_TAG: "true"})
    assert (
        evaluate(sensors.media_usage_reconciliation_sensor, instance, resources).run_requests == []
    )

    # Its retry was launched (and ended): the collection is free again.
    instance.add_run_tags(running.run_id, {AUTO_RETRY_RUN_ID_TAG: "retry-run"})
    [request] = evaluate(
        sensors.media_usage_reconciliation_sensor, instance, resources
    ).run_requests
    assert request.partition_key == "posts"
    assert request.tags[COLLECTION_ID_TAG] == posts.id
    assert request.tags["media_usage/queue"] == "reconciliation:posts"


def test_the_deletion_sensor_waits_for_a_run_in_flight(db, instance):
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    tombstone(db.engine, posts, DeletionPhase.WORK, force=True)
    resources = resources_for(db.url)
    running = _run(
        instance,
        "media_usage_collection_deletion",
        dg.DagsterRunStatus.STARTED,
        {COLLECTION_ID_TAG: posts.id},
    )

    assert DeletionRepository(db.engine).claim(posts.id, DeletionPhase.WORK, 300) is not None
    backdate(db.engine, schema.collection_deletions, "lease_expires_at", 1, collection_id=posts.id)
    assert (
        evaluate(sensors.media_usage_collection_deletion_sensor, instance, resources).run_requests
        == []
    )

    _finish(instance, running)
    [request] = evaluate(
        sensors.media_usage_collection_deletion_sensor, instance, resources
    ).run_requests
    assert request.run_config["ops"]["claim_deletion"]["config"]["collection_id"] == posts.id
    assert request.tags["media_usage/queue"] == "deletion:posts"


def test_a_run_ending_its_budget_gets_its_successor_before_it_stops(db, instance, monkeypatch):
    """In its budget's last `HANDOVER_LEAD_SECONDS` a running work run no longer holds its
    collection: the successor is asked for while it still drains (once per predecessor), and a
    successor waiting to start holds the collection as any queued run does."""
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    activate(db.engine)
    cms.insert_entries("posts", [{"id": "entry-0", "hero": "m-0"}])
    resources = resources_for(db.url)
    ending = _run(
        instance, "media_usage_work", dg.DagsterRunStatus.STARTED, {COLLECTION_ID_TAG: posts.id}
    )
    start = dg.DagsterEvent(
        event_type_value=dg.DagsterEventType.RUN_START.value, job_name="media_usage_work"
    )
    instance.report_dagster_event(start, run_id=ending.run_id)  # its start time, now
    started = instance.get_run_record_by_id(ending.run_id).start_time
    handover = started + MediaUsageAutomation().work_seconds_per_run - HANDOVER_LEAD_SECONDS

    def tick_at(moment: float):
        monkeypatch.setattr(work_sensor_module, "_now", lambda: moment)
        return evaluate(sensors.media_usage_work_sensor, instance, resources)

    assert tick_at(handover - 1).run_requests == []  # mid-budget: it drains its collection
    [request] = tick_at(handover).run_requests
    assert request.tags[COLLECTION_ID_TAG] == posts.id
    assert [each.run_key for each in tick_at(handover + 5).run_requests] == [request.run_key]

    _run(instance, "media_usage_work", dg.DagsterRunStatus.STARTING, {COLLECTION_ID_TAG: posts.id})
    assert tick_at(handover + 10).run_requests == []
