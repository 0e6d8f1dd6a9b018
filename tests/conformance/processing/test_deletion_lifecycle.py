"""Deleting a collection through the request path (upstream
`media-usage-collection-deletion-lifecycle.test.ts`): an activated collection is fenced and
detached at once and cleaned up in the background under a tombstone that holds its slug; a
collection with content is refused without force; a collection whose capture was never
activated is removed synchronously."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.processing.deletion.processor import (
    DeletionTickOutcome,
    FrontPhaseOutcome,
    RequestOutcome,
    RequestResult,
    delete_activated_collection,
    process_due_deletions,
    request_collection_deletion,
)
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.capture_triggers import (
    CaptureIdentity,
    list_owned_triggers,
    remove_capture_triggers,
)
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from media_usage_orchestration.values.errors import (
    CmsError,
    CollectionHasContentError,
    CollectionNotFoundError,
    DeletionConflictError,
    DeletionIdentityConflict,
    DeletionNotReady,
)
from tests.support.deletions import (
    add_source,
    expire_lease,
    ids,
    set_tombstone,
    table_exists,
    tombstone_row,
)
from tests.support.factories import FUTURE, PAST, insert_deletion, insert_registry, of
from tests.support.states import (
    IMAGE_ONLY,
    all_rows,
    count,
    one,
    set_activation,
    set_status,
    snapshot,
)
from tests.support.triggers import Abort, create_trigger, drop_trigger

MAX_TICKS = 50


@pytest.fixture
def cms(db):
    return CmsWriter(db.engine)


# --- helpers ----------------------------------------------------------------------------------


def registry_ids(db, slug):
    return [row["id"] for row in all_rows(db.engine, schema.collections, slug=slug)]


def capture_state(db, collection_id):
    row = one(db.engine, schema.index_status, collection_id=collection_id)
    return row and row["capture_state"]


def content_rows(db, slug):
    with db.engine.connect() as connection:
        return connection.exec_driver_sql(f'SELECT id FROM "ec_{slug}" ORDER BY id').all()


def drain(db):
    """Run background ticks until nothing is due; every tick must make progress."""
    outcomes = []
    for _ in range(MAX_TICKS):
        result = process_due_deletions(db.engine)
        if result.outcome is DeletionTickOutcome.IDLE:
            return outcomes
        outcomes.append(result.outcome)
        assert result.outcome in (DeletionTickOutcome.PROGRESS, DeletionTickOutcome.FINALIZED)
    raise AssertionError("deletion did not drain")


def insert_leased_tombstone(db, collection, phase, lease_expires_at):
    insert_deletion(
        db.engine,
        **of(collection),
        force_delete=1,
        phase=phase,
        state="leased",
        lease_token="other-owner",
        lease_expires_at=lease_expires_at,
    )


def remove_registry_row(db, collection):
    with db.engine.begin() as connection:
        connection.execute(
            schema.fields.delete().where(schema.fields.c.collection_id == collection.id)
        )
        connection.execute(
            schema.collections.delete().where(schema.collections.c.id == collection.id)
        )


def refuse_registry_deletes(db):
    """Make any registry delete fail, as a crash in the registry phase would."""
    create_trigger(
        db.engine,
        "refuse_registry_delete",
        table="_emdash_collections",
        event="BEFORE DELETE",
        action=Abort("registry delete refused"),
    )


def allow_registry_deletes(db):
    drop_trigger(db.engine, "refuse_registry_delete", "_emdash_collections")


# --- activated collections --------------------------------------------------------------------


def test_an_empty_collection_is_detached_synchronously(activated, cms):
    db = activated
    collection = cms.create_collection("articles", IMAGE_ONLY)

    result = request_collection_deletion(db.engine, "articles", force=False)

    assert result == RequestResult(RequestOutcome.DETACHED, "articles", collection.id)
    assert registry_ids(db, "articles") == []
    assert count(db.engine, schema.fields, collection_id=collection.id) == 0
    assert not table_exists(db.engine, "ec_articles")
    assert capture_state(db, collection.id) == "deleting"
    row = tombstone_row(db.engine, collection.id)
    assert (row["collection_slug"], row["state"], row["phase"], row["lease_token"]) == (
        "articles",
        "pending",
        "work",
        None,
    )


def test_collection_not_found_is_preserved(db):
    with pytest.raises(CollectionNotFoundError) as before_activation:
        request_collection_deletion(db.engine, "missing", force=False)
    activate(db.engine)
    with pytest.raises(CollectionNotFoundError) as after_activation:
        request_collection_deletion(db.engine, "missing", force=True)

    assert before_activation.value.code == after_activation.value.code == "COLLECTION_NOT_FOUND"
    assert delete_activated_collection(db.engine, "missing", force_delete=True) is (
        FrontPhaseOutcome.NOT_FOUND
    )
    assert count(db.engine, schema.collection_deletions) == 0


def test_a_live_front_phase_lease_is_a_conflict(activated, cms):
    db = activated
    collection = cms.create_collection("leased", IMAGE_ONLY)
    insert_leased_tombstone(db, collection, "fence", FUTURE)
    before = snapshot(db.engine)

    with pytest.raises(DeletionConflictError) as error:
        request_collection_deletion(db.engine, "leased", force=True)
    outcome = delete_activated_collection(
        db.engine, "leased", collection_id=collection.id, force_delete=True
    )

    assert error.value.code == "CONFLICT"
    assert outcome is FrontPhaseOutcome.IN_PROGRESS
    assert snapshot(db.engine) == before


def test_a_non_empty_collection_without_force_is_refused_and_nothing_changes(activated, cms):
    db = activated
    collection = cms.create_collection("occupied", IMAGE_ONLY)
    cms.insert_entry("occupied", {"id": "entry-1", "title": "kept"})
    before = snapshot(db.engine)

    with pytest.raises(CollectionHasContentError, match="has content") as error:
        request_collection_deletion(db.engine, "occupied", force=False)

    assert error.value.code == "COLLECTION_HAS_CONTENT"
    assert snapshot(db.engine) == before
    assert registry_ids(db, "occupied") == [collection.id]
    assert [row.id for row in content_rows(db, "occupied")] == ["entry-1"]
    assert capture_state(db, collection.id) == "active"
    assert count(db.engine, schema.collection_deletions) == 0


def test_content_found_by_the_fence_cancels_the_tombstone(activated, cms):
    db = activated
    collection = cms.create_collection("raced", IMAGE_ONLY)
    cms.insert_entry("raced", {"id": "entry-1", "title": "arrived late"})
    before = snapshot(db.engine)

    outcome = delete_activated_collection(
        db.engine, "raced", collection_id=collection.id, force_delete=False
    )

    assert outcome is FrontPhaseOutcome.HAS_CONTENT
    assert snapshot(db.engine) == before
    assert table_exists(db.engine, "ec_raced")


def test_only_trashed_rows_can_be_deleted_without_force(activated, cms):
    db = activated
    cms.create_collection("trashed", IMAGE_ONLY)
    entry = cms.insert_entry("trashed", {"title": "gone"})
    cms.trash_entry("trashed", entry)

    result = request_collection_deletion(db.engine, "trashed", force=False)

    assert result.outcome is RequestOutcome.DETACHED
    assert registry_ids(db, "trashed") == []
    assert not table_exists(db.engine, "ec_trashed")


def test_force_deletes_a_non_empty_collection_and_the_background_finishes(activated, cms):
    db = activated
    collection = cms.create_collection("forced", IMAGE_ONLY)
    cms.insert_entries("forced", [{"title": f"entry {index}"} for index in range(3)])
    add_source(
        db.engine,
        f"content:v1:{collection.id}:entry:columns",
        collection_id=collection.id,
        collection_slug="forced",
        occurrence_ids=ids("usage", 2),
    )
    assert count(db.engine, schema.work, collection_id=collection.id) == 3

    result = request_collection_deletion(db.engine, "forced", force=True)

    assert result.outcome is RequestOutcome.DETACHED
    assert registry_ids(db, "forced") == []
    assert not table_exists(db.engine, "ec_forced")
    row = tombstone_row(db.engine, collection.id)
    assert (row["force_delete"], row["phase"]) == (1, "work")

    assert drain(db)[-1] is DeletionTickOutcome.FINALIZED
    assert tombstone_row(db.engine, collection.id) is None
    assert count(db.engine, schema.work, collection_id=collection.id) == 0
    assert count(db.engine, schema.sources, collection_id=collection.id) == 0
    assert count(db.engine, schema.occurrences) == 0
    assert count(db.engine, schema.index_status, collection_id=collection.id) == 0


def test_missing_capture_triggers_fail_closed_before_a_tombstone(activated, cms):
    db = activated
    collection = cms.create_collection("unfenced", IMAGE_ONLY)
    identity = CaptureIdentity(collection.id, collection.slug)
    set_status(db.engine, "unfenced", capture_state="deleting")
    with db.engine.begin() as connection:
        remove_capture_triggers(connection, identity)
    set_status(db.engine, "unfenced", capture_state="active")
    before = snapshot(db.engine)

    with pytest.raises(DeletionNotReady, match="capture trigger"):
        request_collection_deletion(db.engine, "unfenced", force=True)

    assert snapshot(db.engine) == before
    assert registry_ids(db, "unfenced") == [collection.id]
    assert table_exists(db.engine, "ec_unfenced")
    assert count(db.engine, schema.collection_deletions) == 0


def test_capture_that_is_not_active_fails_closed_before_a_tombstone(activated, cms):
    db = activated
    collection = cms.create_collection("installing", IMAGE_ONLY)
    set_status(db.engine, "installing", capture_state="installing")

    with pytest.raises(DeletionNotReady, match="active capture lifecycle"):
        request_collection_deletion(db.engine, "installing", force=True)

    assert registry_ids(db, "installing") == [collection.id]
    assert count(db.engine, schema.collection_deletions) == 0


def test_deletion_waits_for_activation_to_finish(db, cms):
    collection = cms.create_collection("waiting", IMAGE_ONLY)
    set_activation(db.engine, "activating")

    with pytest.raises(DeletionNotReady, match="activation must be active"):
        request_collection_deletion(db.engine, "waiting", force=True)

    assert registry_ids(db, "waiting") == [collection.id]
    assert table_exists(db.engine, "ec_waiting")
    assert count(db.engine, schema.collection_deletions) == 0


def test_the_slug_is_held_until_cleanup_finalizes(activated, cms):
    db = activated
    cms.create_collection("reserved", IMAGE_ONLY)
    request_collection_deletion(db.engine, "reserved", force=True)

    with pytest.raises(CmsError) as held:
        cms.create_collection("reserved", IMAGE_ONLY)
    assert held.value.code == "COLLECTION_EXISTS"
    assert one(db.engine, schema.collection_deletions, collection_slug="reserved") is not None

    drain(db)
    replacement = cms.create_collection("reserved", IMAGE_ONLY)

    assert registry_ids(db, "reserved") == [replacement.id]
    assert capture_state(db, replacement.id) == "active"
    with db.engine.connect() as connection:
        assert len(list_owned_triggers(connection, "ec_reserved")) == 3


@pytest.mark.parametrize("activation_state", ["expanded", "active"])
def test_the_slug_lock_is_rechecked_after_the_registry_read(db, cms, activation_state):
    if activation_state == "active":
        activate(db.engine)
    raced = {"inserted": False}

    def insert_tombstone_after_first_lock_check(
        _connection, cursor, statement, _parameters, _context, _executemany
    ):
        if raced["inserted"] or not statement.lstrip().upper().startswith("SELECT"):
            return
        if "_emdash_media_usage_collection_deletions" not in statement:
            return
        raced["inserted"] = True
        # Same connection, same transaction: the row appears between the two checks.
        cursor.connection.cursor().execute(
            "INSERT INTO _emdash_media_usage_collection_deletions "
            "(collection_id, collection_slug, force_delete, state, phase, next_attempt_at) "
            f"VALUES ('old-collection', 'raced', 1, 'pending', 'work', '{PAST}')"
        )

    event.listen(db.engine, "after_cursor_execute", insert_tombstone_after_first_lock_check)
    try:
        with pytest.raises(CmsError) as refused:
            cms.create_collection("raced", IMAGE_ONLY)
    finally:
        event.remove(db.engine, "after_cursor_execute", insert_tombstone_after_first_lock_check)

    assert raced["inserted"]
    assert refused.value.code == "COLLECTION_EXISTS"
    assert registry_ids(db, "raced") == []
    assert not table_exists(db.engine, "ec_raced")


def test_a_replacement_identity_is_an_identity_conflict(activated, cms):
    db = activated
    deleted = cms.create_collection("conflicted", IMAGE_ONLY)
    request_collection_deletion(db.engine, "conflicted", force=True)
    insert_registry(db.engine, id="replacement-id", slug="conflicted", label="Replacement")

    with pytest.raises(DeletionIdentityConflict, match="identity conflict"):
        request_collection_deletion(db.engine, "conflicted", force=True)

    assert registry_ids(db, "conflicted") == ["replacement-id"]
    row = one(db.engine, schema.collection_deletions, collection_slug="conflicted")
    assert row["collection_id"] == deleted.id


# --- resuming interrupted front phases --------------------------------------------------------


def test_resumes_after_the_fence_committed_before_its_checkpoint(activated, cms):
    db = activated
    collection = cms.create_collection("resuming", IMAGE_ONLY)
    set_status(db.engine, "resuming", capture_state="deleting")
    insert_leased_tombstone(db, collection, "fence", PAST)

    result = request_collection_deletion(db.engine, "resuming", force=True)

    assert result.outcome is RequestOutcome.DETACHED
    assert registry_ids(db, "resuming") == []
    assert not table_exists(db.engine, "ec_resuming")
    row = tombstone_row(db.engine, collection.id)
    assert (row["state"], row["phase"]) == ("pending", "work")


@pytest.mark.parametrize("phase", ["registry", "table"])
def test_resumes_after_registry_or_table_removal_committed_before_its_checkpoint(
    activated, cms, phase
):
    db = activated
    slug = f"resume_{phase}"
    collection = cms.create_collection(slug, IMAGE_ONLY)
    set_status(db.engine, slug, capture_state="deleting")
    insert_leased_tombstone(db, collection, phase, PAST)
    remove_registry_row(db, collection)
    if phase == "table":
        with db.engine.begin() as connection:
            connection.exec_driver_sql(f'DROP TABLE "ec_{slug}"')

    first = request_collection_deletion(db.engine, slug, force=True)
    second = request_collection_deletion(db.engine, slug, force=True)

    assert first == second == RequestResult(RequestOutcome.DETACHED, slug, collection.id)
    assert not table_exists(db.engine, f"ec_{slug}")
    row = tombstone_row(db.engine, collection.id)
    assert (row["state"], row["phase"]) == ("pending", "work")


def test_a_request_path_failure_leaves_the_lease_held_for_the_background(activated, cms):
    db = activated
    collection = cms.create_collection("crashed", IMAGE_ONLY)
    refuse_registry_deletes(db)

    with pytest.raises(Exception, match="registry delete refused"):
        request_collection_deletion(db.engine, "crashed", force=True)

    row = tombstone_row(db.engine, collection.id)
    assert (row["state"], row["phase"], row["attempt_count"], row["last_error_code"]) == (
        "leased",
        "registry",
        0,
        None,
    )
    assert process_due_deletions(db.engine).outcome is DeletionTickOutcome.IDLE
    with pytest.raises(DeletionConflictError):
        request_collection_deletion(db.engine, "crashed", force=True)

    allow_registry_deletes(db)
    expire_lease(db.engine, collection.id)
    assert process_due_deletions(db.engine).outcome is DeletionTickOutcome.PROGRESS
    assert registry_ids(db, "crashed") == []
    assert tombstone_row(db.engine, collection.id)["phase"] == "table"
    assert drain(db)[-1] is DeletionTickOutcome.FINALIZED


def test_the_tombstone_and_fence_are_persisted_before_registry_and_table_removal(activated, cms):
    db = activated
    collection = cms.create_collection("ordered", IMAGE_ONLY)
    table_exists_sql = (
        "to_regclass('ec_ordered') IS NOT NULL"
        if db.is_postgres
        else "EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ec_ordered')"
    )
    create_trigger(
        db.engine,
        "assert_collection_deletion_order",
        table="_emdash_collections",
        event="BEFORE DELETE",
        when=f"""OLD.id = '{collection.id}' AND (
            NOT EXISTS (
                SELECT 1 FROM _emdash_media_usage_collection_deletions
                WHERE collection_id = OLD.id AND collection_slug = OLD.slug
                    AND state = 'leased' AND phase = 'registry'
            )
            OR NOT EXISTS (
                SELECT 1 FROM _emdash_media_usage_index_status
                WHERE collection_id = OLD.id AND capture_state = 'deleting'
            )
            OR NOT ({table_exists_sql})
        )""",
        action=Abort("collection deletion order violated"),
    )

    request_collection_deletion(db.engine, "ordered", force=True)

    assert registry_ids(db, "ordered") == []
    assert not table_exists(db.engine, "ec_ordered")


# --- capture never activated: the legacy synchronous delete -----------------------------------


def test_legacy_delete_removes_everything_in_one_transaction(db, cms):
    collection = cms.create_collection("legacy", IMAGE_ONLY)
    other = cms.create_collection("other", IMAGE_ONLY)
    cms.insert_entry("legacy", {"title": "old"})
    add_source(
        db.engine,
        "legacy-source",
        collection_id=None,
        collection_slug="legacy",
        identity_version=None,
        occurrence_ids=ids("legacy-usage", 3),
    )
    add_source(
        db.engine,
        "canonical-source",
        collection_id=collection.id,
        collection_slug="legacy",
        occurrence_ids=ids("canonical-usage", 2),
    )
    add_source(
        db.engine,
        "other-source",
        collection_id=other.id,
        collection_slug="other",
        occurrence_ids=ids("other-usage", 2),
    )
    if not db.is_postgres:
        with db.engine.begin() as connection:
            connection.exec_driver_sql('CREATE TABLE "_emdash_fts_legacy" (id TEXT)')
            connection.exec_driver_sql(
                'CREATE TRIGGER "_emdash_fts_legacy_insert" AFTER INSERT ON "ec_legacy" '
                "BEGIN SELECT 1; END"
            )

    result = request_collection_deletion(db.engine, "legacy", force=True)

    assert result == RequestResult(RequestOutcome.DELETED, "legacy", collection.id)
    assert registry_ids(db, "legacy") == []
    assert count(db.engine, schema.fields, collection_id=collection.id) == 0
    assert not table_exists(db.engine, "ec_legacy")
    assert not table_exists(db.engine, "_emdash_fts_legacy")
    assert count(db.engine, schema.sources, collection_slug="legacy") == 0
    assert count(db.engine, schema.occurrences) == 2
    assert count(db.engine, schema.sources, source_key="other-source") == 1
    assert one(db.engine, schema.index_status, scope_key="legacy") is None
    assert one(db.engine, schema.index_status, scope_key="other") is not None
    assert registry_ids(db, "other") == [other.id]
    assert count(db.engine, schema.collection_deletions) == 0


def test_legacy_delete_refuses_content_without_force(db, cms):
    cms.create_collection("legacy", IMAGE_ONLY)
    cms.insert_entry("legacy", {"title": "kept"})
    before = snapshot(db.engine)

    with pytest.raises(CollectionHasContentError):
        request_collection_deletion(db.engine, "legacy", force=False)

    assert snapshot(db.engine) == before
    assert table_exists(db.engine, "ec_legacy")


def test_legacy_path_reports_inactive_to_the_front_phase_call(db, cms):
    collection = cms.create_collection("legacy", IMAGE_ONLY)

    outcome = delete_activated_collection(
        db.engine, "legacy", collection_id=collection.id, force_delete=True
    )

    assert outcome is FrontPhaseOutcome.INACTIVE
    assert count(db.engine, schema.collection_deletions) == 0
    assert table_exists(db.engine, "ec_legacy")


def test_a_failed_tombstone_keeps_the_slug_and_resumes_after_an_operator_retry(activated, cms):
    db = activated
    collection = cms.create_collection("stuck", IMAGE_ONLY)
    request_collection_deletion(db.engine, "stuck", force=True)
    set_tombstone(db.engine, collection.id, state="failed", attempt_count=5)

    assert process_due_deletions(db.engine).outcome is DeletionTickOutcome.IDLE
    assert request_collection_deletion(db.engine, "stuck", force=True).outcome is (
        RequestOutcome.DETACHED
    )
    with pytest.raises(CmsError):
        cms.create_collection("stuck", IMAGE_ONLY)

    assert DeletionRepository(db.engine).retry_operator_deletion(collection.id).changed
    assert drain(db)[-1] is DeletionTickOutcome.FINALIZED
    replacement = cms.create_collection("stuck", IMAGE_ONLY)
    assert registry_ids(db, "stuck") == [replacement.id]
