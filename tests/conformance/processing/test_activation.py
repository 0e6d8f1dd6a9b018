"""Capture activation on both dialects (`expanded -> activating -> active`, one collection per
lease-guarded step), the CMS write fence while it runs, and captured collection creation and
schema changes afterwards (spec 4.5, EmDash's activation suite)."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
from sqlalchemy import Engine, inspect, select, text, update

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, FieldSpec
from media_usage_orchestration.processing.activation.capture import (
    ActivationOutcome,
    ActivationResult,
    activate,
    activate_step,
)
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.capture_triggers import (
    CaptureIdentity,
    install_capture_triggers,
    list_owned_triggers,
    verify_capture_triggers,
)
from media_usage_orchestration.store.core.engine import create_database_engine
from media_usage_orchestration.store.core.schema import ACTIVATION_KEY
from media_usage_orchestration.store.host.activation import (
    claim_activation,
    finalize_activation,
    lease_is_live,
)
from media_usage_orchestration.values.errors import (
    ActivationError,
    ActivationGenerationError,
    CmsError,
    LifecycleConflictError,
)
from tests.fixtures import FIXTURE_DB
from tests.support.factories import insert_deletion, insert_registry, insert_status
from tests.support.states import (
    IMAGE_ONLY,
    NO_MEDIA,
    all_rows,
    backdate,
    count,
    db_now,
    one,
    set_activation,
    set_status,
    snapshot,
    status_row,
)
from tests.support.triggers import create_trigger

FAR_FUTURE = "2100-01-01T00:00:00.000Z"
STEAL_ACTIVATION_LEASE = (
    "UPDATE _emdash_media_usage_activation SET lease_token = 'new-owner', "
    f"lease_expires_at = '{FAR_FUTURE}' WHERE task_key = 'incremental_capture'"
)
ACTIVATING = ActivationOutcome.ACTIVATING
ACTIVE = ActivationOutcome.ACTIVE


# --- helpers ----------------------------------------------------------------------------------


def activation_row(engine: Engine) -> dict:
    return one(engine, schema.activation, task_key=ACTIVATION_KEY)


def captured(engine: Engine, collection_id: str, slug: str) -> bool:
    with engine.connect() as connection:
        return verify_capture_triggers(connection, CaptureIdentity(collection_id, slug))


def owned_triggers(engine: Engine, slug: str) -> list[str]:
    with engine.connect() as connection:
        return list_owned_triggers(connection, f"ec_{slug}")


def insert_entry(engine: Engine, slug: str, content_id: str) -> None:
    with engine.begin() as connection:
        connection.execute(
            text(f'INSERT INTO "ec_{slug}" (id, slug) VALUES (:id, :slug)'),
            {"id": content_id, "slug": content_id},
        )


def count_entries(engine: Engine, slug: str) -> int:
    with engine.connect() as connection:
        return connection.execute(text(f'SELECT COUNT(*) FROM "ec_{slug}"')).scalar_one()


def work_keys(engine: Engine) -> list[tuple[str, str]]:
    rows = all_rows(engine, schema.work)
    return sorted((row["collection_id"], row["content_id"]) for row in rows)


def lifecycle(engine: Engine, slug: str) -> dict:
    row = status_row(engine, slug)
    return {
        "status": row["status"],
        "collection_id": row["collection_id"],
        "capture_state": row["capture_state"],
        "reconciliation_required": row["reconciliation_required"],
        "cursor": row["cursor"],
    }


def insert_legacy_status(engine: Engine, slug: str, **values) -> None:
    """A status row as EmDash wrote it before capture existed: no identity, no lifecycle."""
    legacy = {"status": "complete", "updated_at": "2026-08-01T00:00:00.000Z"}
    insert_status(engine, scope_key=slug, **{**legacy, **values})


def delete_status(engine: Engine, slug: str) -> None:
    with engine.begin() as connection:
        connection.execute(
            schema.index_status.delete().where(schema.index_status.c.scope_key == slug)
        )


def register_collection_directly(engine: Engine, collection_id: str, slug: str) -> None:
    """A registry row and content table written behind the CMS writer's back."""
    insert_registry(engine, id=collection_id, slug=slug)
    with engine.begin() as connection:
        schema.create_content_table(connection, slug)


# --- activation steps -------------------------------------------------------------------------


def test_an_empty_installation_activates_and_is_then_an_idempotent_no_op(db):
    first = activate_step(db.engine)

    assert first == ActivationResult(ACTIVE, (), None)
    activated = activation_row(db.engine)
    assert activated["state"] == "active"
    assert activated["lease_token"] is None and activated["lease_expires_at"] is None
    assert activated["last_error_code"] is None
    assert activated["attempt_count"] == 1
    assert activated["activated_at"] is not None and activated["drain_confirmed_at"] is not None

    assert activate_step(db.engine) == ActivationResult(ACTIVE)
    assert activate(db.engine) == [ActivationResult(ACTIVE)]
    assert activation_row(db.engine) == activated


def test_one_collection_per_step_and_writes_captured_only_after_each_lifecycle(db):
    writer = CmsWriter(db.engine)
    alpha = writer.create_collection("alpha", ())
    beta = writer.create_collection("beta", ())
    delete_status(db.engine, "beta")  # EmDash's registry wrote no status row before capture

    first = activate_step(db.engine)

    assert first == ActivationResult(ACTIVATING, ("alpha",), "alpha")
    row = activation_row(db.engine)
    assert (row["state"], row["collection_cursor"], row["lease_token"], row["attempt_count"]) == (
        "activating",
        "alpha",
        None,
        1,
    )
    assert lifecycle(db.engine, "alpha") == {
        "status": "never",
        "collection_id": alpha.id,
        "capture_state": "active",
        "reconciliation_required": 1,
        "cursor": None,
    }
    assert captured(db.engine, alpha.id, "alpha") is True
    assert status_row(db.engine, "beta") is None
    assert owned_triggers(db.engine, "beta") == []

    insert_entry(db.engine, "alpha", "alpha-1")
    assert work_keys(db.engine) == [(alpha.id, "alpha-1")]
    assert int(status_row(db.engine, "alpha")["change_epoch"]) == 1

    second = activate_step(db.engine)

    assert second == ActivationResult(ACTIVE, ("beta",), "beta")
    assert lifecycle(db.engine, "beta") == {
        "status": "never",
        "collection_id": beta.id,
        "capture_state": "active",
        "reconciliation_required": 1,
        "cursor": None,
    }
    assert captured(db.engine, beta.id, "beta") is True
    row = activation_row(db.engine)
    assert (row["state"], row["attempt_count"], row["lease_token"]) == ("active", 2, None)
    insert_entry(db.engine, "beta", "beta-1")
    assert work_keys(db.engine) == sorted([(alpha.id, "alpha-1"), (beta.id, "beta-1")])


def test_activate_steps_until_active(db):
    writer = CmsWriter(db.engine)
    collections = [writer.create_collection(slug, ()) for slug in ("c_one", "c_three", "c_two")]

    results = activate(db.engine)

    assert [(result.outcome, result.processed_collections) for result in results] == [
        (ACTIVATING, ("c_one",)),
        (ACTIVATING, ("c_three",)),
        (ACTIVE, ("c_two",)),
    ]
    assert activation_row(db.engine)["state"] == "active"
    assert activation_row(db.engine)["attempt_count"] == 3
    for collection in collections:
        assert captured(db.engine, collection.id, collection.slug) is True
        assert status_row(db.engine, collection.slug)["capture_state"] == "active"


@pytest.mark.parametrize(
    ("before", "after"),
    [("complete", "stale"), ("running", "stale"), ("partial", "partial"), ("failed", "failed")],
)
def test_legacy_coverage_is_bound_and_untrusted_before_capture_starts(db, before, after):
    collection = CmsWriter(db.engine).create_collection("posts", ())
    delete_status(db.engine, "posts")
    insert_legacy_status(
        db.engine,
        "posts",
        status=before,
        completed_at="2026-08-01T00:00:00.000Z",
        cursor="old-repair",
        change_epoch=7,
    )

    assert activate(db.engine)[-1].outcome is ACTIVE

    row = status_row(db.engine, "posts")
    assert lifecycle(db.engine, "posts") == {
        "status": after,
        "collection_id": collection.id,
        "capture_state": "active",
        "reconciliation_required": 1,
        "cursor": None,
    }
    trusted = before in ("complete", "running")
    assert row["completed_at"] == (None if trusted else "2026-08-01T00:00:00.000Z")
    assert int(row["change_epoch"]) == 7


def test_a_status_row_of_another_collection_fails_activation_durably(db):
    collection = CmsWriter(db.engine).create_collection("posts", ())
    set_status(db.engine, "posts", collection_id="other-collection-id")
    before = snapshot(db.engine, [schema.index_status, schema.work])

    with pytest.raises(ActivationError, match="activation failed") as failure:
        activate_step(db.engine)

    assert failure.value.code == "MEDIA_USAGE_ACTIVATION_FAILED"
    assert isinstance(failure.value.__cause__, LifecycleConflictError)
    row = activation_row(db.engine)
    assert {
        key: row[key]
        for key in ("state", "lease_token", "lease_expires_at", "last_error_code", "activated_at")
    } == {
        "state": "activating",
        "lease_token": None,
        "lease_expires_at": None,
        "last_error_code": "MEDIA_USAGE_ACTIVATION_FAILED",
        "activated_at": None,
    }
    assert row["attempt_count"] == 1
    assert snapshot(db.engine, [schema.index_status, schema.work]) == before
    assert owned_triggers(db.engine, "posts") == []

    # The failure is retryable: the next call claims again and fails the same way.
    with pytest.raises(ActivationError):
        activate(db.engine)
    assert activation_row(db.engine)["attempt_count"] == 2

    # Once the identity is repaired, activation finishes and clears the diagnostic.
    set_status(db.engine, "posts", collection_id=collection.id)
    assert activate(db.engine) == [ActivationResult(ACTIVE, ("posts",), "posts")]
    row = activation_row(db.engine)
    assert (row["state"], row["last_error_code"], row["attempt_count"]) == ("active", None, 3)


def test_a_collection_being_deleted_is_never_reactivated(db):
    collection = CmsWriter(db.engine).create_collection("leaving", ())
    set_status(db.engine, "leaving", capture_state="deleting")

    with pytest.raises(ActivationError):
        activate_step(db.engine)

    assert status_row(db.engine, "leaving")["capture_state"] == "deleting"
    assert activation_row(db.engine)["last_error_code"] == "MEDIA_USAGE_ACTIVATION_FAILED"
    assert captured(db.engine, collection.id, "leaving") is False


def test_activation_fails_closed_when_triggers_cannot_be_installed(db):
    CmsWriter(db.engine).create_collection("broken", ())
    with db.engine.begin() as connection:
        connection.exec_driver_sql('DROP TABLE "ec_broken"')
    before = status_row(db.engine, "broken")

    with pytest.raises(ActivationError, match="activation failed"):
        activate_step(db.engine)

    row = activation_row(db.engine)
    assert (row["state"], row["lease_token"], row["last_error_code"], row["activated_at"]) == (
        "activating",
        None,
        "MEDIA_USAGE_ACTIVATION_FAILED",
        None,
    )
    # The conversion is one transaction: the collection is left exactly as it was.
    assert status_row(db.engine, "broken") == before


def test_a_live_lease_is_not_stolen_and_an_expired_lease_is_taken_over(db):
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.activation).values(
                state="activating",
                lease_token="current-owner",
                lease_expires_at=FAR_FUTURE,
                drain_confirmed_at="2026-08-01T00:00:00.000Z",
            )
        )

    assert activate_step(db.engine) == ActivationResult(
        ActivationOutcome.LEASE_ACTIVE, lease_expires_at=FAR_FUTURE
    )
    assert activate(db.engine) == [
        ActivationResult(ActivationOutcome.LEASE_ACTIVE, lease_expires_at=FAR_FUTURE)
    ]
    row = activation_row(db.engine)
    assert (row["lease_token"], row["attempt_count"], row["state"]) == (
        "current-owner",
        0,
        "activating",
    )

    assert backdate(db.engine, schema.activation, "lease_expires_at", 1) == 1

    assert activate_step(db.engine) == ActivationResult(ACTIVE, (), None)
    row = activation_row(db.engine)
    assert (row["state"], row["attempt_count"], row["lease_token"]) == ("active", 1, None)
    assert row["drain_confirmed_at"] > "2026-08-01T00:00:00.000Z"


def test_a_lease_expiring_in_the_future_is_live_by_database_time(db):
    set_activation(db.engine, "activating")
    expires = db_now(db.engine, 60)
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.activation).values(lease_token="current-owner", lease_expires_at=expires)
        )

    result = activate_step(db.engine)

    assert result.outcome is ActivationOutcome.LEASE_ACTIVE
    assert result.lease_expires_at == activation_row(db.engine)["lease_expires_at"]


def test_concurrent_claims_have_exactly_one_winner(db):
    barrier = threading.Barrier(4)
    tokens: list[str | None] = []
    errors: list[BaseException] = []

    def claim() -> None:
        try:
            barrier.wait()
            with db.engine.begin() as connection:
                claimed = claim_activation(connection)
            tokens.append(claimed[0] if claimed else None)
        except BaseException as error:  # surfaced by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    winners = [token for token in tokens if token is not None]
    assert len(winners) == 1 and len(tokens) == 4
    row = activation_row(db.engine)
    assert (row["lease_token"], row["attempt_count"], row["state"]) == (winners[0], 1, "activating")


def test_lease_is_live_only_for_the_current_token(db):
    with db.engine.begin() as connection:
        token, row = claim_activation(connection)
    assert row.state == "activating" and row.attempt_count == 1
    with db.engine.connect() as connection:
        assert lease_is_live(connection, token) is True
        assert lease_is_live(connection, "another-token") is False
    backdate(db.engine, schema.activation, "lease_expires_at", 1)
    with db.engine.connect() as connection:
        assert lease_is_live(connection, token) is False


def test_finalization_requires_every_registry_collection_to_be_active(db):
    collection = CmsWriter(db.engine).create_collection("pending", ())
    with db.engine.begin() as connection:
        token, _row = claim_activation(connection)

    with db.engine.begin() as connection:
        assert finalize_activation(connection, token, None) is False
    row = activation_row(db.engine)
    assert (row["state"], row["lease_token"], row["activated_at"]) == ("activating", token, None)

    set_status(db.engine, "pending", capture_state="active")
    with db.engine.begin() as connection:
        assert finalize_activation(connection, "someone-else", None) is False
        assert finalize_activation(connection, token, "pending") is True
    row = activation_row(db.engine)
    assert (row["state"], row["lease_token"], row["collection_cursor"]) == (
        "active",
        None,
        "pending",
    )
    assert status_row(db.engine, "pending")["collection_id"] == collection.id


def test_a_collection_created_behind_the_cursor_is_picked_up_by_a_new_pass(db):
    writer = CmsWriter(db.engine)
    beta = writer.create_collection("beta", ())
    gamma = writer.create_collection("gamma", ())

    assert activate_step(db.engine) == ActivationResult(ACTIVATING, ("beta",), "beta")
    # Writers were not drained: a collection appears behind the cursor.
    register_collection_directly(db.engine, "alpha-id", "alpha")

    # The pass reaches the end, finds `alpha` inactive and restarts instead of finalizing.
    assert activate_step(db.engine) == ActivationResult(ACTIVATING, ("gamma",), None)
    row = activation_row(db.engine)
    assert (row["state"], row["collection_cursor"]) == ("activating", None)

    results = activate(db.engine)

    assert [(result.outcome, result.processed_collections) for result in results] == [
        (ACTIVATING, ("alpha",)),
        (ACTIVATING, ("beta",)),
        (ACTIVE, ("gamma",)),
    ]
    assert activation_row(db.engine)["state"] == "active"
    for collection_id, slug in (("alpha-id", "alpha"), (beta.id, "beta"), (gamma.id, "gamma")):
        assert captured(db.engine, collection_id, slug) is True
        assert lifecycle(db.engine, slug)["capture_state"] == "active"
        assert lifecycle(db.engine, slug)["reconciliation_required"] == 1
    insert_entry(db.engine, "alpha", "alpha-1")
    assert work_keys(db.engine) == [("alpha-id", "alpha-1")]


def test_a_lease_lost_during_conversion_cannot_finalize(db):
    CmsWriter(db.engine).create_collection("lease_loss", ())
    # Another owner takes the lease the moment the collection becomes active.
    create_trigger(
        db.engine,
        "test_steal_activation_lease",
        table="_emdash_media_usage_index_status",
        event="AFTER UPDATE OF capture_state",
        when="NEW.capture_state = 'active'",
        action=STEAL_ACTIVATION_LEASE,
    )

    assert activate_step(db.engine) == ActivationResult(ActivationOutcome.CONFLICT, ("lease_loss",))
    row = activation_row(db.engine)
    assert (row["state"], row["lease_token"], row["activated_at"], row["last_error_code"]) == (
        "activating",
        "new-owner",
        None,
        None,
    )


def test_a_claim_taken_over_immediately_leaves_active_collections_alone(db):
    collection = CmsWriter(db.engine).create_collection("takeover", ())
    set_status(db.engine, "takeover", capture_state="installing", reconciliation_required=1)
    with db.engine.begin() as connection:
        install_capture_triggers(connection, CaptureIdentity(collection.id, "takeover"))
    set_status(db.engine, "takeover", capture_state="active")
    create_trigger(
        db.engine,
        "test_steal_activation_claim",
        table="_emdash_media_usage_activation",
        event="AFTER UPDATE OF lease_token",
        when="NEW.lease_token IS NOT NULL AND NEW.lease_token <> 'new-owner'",
        action=STEAL_ACTIVATION_LEASE,
    )

    assert activate_step(db.engine) == ActivationResult(ActivationOutcome.CONFLICT, ())
    assert status_row(db.engine, "takeover")["capture_state"] == "active"
    assert captured(db.engine, collection.id, "takeover") is True
    assert activation_row(db.engine)["lease_token"] == "new-owner"


def test_a_runtime_generation_mismatch_is_refused_without_changes(db):
    with db.engine.begin() as connection:
        connection.execute(update(schema.activation).values(runtime_generation=2))
    before = activation_row(db.engine)

    with pytest.raises(ActivationGenerationError, match="runtime generation"):
        activate_step(db.engine)

    assert activation_row(db.engine) == before


def test_activation_requires_the_installed_schema(db):
    with db.engine.begin() as connection:
        connection.execute(schema.activation.delete())

    with pytest.raises(ActivationError, match="not installed"):
        activate_step(db.engine)

    assert count(db.engine, schema.activation) == 0


# --- the write fence --------------------------------------------------------------------------


def test_cms_writes_are_refused_while_activation_is_in_progress(db):
    writer = CmsWriter(db.engine)
    writer.create_collection("alpha", NO_MEDIA)
    writer.create_collection("beta", NO_MEDIA)
    entry = writer.insert_entry("alpha", {"slug": "first", "title": "First"})
    assert activate_step(db.engine).outcome is ACTIVATING
    before = snapshot(db.engine)
    before_entries = (count_entries(db.engine, "alpha"), count_entries(db.engine, "beta"))

    attempts = {
        "create_collection": lambda: writer.create_collection("gamma", NO_MEDIA),
        "add_field": lambda: writer.add_field("beta", FieldSpec("hero", "image")),
        "insert_entry": lambda: writer.insert_entry("beta", {"slug": "b", "title": "B"}),
        "update_entry": lambda: writer.update_entry("alpha", entry, {"title": "Changed"}),
        "trash_entry": lambda: writer.trash_entry("alpha", entry),
        "delete_entry": lambda: writer.delete_entry("alpha", entry),
        "save_draft": lambda: writer.save_draft("alpha", entry, {"title": "Draft"}),
    }
    refused = {}
    for name, attempt in attempts.items():
        with pytest.raises(CmsError) as error:
            attempt()
        refused[name] = error.value.code

    assert set(refused.values()) == {"MEDIA_USAGE_ACTIVATION_IN_PROGRESS"}
    assert snapshot(db.engine) == before
    assert (count_entries(db.engine, "alpha"), count_entries(db.engine, "beta")) == before_entries
    assert not inspect(db.engine).has_table("ec_gamma")
    assert "hero" not in {column["name"] for column in inspect(db.engine).get_columns("ec_beta")}

    # Once activation is active the same writer works again, and is captured.
    assert activate_step(db.engine).outcome is ACTIVE
    writer.update_entry("alpha", entry, {"title": "Changed"})
    assert [row["content_id"] for row in all_rows(db.engine, schema.work)] == [entry]


# --- collections created and changed after activation -----------------------------------------


def test_collections_created_after_activation_are_captured_and_untrusted(db):
    assert activate(db.engine)[-1].outcome is ACTIVE
    writer = CmsWriter(db.engine)

    collection = writer.create_collection("posts", IMAGE_ONLY)

    assert lifecycle(db.engine, "posts") == {
        "status": "never",
        "collection_id": collection.id,
        "capture_state": "active",
        "reconciliation_required": 1,
        "cursor": None,
    }
    assert int(status_row(db.engine, "posts")["change_epoch"]) == 0
    assert captured(db.engine, collection.id, "posts") is True
    assert [row["slug"] for row in all_rows(db.engine, schema.fields)] == ["title", "hero"]

    insert_entry(db.engine, "posts", "post-1")
    assert work_keys(db.engine) == [(collection.id, "post-1")]
    entry = writer.insert_entry("posts", {"slug": "second", "hero": {"id": "media-1"}})
    writer.update_entry("posts", entry, {"title": "Second"})
    jobs = {row["content_id"]: row for row in all_rows(db.engine, schema.work)}
    assert set(jobs) == {"post-1", entry}
    assert (int(jobs[entry]["work_version"]), int(jobs[entry]["change_epoch"])) == (2, 3)
    assert int(status_row(db.engine, "posts")["change_epoch"]) == 3


def test_creation_is_refused_for_a_slug_held_by_a_deletion_tombstone(db):
    assert activate(db.engine)[-1].outcome is ACTIVE
    due = db_now(db.engine)
    insert_deletion(
        db.engine,
        collection_id="deleted-collection-id",
        collection_slug="posts",
        next_attempt_at=due,
    )
    before = snapshot(db.engine)

    with pytest.raises(CmsError) as error:
        CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)

    assert error.value.code == "COLLECTION_EXISTS"
    assert snapshot(db.engine) == before
    assert status_row(db.engine, "posts") is None
    assert not inspect(db.engine).has_table("ec_posts")


def test_creation_is_refused_for_an_existing_slug_after_activation(db):
    writer = CmsWriter(db.engine)
    existing = writer.create_collection("posts", ())
    assert activate(db.engine)[-1].outcome is ACTIVE
    before = snapshot(db.engine)

    with pytest.raises(CmsError) as error:
        writer.create_collection("posts", IMAGE_ONLY)

    assert error.value.code == "COLLECTION_EXISTS"
    assert snapshot(db.engine) == before
    assert captured(db.engine, existing.id, "posts") is True


def test_add_field_after_activation_invalidates_coverage(db):
    collection = CmsWriter(db.engine).create_collection("posts", NO_MEDIA)
    assert activate(db.engine)[-1].outcome is ACTIVE
    insert_entry(db.engine, "posts", "post-1")
    set_status(
        db.engine,
        "posts",
        status="complete",
        completed_at="2026-08-01T00:00:00.000Z",
        reconciliation_required=0,
        cursor="finished-run",
        last_error_code=None,
    )
    epoch = int(status_row(db.engine, "posts")["change_epoch"])

    CmsWriter(db.engine).add_field("posts", FieldSpec("attachment", "file"))

    row = status_row(db.engine, "posts")
    assert {
        "change_epoch": int(row["change_epoch"]),
        "status": row["status"],
        "completed_at": row["completed_at"],
        "cursor": row["cursor"],
        "last_error_code": row["last_error_code"],
        "reconciliation_required": row["reconciliation_required"],
        "capture_state": row["capture_state"],
    } == {
        "change_epoch": epoch + 1,
        "status": "stale",
        "completed_at": None,
        "cursor": None,
        "last_error_code": "CONTENT_USAGE_STALE",
        "reconciliation_required": 1,
        "capture_state": "active",
    }
    assert [field.slug for field in CmsWriter(db.engine).collection("posts").fields] == [
        "title",
        "attachment",
    ]
    # The new column is writable and its writes are captured.
    entry = CmsWriter(db.engine).insert_entry("posts", {"slug": "p2", "attachment": "media-9"})
    assert (collection.id, entry) in work_keys(db.engine)


def test_add_field_before_activation_leaves_coverage_alone(db):
    CmsWriter(db.engine).create_collection("posts", NO_MEDIA)
    before = status_row(db.engine, "posts")

    CmsWriter(db.engine).add_field("posts", FieldSpec("hero", "image"))

    assert status_row(db.engine, "posts") == before
    assert count(db.engine, schema.fields) == 2


def test_add_field_fails_closed_when_the_capture_fence_is_gone(db):
    CmsWriter(db.engine).create_collection("posts", NO_MEDIA)
    assert activate(db.engine)[-1].outcome is ACTIVE
    set_status(db.engine, "posts", capture_state="deleting")
    before = snapshot(db.engine)

    with pytest.raises(LifecycleConflictError):
        CmsWriter(db.engine).add_field("posts", FieldSpec("hero", "image"))

    assert snapshot(db.engine) == before
    assert "hero" not in {column["name"] for column in inspect(db.engine).get_columns("ec_posts")}


# --- EmDash's own database ------------------------------------------------------------------------


def test_activating_a_database_created_by_emdash(tmp_path):
    copy = tmp_path / "emdash.db"
    shutil.copyfile(FIXTURE_DB, copy)
    engine = create_database_engine(f"sqlite:///{copy}")
    try:
        with engine.connect() as connection:
            registry = dict(
                connection.execute(
                    select(schema.collections.c.slug, schema.collections.c.id).order_by(
                        schema.collections.c.slug
                    )
                ).all()
            )
        assert sorted(registry) == ["coll_0", "coll_1"]
        for slug in registry:
            legacy = status_row(engine, slug)
            assert (legacy["collection_id"], legacy["capture_state"]) == (None, None)
        entries_before = {slug: count_entries(engine, slug) for slug in registry}

        results = activate(engine)

        assert [(result.outcome, result.processed_collections) for result in results] == [
            (ACTIVATING, ("coll_0",)),
            (ACTIVE, ("coll_1",)),
        ]
        row = activation_row(engine)
        assert (row["state"], row["lease_token"], row["last_error_code"]) == ("active", None, None)
        for slug, collection_id in registry.items():
            status = status_row(engine, slug)
            assert (
                status["collection_id"],
                status["capture_state"],
                status["reconciliation_required"],
                status["status"],
                status["cursor"],
            ) == (collection_id, "active", 1, "stale", None)
            assert captured(engine, collection_id, slug) is True
        assert count(engine, schema.work) == 0
        assert {slug: count_entries(engine, slug) for slug in registry} == entries_before

        with engine.begin() as connection:
            connection.execute(text("UPDATE ec_coll_0 SET slug = slug WHERE id = 'c0-e00000'"))
        assert work_keys(engine) == [(registry["coll_0"], "c0-e00000")]
        assert int(status_row(engine, "coll_0")["change_epoch"]) == 1
    finally:
        engine.dispose()


# --- writers racing activation ----------------------------------------------------------------


def blocks_another_session(engine: Engine, backend_pid: int) -> bool:
    with engine.connect() as connection:
        blocked = connection.execute(
            text(
                "SELECT COUNT(*) FROM pg_stat_activity "
                "WHERE CAST(:pid AS integer) = ANY(pg_blocking_pids(pid))"
            ),
            {"pid": backend_pid},
        ).scalar_one()
    return blocked > 0


@pytest.mark.postgres_only("SQLite writers and activation steps are serialized by BEGIN IMMEDIATE")
def test_a_collection_created_as_activation_starts_is_captured_before_finalization(db, monkeypatch):
    writer = CmsWriter(db.engine)
    writer.create_collection("alpha", ())
    paused, resume = threading.Event(), threading.Event()
    original = CmsWriter._upsert_legacy_status
    creator_pid: list[int] = []

    def pause_before_commit(self, connection, collection):
        original(self, connection, collection)
        creator_pid.append(connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        paused.set()
        assert resume.wait(30)

    monkeypatch.setattr(CmsWriter, "_upsert_legacy_status", pause_before_commit)
    outcome: dict = {}

    def run(name, call):
        try:
            outcome[name] = call()
        except BaseException as error:  # surfaced by the assertions below
            outcome[name] = error

    creator = threading.Thread(
        target=run, args=("gamma", lambda: writer.create_collection("gamma", ()))
    )
    creator.start()
    assert paused.wait(30)
    # The writer read `expanded` and is still open: activation must not finalize without it.
    activator = threading.Thread(target=run, args=("activation", lambda: activate(db.engine)))
    activator.start()
    deadline = time.monotonic() + 30
    while activator.is_alive() and not blocks_another_session(db.engine, creator_pid[0]):
        assert time.monotonic() < deadline
    resume.set()
    creator.join(30)
    activator.join(30)

    gamma = outcome["gamma"]
    assert not isinstance(gamma, BaseException), gamma
    assert [result.outcome for result in outcome["activation"]][-1] is ACTIVE
    assert activation_row(db.engine)["state"] == "active"
    assert lifecycle(db.engine, "gamma")["capture_state"] == "active"
    assert captured(db.engine, gamma.id, "gamma") is True
    insert_entry(db.engine, "gamma", "gamma-1")
    assert work_keys(db.engine) == [(gamma.id, "gamma-1")]
