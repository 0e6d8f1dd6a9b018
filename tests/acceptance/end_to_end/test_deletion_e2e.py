"""Collection deletion end to end through Dagster on both dialects: the operator's request job,
then the deletion sensor's ticks and the runs they ask for, until the tombstone is gone and
nothing of the collection is left; the slug can then be reused by a new identity. Also the
sensor's guards (no duplicate run while one is in flight, a new run key per due generation)
and an operator's re-execution of a failed deletion run from the failed step."""

import dagster as dg
import pytest
from dagster._core.remote_origin import (
    InProcessCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import MEDIA_FIELDS, sample_entries
from media_usage_orchestration.local.in_process_lane import RUN_KEY_TAG
from media_usage_orchestration.processing.deletion import processor as processing
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.reconciliation.driver import run_to_completion
from media_usage_orchestration.processing.reconciliation.model import ReconciliationOutcome
from media_usage_orchestration.processing.work.processor import process_due_batch
from media_usage_orchestration.sensors.deletion import media_usage_collection_deletion_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV
from media_usage_orchestration.store.deletion.records import DeletionPhase
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from tests.support.deletion_runs import (
    COLLECTION_ID_TAG,
    DELETION_JOB,
    FAILED_CODE,
    OUTCOME_TAG,
    RECONSTRUCTABLE_DELETION_JOB,
    deletion_run_config,
    execute_requested,
    leftovers,
    mentioning,
    outcome_of,
    run_request_job,
    source_keys_of,
    step_outcomes,
    table_exists,
    tick,
)
from tests.support.deletion_runs import (
    everything as support_everything,
)
from tests.support.deletions import expire_lease, set_tombstone, tombstone
from tests.support.sensor_loop import drain, resources
from tests.support.states import IMAGE_ONLY, backdate, count, one, snapshot, status_row

MAX_TICKS = 10
COLLECTION_TAG = "media_usage/collection"


def everything(db, *content_slugs):
    return support_everything(db, *content_slugs, fields=MEDIA_FIELDS)


def drain_deletions(db, instance):
    """Tick the sensor and execute what it asks for until it asks for nothing."""
    sensor = media_usage_collection_deletion_sensor
    drained = drain(instance, resources(db), [sensor], max_rounds=MAX_TICKS)
    return (
        drained.of(sensor),
        drained.run_keys.get(sensor.name, []),
        drained.skip_messages[sensor.name],
    )


# --- end to end ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_forced_deletion_runs_to_the_end_and_the_slug_can_be_reused(activated, instance):
    db = activated
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", MEDIA_FIELDS)
    cms.insert_entries("posts", sample_entries("posts", 300))
    pages = cms.create_collection("pages", MEDIA_FIELDS)
    cms.insert_entries("pages", sample_entries("pages", 20))
    for _ in range(3):  # half of the posts projected, half still pending work
        assert process_due_batch(db.engine, 50, collection_id=posts.id).counts.completed == 50
    assert run_to_completion(db.engine, pages.id) is ReconciliationOutcome.COMPLETED
    # a reconciliation of posts under way: its coordinator row must go too
    assert run_to_completion(db.engine, posts.id, max_steps=1) is ReconciliationOutcome.ADVANCED
    assert count(db.engine, schema.reconciliations, collection_id=posts.id) == 1
    posts_keys = source_keys_of(db.engine, posts.id)
    posts_occurrences = sum(count(db.engine, schema.occurrences, source_key=k) for k in posts_keys)
    assert len(posts_keys) == 150 and posts_occurrences > 150
    before = everything(db, "pages")
    assert verify_index(db.engine, ["pages"]).differences == ()

    requested = run_request_job(db, instance, "posts", force=True)
    assert requested.success

    # a work run in between: the detached collection's jobs are acknowledged, never projected
    interleaved = process_due_batch(db.engine, 50)
    assert (interleaved.counts.claimed, interleaved.counts.obsolete) == (50, 50)
    assert source_keys_of(db.engine, posts.id) == posts_keys
    posts_work = count(db.engine, schema.work, collection_id=posts.id)
    assert posts_work >= 100

    runs, keys, skip = drain_deletions(db, instance)

    assert len(runs) == 1 and len(keys) == 1
    [run] = runs
    assert step_outcomes(run) == {
        "claim_deletion": "claimed",
        "fence": "already_past",
        "remove_registry": "already_past",
        "drop_table": "already_past",
        "delete_work": "advanced",
        "delete_sources": "advanced",
        "delete_status": "advanced",
        "finalize_deletion": "finalized",
    }
    assert outcome_of(run, "delete_work")["rows_deleted"] == posts_work
    assert outcome_of(run, "delete_sources")["rows_deleted"] == posts_occurrences
    assert instance.get_run_by_id(run.run_id).tags[OUTCOME_TAG] == "finalized"
    assert "no due collection-deletion tombstones" in skip
    assert leftovers(db.engine, posts.id, "posts", posts_keys) == {}
    assert not table_exists(db.engine, "ec_posts")
    after = everything(db, "pages")
    assert mentioning(after, pages.id) == mentioning(before, pages.id)
    assert after["ec_pages"] == before["ec_pages"]
    report = verify_index(db.engine)
    assert report.differences == ()
    assert [c.collection_slug for c in report.collections] == ["pages"]
    assert report.pending_work_count == 0

    again = cms.create_collection("posts", MEDIA_FIELDS)
    cms.insert_entries("posts", sample_entries("again", 40))

    assert again.id != posts.id
    assert run_to_completion(db.engine, again.id) is ReconciliationOutcome.COMPLETED
    status = status_row(db.engine, "posts")
    assert (status["collection_id"], status["status"]) == (again.id, "complete")
    assert status["reconciliation_required"] == 0
    report = verify_index(db.engine)
    assert report.differences == ()
    assert [c.collection_slug for c in report.collections] == ["pages", "posts"]
    assert report.pending_work_count == 0
    assert len(source_keys_of(db.engine, again.id)) == 40
    assert mentioning(everything(db, "posts", "pages"), posts.id) == {
        name: [] for name in everything(db, "posts", "pages")
    }
    assert tick(db, instance).run_requests == []


# --- the sensor ---------------------------------------------------------------------------------


def _queued_origin() -> RemoteJobOrigin:
    """A code-location origin: Dagster only stores a QUEUED run that has one."""
    location = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="media_usage_orchestration.definitions", attribute="defs"),
        location_name="media_usage_orchestration",
    )
    return RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), DELETION_JOB.name)


def in_flight_run(instance, collection_id, status, job_name=DELETION_JOB.name):
    return instance.add_run(
        dg.DagsterRun(
            job_name=job_name,
            status=status,
            tags={COLLECTION_ID_TAG: collection_id},
            remote_job_origin=_queued_origin() if status is dg.DagsterRunStatus.QUEUED else None,
        )
    )


@pytest.mark.parametrize("status", [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTED])
def test_no_duplicate_run_while_one_for_the_tombstone_is_in_flight(activated, instance, status):
    cms = CmsWriter(activated.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    pages = cms.create_collection("pages", IMAGE_ONLY)
    tombstone(activated.engine, posts, DeletionPhase.WORK, force=True)
    tombstone(activated.engine, pages, DeletionPhase.WORK, force=True)
    before = snapshot(activated.engine)

    flying = in_flight_run(instance, posts.id, status)
    # neither a run of another job nor a finished run holds a tombstone back
    in_flight_run(instance, pages.id, dg.DagsterRunStatus.STARTED, job_name="media_usage_work")
    in_flight_run(instance, pages.id, dg.DagsterRunStatus.FAILURE)

    data = tick(activated, instance)

    [request] = data.run_requests
    assert request.tags[COLLECTION_ID_TAG] == pages.id
    assert request.tags[COLLECTION_TAG] == "pages"
    assert request.run_config == deletion_run_config(pages.id)

    in_flight_run(instance, pages.id, dg.DagsterRunStatus.STARTED)
    data = tick(activated, instance)
    assert data.run_requests == []
    assert "without a run in flight" in data.skip_message

    instance.report_run_failed(instance.get_run_by_id(flying.run_id))
    [request] = tick(activated, instance).run_requests
    assert request.tags[COLLECTION_ID_TAG] == posts.id
    assert snapshot(activated.engine) == before  # the sensor only reads


def test_the_run_key_changes_with_each_due_generation(activated, instance):
    engine = activated.engine
    posts = CmsWriter(engine).create_collection("posts", IMAGE_ONLY)
    tombstone(engine, posts, DeletionPhase.WORK, force=True)

    def key():
        data = tick(activated, instance)
        if not data.run_requests:
            return None
        [request] = data.run_requests
        assert request.run_key.startswith(f"delete:{posts.id}:")
        return request.run_key

    pending = key()
    assert key() == pending, "an unchanged due row must keep its key (dedup)"

    claim = processing.claim_due_deletion(engine, posts.id)
    assert key() is None  # live lease: not due
    assert processing.release_deletion_lease(engine, claim)
    handed_back = key()

    processing.claim_due_deletion(engine, posts.id)
    expire_lease(engine, posts.id)
    lease_expired = key()

    claim = processing.claim_due_deletion(engine, posts.id)
    assert processing.record_phase_failure(engine, claim).value == "retry"
    assert key() is None  # backing off
    backdate(engine, schema.collection_deletions, "next_attempt_at", 1, collection_id=posts.id)
    retry_due = key()

    set_tombstone(engine, posts.id, state="failed", last_error_code=FAILED_CODE)
    assert key() is None  # terminal: only an operator reopens it
    assert DeletionRepository(engine).retry_operator_deletion(posts.id).changed
    reopened = key()

    generations = [pending, handed_back, lease_expired, retry_due, reopened]
    assert None not in generations
    assert len(set(generations)) == len(generations)


@pytest.mark.parametrize("ending", [dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.FAILURE])
def test_a_run_that_ended_without_touching_the_tombstone_does_not_strand_it(
    activated, instance, ending
):
    """The daemon never launches a run key it has seen, whatever that run's status. A run
    canceled while queued, or failed before its claim, leaves the tombstone as it was: the
    next request must carry a new key, or the deletion would never be asked for again."""
    posts = CmsWriter(activated.engine).create_collection("posts", IMAGE_ONLY)
    assert run_request_job(activated, instance, "posts").success
    [first] = tick(activated, instance).run_requests
    ended = in_flight_run(instance, posts.id, dg.DagsterRunStatus.STARTED)
    instance.add_run_tags(ended.run_id, {RUN_KEY_TAG: first.run_key})
    if ending is dg.DagsterRunStatus.CANCELED:
        instance.report_run_canceled(instance.get_run_by_id(ended.run_id))
    else:
        instance.report_run_failed(instance.get_run_by_id(ended.run_id))
    assert instance.get_run_by_id(ended.run_id).status is ending

    [second] = tick(activated, instance).run_requests

    assert second.run_key != first.run_key
    assert second.run_config == first.run_config
    assert tick(activated, instance).run_requests[0].run_key == second.run_key  # stable again
    result = execute_requested(activated, instance, second)
    assert step_outcomes(result)["finalize_deletion"] == "finalized"
    assert leftovers(activated.engine, posts.id, "posts") == {}


# --- an operator's re-execution from failure ----------------------------------------------------


def test_reexecuting_a_failed_deletion_run_from_failure_reopens_and_finishes(
    activated, instance, monkeypatch
):
    cms = CmsWriter(activated.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    cms.insert_entries("posts", [{"id": f"post-{i}", "title": "x", "hero": None} for i in range(3)])
    assert run_request_job(activated, instance, "posts", force=True).success
    real_delete_status = DeletionRepository.delete_status

    def broken(self, lease):
        raise RuntimeError("status table briefly unwritable")

    monkeypatch.setattr(DeletionRepository, "delete_status", broken)
    # The database comes from the environment only (it is no run-config field).
    monkeypatch.setenv(DATABASE_URL_ENV, activated.url)
    run_config = deletion_run_config(posts.id)
    with dg.execute_job(
        RECONSTRUCTABLE_DELETION_JOB, instance=instance, run_config=run_config
    ) as first:
        assert not first.success
        failed_run_id = first.run_id
    row = one(activated.engine, schema.collection_deletions, collection_id=posts.id)
    assert (row["state"], row["phase"], row["attempt_count"]) == ("retry", "status", 1)
    assert row["last_error_code"] == FAILED_CODE
    assert instance.get_run_by_id(failed_run_id).tags[OUTCOME_TAG] == "retry"
    assert tick(activated, instance).run_requests == []  # backing off: the sensor waits

    monkeypatch.setattr(DeletionRepository, "delete_status", real_delete_status)
    options = dg.ReexecutionOptions.from_failure(failed_run_id, instance)
    with dg.execute_job(
        RECONSTRUCTABLE_DELETION_JOB, instance=instance, reexecution_options=options
    ) as second:
        assert second.success
        executed = {
            event.step_key for event in second.all_events if event.event_type_value == "STEP_START"
        }
        second_run_id = second.run_id

    assert executed == {"delete_status", "finalize_deletion"}
    run = instance.get_run_by_id(second_run_id)
    assert run.parent_run_id == failed_run_id
    assert run.tags[OUTCOME_TAG] == "finalized"
    assert leftovers(activated.engine, posts.id, "posts") == {}
