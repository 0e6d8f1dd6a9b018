"""The operator's `request_collection_deletion` job (Launchpad), executed in process on both
dialects with typed, validated config: each outcome is reported in the step's metadata, a
refused deletion fails the run with a clear message and changes nothing at all."""

import dagster as dg
import pytest

from media_usage_orchestration.dagster_kit.run_tags import OUTCOME_TAG
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.deletion.records import DeletionPhase
from tests.support.deletion_runs import (
    REQUEST_JOB,
    failure_of,
    leftovers,
    mentioning,
    request_config,
    run_request_job,
    table_exists,
)
from tests.support.deletion_runs import (
    everything as support_everything,
)
from tests.support.deletions import add_source, claimed, ids
from tests.support.sensor_loop import plain
from tests.support.states import IMAGE_ONLY, count, one


def entries(total, prefix="post"):
    return [{"id": f"{prefix}-{i}", "title": f"entry {i}", "hero": None} for i in range(total)]


def everything(db, *slugs):
    return support_everything(db, *slugs, fields=IMAGE_ONLY)


def reported(result: dg.ExecuteInProcessResult) -> dict:
    """The request step's metadata."""
    for event in result.events_for_node("request_deletion"):
        if event.is_successful_output:
            return plain(event.step_output_data.metadata)
    raise AssertionError("request_deletion emitted no output")


def failure(result: dg.ExecuteInProcessResult):
    assert not result.success
    data = failure_of(result, "request_deletion")
    return data.description, plain(data.metadata)


def captured(db, slug="posts", total=0):
    cms = CmsWriter(db.engine)
    collection = cms.create_collection(slug, IMAGE_ONLY)
    cms.insert_entries(slug, entries(total, slug))
    return collection


# --- config ------------------------------------------------------------------------------------


def test_the_request_config_is_typed():
    resolved = dg.validate_run_config(REQUEST_JOB, request_config("posts"))
    assert resolved["ops"]["request_deletion"]["config"] == {"collection": "posts", "force": False}

    for bad in (
        {},
        {"force": True},
        {"collection": "posts", "force": "yes"},
        {"collection": "posts", "purge": True},
        {"collection": 7},
    ):
        with pytest.raises(dg.DagsterInvalidConfigError):
            dg.validate_run_config(REQUEST_JOB, {"ops": {"request_deletion": {"config": bad}}})


# --- outcomes ----------------------------------------------------------------------------------


def test_force_detaches_a_non_empty_activated_collection(activated, instance):
    posts = captured(activated, total=5)
    pages = captured(activated, "pages", total=2)
    pages_before = everything(activated, "pages")

    result = run_request_job(activated, instance, "posts", force=True)

    assert result.success
    metadata = reported(result)
    assert (metadata["outcome"], metadata["collection"]) == ("deleted", "posts")
    assert "background" in metadata["detail"]
    row = one(activated.engine, schema.collection_deletions, collection_id=posts.id)
    assert (row["state"], row["phase"], row["force_delete"]) == ("pending", "work", 1)
    assert row["lease_token"] is None
    assert count(activated.engine, schema.collections, id=posts.id) == 0
    assert count(activated.engine, schema.fields, collection_id=posts.id) == 0
    assert not table_exists(activated.engine, "ec_posts")
    status = one(activated.engine, schema.index_status, collection_id=posts.id)
    assert status["capture_state"] == "deleting"
    # the five work rows the capture trigger wrote are left to the background job
    assert count(activated.engine, schema.work, collection_id=posts.id) == 5
    assert mentioning(everything(activated, "pages"), pages.id) == mentioning(
        pages_before, pages.id
    )
    assert everything(activated, "pages")["ec_pages"] == pages_before["ec_pages"]
    assert count(activated.engine, schema.work, collection_id=pages.id) == 2


def test_a_repeated_request_reports_deleted_and_changes_nothing(activated, instance):
    captured(activated, total=1)
    assert run_request_job(activated, instance, "posts", force=True).success
    before = everything(activated)

    result = run_request_job(activated, instance, "posts", force=True)

    assert result.success and reported(result)["outcome"] == "deleted"
    assert everything(activated) == before


def test_a_request_while_another_owner_holds_the_tombstone_reports_in_progress(activated, instance):
    posts = captured(activated)
    claimed(activated.engine, posts, DeletionPhase.REGISTRY, force=True)
    before = everything(activated, "posts")

    result = run_request_job(activated, instance, "posts", force=True)

    assert result.success
    assert reported(result)["outcome"] == "in_progress"
    assert everything(activated, "posts") == before


def test_before_activation_the_collection_is_deleted_synchronously(db, instance):
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    cms.insert_entries("posts", entries(3))
    add_source(
        db.engine,
        "legacy-posts",
        collection_id=None,
        collection_slug="posts",
        identity_version=None,
        occurrence_ids=ids("legacy-usage", 2),
    )
    pages = cms.create_collection("pages", IMAGE_ONLY)
    cms.insert_entries("pages", entries(2, "pages"))
    pages_before = everything(db, "pages")

    result = run_request_job(db, instance, "posts", force=True)

    assert result.success
    metadata = reported(result)
    assert metadata["outcome"] == "inactive"
    assert "synchronously" in metadata["detail"]
    assert leftovers(db.engine, posts.id, "posts", ["legacy-posts"]) == {}
    assert count(db.engine, schema.collection_deletions) == 0
    after = everything(db, "pages")
    assert mentioning(after, pages.id) == mentioning(pages_before, pages.id)
    assert after["ec_pages"] == pages_before["ec_pages"]


@pytest.mark.parametrize("activation", ["active", "expanded"])
def test_a_missing_collection_fails_the_run_as_not_found(db, instance, activation):
    if activation == "active":
        activate(db.engine)
    before = everything(db)

    result = run_request_job(db, instance, "ghost", force=True)

    description, metadata = failure(result)
    assert "'ghost' does not exist" in description
    assert metadata == {"outcome": "not_found", "collection": "ghost"}
    assert everything(db) == before
    assert instance.get_run_by_id(result.run_id).tags[OUTCOME_TAG] == "not_found"


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["active", "expanded"])
def test_a_collection_with_content_is_refused_without_force_and_nothing_changes(
    db, instance, activation
):
    if activation == "active":
        activate(db.engine)
    posts = captured(db, total=2)
    CmsWriter(db.engine).trash_entry("posts", "posts-0")  # one live entry is enough
    before = everything(db, "posts")

    result = run_request_job(db, instance, "posts")

    description, metadata = failure(result)
    assert "'posts' still has entries; nothing was changed" in description
    assert "force: true" in description
    assert metadata == {"outcome": "has_content", "collection": "posts"}
    assert everything(db, "posts") == before
    assert count(db.engine, schema.collection_deletions) == 0
    assert one(db.engine, schema.collections, id=posts.id) is not None
    run = instance.get_run_by_id(result.run_id)
    assert run.status is dg.DagsterRunStatus.FAILURE
    assert run.tags[OUTCOME_TAG] == "has_content"


def test_a_refused_request_is_not_retried(activated, instance):
    captured(activated, total=1)

    result = run_request_job(activated, instance, "posts")

    assert not result.success
    attempts = [e for e in result.events_for_node("request_deletion") if e.is_step_start]
    assert len(attempts) == 1
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]


@pytest.mark.parametrize("activation", ["active", "expanded"])
def test_an_invalid_slug_fails_at_once_and_changes_nothing(db, instance, activation):
    if activation == "active":
        activate(db.engine)
    captured(db)
    before = everything(db, "posts")

    result = run_request_job(db, instance, "Posts; DROP TABLE ec_posts")

    description, _ = failure(result)
    assert "collection slug" in description
    assert instance.get_run_by_id(result.run_id).tags[OUTCOME_TAG] == "invalid_identifier"
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert everything(db, "posts") == before


@pytest.mark.parametrize("activation", ["active", "expanded"])
def test_a_collection_with_only_trashed_entries_is_deleted_without_force(db, instance, activation):
    if activation == "active":
        activate(db.engine)
    posts = captured(db, total=2)
    for entry_id in ("posts-0", "posts-1"):
        CmsWriter(db.engine).trash_entry("posts", entry_id)

    result = run_request_job(db, instance, "posts")

    assert result.success
    assert not table_exists(db.engine, "ec_posts")
    assert count(db.engine, schema.collections, id=posts.id) == 0
    run = instance.get_run_by_id(result.run_id)
    assert run.tags[OUTCOME_TAG] == reported(result)["outcome"]
    if activation == "active":
        assert reported(result)["outcome"] == "deleted"
        row = one(db.engine, schema.collection_deletions, collection_id=posts.id)
        assert (row["phase"], row["force_delete"]) == ("work", 0)
    else:
        assert reported(result)["outcome"] == "inactive"
        assert leftovers(db.engine, posts.id, "posts") == {}
