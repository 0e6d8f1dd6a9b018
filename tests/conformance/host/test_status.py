"""A collection's index status row (`store/host/status.py`): the capture lifecycle transitions
(activation's `installing -> active` under the activation lease, a new collection's `installing
-> ready -> active` while capture is active, a schema change's invalidation) and the outcomes of
incremental work. Every transition applies on its fence and changes nothing without it."""

from __future__ import annotations

import pytest
from sqlalchemy import update
from sqlalchemy.exc import IntegrityError

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.host.activation import claim_activation
from media_usage_orchestration.store.host.status import (
    STALE_CODE,
    activate_for_activation,
    finalize_collection_capture,
    insert_installing_for_new_collection,
    invalidate_for_schema_change,
    mark_capture_ready,
    prepare_for_activation,
    record_incremental_failure,
    record_incremental_success,
)
from media_usage_orchestration.values.errors import LifecycleConflictError
from tests.support.factories import (
    failed,
    insert_reconciliation,
    insert_registry,
    insert_status,
    insert_work,
)
from tests.support.projection import sql_statements
from tests.support.states import (
    assert_same_statement_time,
    backdate,
    db_now,
    recorded_statements,
    set_activation,
    snapshot,
    status_row,
)

ID, SLUG = "id-posts", "posts"
STRANGER = "01STRANGERSTRANGERSTRANGER"
CODE = "MEDIA_USAGE_PROCESSING_FAILED"
COMPLETED = "2026-08-01T00:00:00.000Z"


def _collection(db, *, registered: bool = True, **status) -> None:
    """The registry row of `posts` (unless not `registered`) and its status row with `status`
    (no status row when `status` is None)."""
    if registered:
        insert_registry(db.engine, id=ID, slug=SLUG)
    if status.get("status", "") is not None:
        insert_status(db.engine, scope_key=SLUG, **{"collection_id": ID, **status})


def _activation_token(db) -> str:
    with db.engine.begin() as connection:
        token, _ = claim_activation(connection)
    return token


def _row(db) -> dict:
    return status_row(db.engine, SLUG)


def _refused(db, call, match: str | None = None) -> None:
    """`call(connection)` raises a lifecycle conflict and leaves every row as it was."""
    before = snapshot(db.engine)
    with pytest.raises(LifecycleConflictError, match=match), db.engine.begin() as connection:
        call(connection)
    assert snapshot(db.engine) == before


def _in(db, call):
    with db.engine.begin() as connection:
        return call(connection)


# --- activation: installing, under the activation lease ---------------------------------------


def test_preparation_inserts_a_fenced_untrusted_row_for_a_collection_without_one(db):
    _collection(db, status=None)
    token = _activation_token(db)

    _in(db, lambda connection: prepare_for_activation(connection, ID, SLUG, token))

    row = _row(db)
    assert (row["status"], row["collection_id"], row["capture_state"]) == (
        "never",
        ID,
        "installing",
    )
    assert (row["reconciliation_required"], row["cursor"]) == (1, None)
    assert row["updated_at"] <= db_now(db.engine)


@pytest.mark.parametrize(
    ("before", "after"),
    [("complete", "stale"), ("running", "stale"), ("partial", "partial"), ("failed", "failed")],
)
def test_preparation_binds_a_legacy_row_and_untrusts_trusted_coverage(db, before, after):
    _collection(
        db,
        collection_id=None,
        status=before,
        completed_at=COMPLETED,
        cursor="old-repair",
        change_epoch=7,
        reconciliation_required=0,
    )
    token = _activation_token(db)

    _in(db, lambda connection: prepare_for_activation(connection, ID, SLUG, token))

    row = _row(db)
    trusted = before in ("complete", "running")
    assert (row["status"], row["collection_id"], row["capture_state"]) == (
        after,
        ID,
        "installing",
    )
    assert row["completed_at"] == (None if trusted else COMPLETED)
    assert (row["cursor"], row["reconciliation_required"], int(row["change_epoch"])) == (
        None,
        1,
        7,
    )


@pytest.mark.parametrize("conflict", ["other_collection", "deleting", "wrong_token", "expired"])
def test_preparation_without_its_fence_is_a_conflict_and_changes_nothing(db, conflict):
    owner = "id-other" if conflict == "other_collection" else ID
    capture = "deleting" if conflict == "deleting" else None
    _collection(db, collection_id=owner, status="complete", capture_state=capture)
    token = _activation_token(db)
    if conflict == "wrong_token":
        token = STRANGER
    if conflict == "expired":
        backdate(db.engine, schema.activation, "lease_expires_at", 1)

    _refused(
        db,
        lambda connection: prepare_for_activation(connection, ID, SLUG, token),
        "identity conflict",
    )


def test_activation_turns_an_installing_row_active_under_the_lease(db):
    _collection(db, capture_state="installing", status="never")
    token = _activation_token(db)

    assert _in(db, lambda connection: activate_for_activation(connection, ID, SLUG, token))

    assert _row(db)["capture_state"] == "active"
    # Only an installing row turns active: a second call finds nothing to do.
    assert not _in(db, lambda connection: activate_for_activation(connection, ID, SLUG, token))


@pytest.mark.parametrize(
    "how", ["wrong_token", "expired", "not_installing", "registry_replaced", "other_identity"]
)
def test_activation_without_its_fence_changes_nothing(db, how):
    _collection(
        db,
        capture_state="ready" if how == "not_installing" else "installing",
        status="never",
        registered=how != "registry_replaced",
    )
    if how == "registry_replaced":
        insert_registry(db.engine, id="id-replacement", slug=SLUG)
    token = _activation_token(db)
    if how == "wrong_token":
        token = STRANGER
    if how == "expired":
        backdate(db.engine, schema.activation, "lease_expires_at", 1)
    collection_id = "id-other" if how == "other_identity" else ID
    before = snapshot(db.engine)

    activated = _in(
        db, lambda connection: activate_for_activation(connection, collection_id, SLUG, token)
    )

    assert activated is False
    assert snapshot(db.engine) == before


# --- a collection created while capture is active ---------------------------------------------


def test_a_new_collection_starts_fenced_with_its_creation_fingerprint(db):
    _in(db, lambda connection: insert_installing_for_new_collection(connection, ID, SLUG, "fp-1"))

    row = _row(db)
    assert (row["status"], row["capture_state"], row["collection_id"]) == (
        "never",
        "installing",
        ID,
    )
    assert (row["reconciliation_required"], row["cursor"]) == (1, "fp-1")


def test_a_new_collection_never_overwrites_an_existing_status_row(db):
    _collection(db, status="complete", capture_state="active")
    before = snapshot(db.engine)

    with pytest.raises(IntegrityError):
        _in(db, lambda connection: insert_installing_for_new_collection(connection, ID, SLUG))

    assert snapshot(db.engine) == before


def test_a_new_collection_moves_installing_then_ready_then_active(db):
    set_activation(db.engine, "active")
    _in(db, lambda connection: insert_installing_for_new_collection(connection, ID, SLUG, "fp"))

    _in(db, lambda connection: mark_capture_ready(connection, ID, SLUG))
    assert _row(db)["capture_state"] == "ready"
    _in(db, lambda connection: mark_capture_ready(connection, ID, SLUG))  # ready stays ready
    assert _row(db)["capture_state"] == "ready"
    insert_registry(db.engine, id=ID, slug=SLUG)  # the registry row comes after `ready`
    _in(db, lambda connection: finalize_collection_capture(connection, ID, SLUG))

    row = _row(db)
    assert (row["capture_state"], row["cursor"], row["status"]) == ("active", None, "never")


@pytest.mark.parametrize("how", ["activation_expanded", "already_active", "other_identity"])
def test_readiness_without_its_fence_is_a_conflict(db, how):
    set_activation(db.engine, "expanded" if how == "activation_expanded" else "active")
    _collection(
        db,
        status="never",
        capture_state="active" if how == "already_active" else "installing",
        registered=False,
    )
    collection_id = "id-other" if how == "other_identity" else ID

    _refused(
        db,
        lambda connection: mark_capture_ready(connection, collection_id, SLUG),
        "readiness lost its fence",
    )


def test_readiness_needs_this_runtime_generations_active_row(db):
    set_activation(db.engine, "active")
    with db.engine.begin() as connection:
        connection.execute(update(schema.activation).values(runtime_generation=2))
    _collection(db, status="never", capture_state="installing", registered=False)

    _refused(db, lambda connection: mark_capture_ready(connection, ID, SLUG))


@pytest.mark.parametrize("how", ["not_registered", "still_installing", "activation_expanded"])
def test_finalization_without_its_fence_is_a_conflict(db, how):
    set_activation(db.engine, "expanded" if how == "activation_expanded" else "active")
    _collection(
        db,
        status="never",
        capture_state="installing" if how == "still_installing" else "ready",
        cursor="fp",
        registered=how != "not_registered",
    )

    _refused(
        db,
        lambda connection: finalize_collection_capture(connection, ID, SLUG),
        "activation lost its fence",
    )


# --- a schema change --------------------------------------------------------------------------


def test_a_schema_change_untrusts_active_coverage_and_moves_the_epoch(db):
    _collection(
        db,
        status="complete",
        capture_state="active",
        completed_at=COMPLETED,
        cursor="fp",
        change_epoch=4,
        reconciliation_required=0,
    )

    _in(db, lambda connection: invalidate_for_schema_change(connection, ID, SLUG))

    row = _row(db)
    assert (row["status"], row["completed_at"], row["cursor"]) == ("stale", None, None)
    assert (int(row["change_epoch"]), row["reconciliation_required"]) == (5, 1)
    assert row["last_error_code"] == STALE_CODE


@pytest.mark.parametrize("how", ["installing", "deleting", "registry_gone", "other_identity"])
def test_a_schema_change_without_active_capture_is_a_conflict(db, how):
    _collection(
        db,
        status="complete",
        capture_state=how if how in ("installing", "deleting") else "active",
        registered=how != "registry_gone",
    )
    collection_id = "id-other" if how == "other_identity" else ID

    _refused(
        db,
        lambda connection: invalidate_for_schema_change(connection, collection_id, SLUG),
        "invalidation lost its fence",
    )


# --- incremental work outcomes ----------------------------------------------------------------


@pytest.mark.parametrize("before", ["stale", "partial", "complete"])
def test_a_success_completes_trusted_coverage_once_no_work_is_left(db, before):
    _collection(
        db,
        status=before,
        capture_state="active",
        reconciliation_required=0,
        last_error_code=CODE,
    )

    assert record_incremental_success(db.engine, ID, SLUG) is True

    row = _row(db)
    assert (row["status"], row["last_error_code"]) == ("complete", None)
    # One statement's stamps (PostgreSQL's clock moves by a few microseconds between them).
    assert_same_statement_time(row["completed_at"], row["last_incremental_success_at"])
    assert_same_statement_time(row["completed_at"], row["updated_at"])


@pytest.mark.parametrize(
    ("status", "required", "work_left"),
    [
        ("stale", 0, True),
        ("stale", 1, False),
        ("running", 0, False),
        ("never", 0, False),
        ("failed", 0, False),
    ],
)
def test_a_success_only_notes_itself_when_coverage_cannot_complete(db, status, required, work_left):
    _collection(
        db,
        status=status,
        capture_state="active",
        reconciliation_required=required,
        completed_at=COMPLETED,
        last_error_code=CODE,
    )
    if work_left:
        insert_work(db.engine, collection_id=ID, collection_slug=SLUG, content_id="entry-2")
    before = _row(db)

    assert record_incremental_success(db.engine, ID, SLUG) is True

    row = _row(db)
    assert (row["status"], row["completed_at"], row["last_error_code"]) == (
        status,
        COMPLETED,
        CODE,
    )
    assert row["last_incremental_success_at"] is not None
    assert row["updated_at"] >= before["updated_at"]


@pytest.mark.parametrize("how", ["installing", "registry_gone", "other_identity", "no_row"])
def test_a_success_without_an_active_bound_row_changes_nothing(db, how):
    _collection(
        db,
        status=None if how == "no_row" else "stale",
        capture_state="installing" if how == "installing" else "active",
        reconciliation_required=0,
        registered=how != "registry_gone",
    )
    collection_id = "id-other" if how == "other_identity" else ID
    before = snapshot(db.engine)

    assert record_incremental_success(db.engine, collection_id, SLUG) is False
    assert snapshot(db.engine) == before


def _failed_work(db, version: int = 3, code: str = CODE) -> None:
    insert_work(
        db.engine,
        collection_id=ID,
        collection_slug=SLUG,
        content_id="entry-1",
        work_version=version,
        **failed(code),
    )


@pytest.mark.parametrize(
    ("status", "required", "expected_status", "keeps_completion", "keeps_cursor"),
    [
        ("complete", 0, "partial", False, True),
        ("stale", 0, "partial", False, True),
        ("running", 1, "stale", False, False),
        ("stale", 1, "stale", True, True),
        ("failed", 1, "failed", True, True),
    ],
)
def test_a_terminal_failure_marks_the_coverage_it_makes_incomplete(
    db, status, required, expected_status, keeps_completion, keeps_cursor
):
    _collection(
        db,
        status=status,
        capture_state="active",
        reconciliation_required=required,
        completed_at=COMPLETED,
        cursor="manual-run",
    )
    _failed_work(db)

    recorded = _in(
        db, lambda connection: record_incremental_failure(connection, ID, SLUG, "entry-1", 3, CODE)
    )

    row = _row(db)
    assert recorded is True
    assert (row["status"], row["last_error_code"]) == (expected_status, CODE)
    assert row["completed_at"] == (COMPLETED if keeps_completion else None)
    assert row["cursor"] == ("manual-run" if keeps_cursor else None)


def test_a_failure_leaves_coverage_to_the_automatic_run_that_owns_it(db):
    _collection(
        db,
        status="running",
        capture_state="active",
        reconciliation_required=1,
        completed_at=COMPLETED,
        cursor="run-token-1",
    )
    insert_reconciliation(
        db.engine, collection_id=ID, collection_slug=SLUG, run_token="run-token-1"
    )
    _failed_work(db)

    assert _in(
        db, lambda connection: record_incremental_failure(connection, ID, SLUG, "entry-1", 3, CODE)
    )

    row = _row(db)
    assert (row["status"], row["completed_at"], row["cursor"]) == (
        "running",
        COMPLETED,
        "run-token-1",
    )
    assert row["last_error_code"] == CODE


@pytest.mark.parametrize(
    "how", ["newer_version", "other_code", "not_failed", "no_work", "registry_gone", "other_row"]
)
def test_an_obsolete_failure_changes_nothing(db, how):
    _collection(
        db,
        status="complete",
        capture_state="active",
        reconciliation_required=0,
        registered=how != "registry_gone",
    )
    if how == "not_failed":
        insert_work(
            db.engine, collection_id=ID, collection_slug=SLUG, content_id="entry-1", work_version=3
        )
    elif how != "no_work":
        _failed_work(
            db,
            version=4 if how == "newer_version" else 3,
            code="MEDIA_USAGE_RESOURCE_LIMIT" if how == "other_code" else CODE,
        )
    collection_id = "id-other" if how == "other_row" else ID
    before = snapshot(db.engine)

    recorded = _in(
        db,
        lambda connection: record_incremental_failure(
            connection, collection_id, SLUG, "entry-1", 3, CODE
        ),
    )

    assert recorded is False
    assert snapshot(db.engine) == before


@pytest.mark.parametrize("code", ["lower_case", "", None, "X" * 65, "BAD CODE"])
def test_a_malformed_failure_code_is_refused_before_any_sql(db, code):
    _collection(db, status="complete", capture_state="active", reconciliation_required=0)
    _failed_work(db)
    before = snapshot(db.engine)

    with (
        db.engine.connect() as connection,
        recorded_statements(db.engine) as sent,
        pytest.raises(ValueError, match="SCREAMING_SNAKE_CASE"),
    ):
        record_incremental_failure(connection, ID, SLUG, "entry-1", 3, code)
    assert sql_statements(sent) == []
    assert snapshot(db.engine) == before


@pytest.mark.parametrize("how", ["wrong_token", "expired"])
def test_preparation_of_a_collection_without_a_row_needs_the_lease_too(db, how):
    _collection(db, status=None)
    token = _activation_token(db)
    if how == "wrong_token":
        token = STRANGER
    else:
        backdate(db.engine, schema.activation, "lease_expires_at", 1)

    _refused(db, lambda connection: prepare_for_activation(connection, ID, SLUG, token))
