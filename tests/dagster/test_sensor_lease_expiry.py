"""A run marked in flight holds a sensor back, unless the row it was working on is due because
its lease expired: that run died or stalled (Dagster only learns it when run monitoring fails
it), so the sensor asks for a replacement and the database guards keep the stale run harmless.
"""

import dagster as dg

from media_usage_orchestration import sensors
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.activation import activate
from media_usage_orchestration.processing.reconciliation import steps
from media_usage_orchestration.sensors.common import COLLECTION_ID_TAG
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.deletions import DeletionPhase, DeletionRepository
from media_usage_orchestration.store.work import WorkRepository
from tests.support.deletions import tombstone
from tests.support.sensor_loop import add_requested_partitions, evaluate, resources_for
from tests.support.states import IMAGE_ONLY, backdate


def _started_run(instance, job_name: str, tags: dict[str, str] | None = None) -> None:
    instance.add_run(
        dg.DagsterRun(job_name=job_name, status=dg.DagsterRunStatus.STARTED, tags=tags or {})
    )


def test_work_sensor_replaces_runs_whose_leases_lapsed_despite_the_cap(db, instance):
    cms = CmsWriter(db.engine)
    cms.create_collection("posts", IMAGE_ONLY)
    activate(db.engine)
    cms.insert_entries("posts", [{"id": f"entry-{i}", "hero": f"m-{i}"} for i in range(3)])
    resources = resources_for(db.url, max_work_runs=1)
    _started_run(instance, "media_usage_work")

    held = evaluate(sensors.media_usage_work_sensor, instance, resources)
    assert held.run_requests == [] and "already queued or running" in held.skip_message

    [claimed] = WorkRepository(db.engine).claim_due_batch(1, 60)  # the "dead" run's claim
    held_again = evaluate(sensors.media_usage_work_sensor, instance, resources)
    assert held_again.run_requests == []  # its lease is live: nothing to replace yet

    backdate(db.engine, schema.work, "lease_expires_at", 1, content_id=claimed.content_id)
    [request] = evaluate(sensors.media_usage_work_sensor, instance, resources).run_requests
    assert request.tags["media_usage/workflow"] == "work"


def test_reconciliation_sensor_replaces_a_run_whose_lease_lapsed(db, instance):
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    activate(db.engine)
    resources = resources_for(db.url)
    add_requested_partitions(
        instance, evaluate(sensors.media_usage_reconciliation_sensor, instance, resources)
    )
    _started_run(instance, "media_usage_reconciliation", {COLLECTION_ID_TAG: posts.id})
    held = evaluate(sensors.media_usage_reconciliation_sensor, instance, resources)
    assert held.run_requests == []

    attempt = steps.claim_collection(db.engine, posts.id)
    assert attempt.claim is not None
    assert (
        evaluate(sensors.media_usage_reconciliation_sensor, instance, resources).run_requests == []
    )

    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=posts.id)
    [request] = evaluate(
        sensors.media_usage_reconciliation_sensor, instance, resources
    ).run_requests
    assert request.partition_key == "posts"
    assert request.tags[COLLECTION_ID_TAG] == posts.id


def test_deletion_sensor_replaces_a_run_whose_lease_lapsed(db, instance):
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    tombstone(db.engine, posts, DeletionPhase.WORK, force=True)
    resources = resources_for(db.url)
    _started_run(instance, "media_usage_collection_deletion", {COLLECTION_ID_TAG: posts.id})
    held = evaluate(sensors.media_usage_collection_deletion_sensor, instance, resources)
    assert held.run_requests == []

    assert DeletionRepository(db.engine).claim(posts.id, DeletionPhase.WORK, 300) is not None
    assert (
        evaluate(sensors.media_usage_collection_deletion_sensor, instance, resources).run_requests
        == []
    )

    backdate(db.engine, schema.collection_deletions, "lease_expires_at", 1, collection_id=posts.id)
    [request] = evaluate(
        sensors.media_usage_collection_deletion_sensor, instance, resources
    ).run_requests
    assert request.run_config["ops"]["claim_deletion"]["config"]["collection_id"] == posts.id
