"""The global activation row (`store/host/activation.py`): its reads and the write fence, the
lease claim (`expanded`, or `activating` unowned or expired), every lease-guarded write (the
batch hand-off, finalization, a failure), the maintenance turn, and the next collection to
convert. Time moves by backdating the lease, never by sleeping."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, literal, select, update

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.schema import ACTIVATION_KEY
from media_usage_orchestration.store.host.activation import (
    ACTIVATION_ERROR_CODE,
    ACTIVATION_LEASE_SECONDS,
    ActivationRow,
    activation_lease_is_held,
    capture_active,
    claim_activation,
    finalize_activation,
    find_incomplete_collection,
    lease_is_live,
    read_activation,
    read_activation_state,
    record_activation_failure,
    release_batch,
    rotate_maintenance_turn,
    writable_activation_state,
)
from media_usage_orchestration.values.errors import (
    ActivationGenerationError,
    ActivationInProgressError,
)
from tests.support.factories import insert_registry, insert_status
from tests.support.states import backdate, db_now, one, set_activation

STRANGER = "01STRANGERSTRANGERSTRANGER"


def _row(db) -> dict:
    return one(db.engine, schema.activation, task_key=ACTIVATION_KEY)


def _set_row(db, **values) -> None:
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.activation)
            .where(schema.activation.c.task_key == ACTIVATION_KEY)
            .values(**values)
        )


def _claim(db) -> str:
    with db.engine.begin() as connection:
        claimed = claim_activation(connection)
    assert claimed is not None
    return claimed[0]


def _expire_lease(db) -> None:
    assert backdate(db.engine, schema.activation, "lease_expires_at", 1)


def _in(db, statement_of_connection):
    with db.engine.begin() as connection:
        return statement_of_connection(connection)


def _active_collection(db, collection_id: str, slug: str, capture_state: str = "active"):
    insert_registry(db.engine, id=collection_id, slug=slug)
    insert_status(
        db.engine, scope_key=slug, collection_id=collection_id, capture_state=capture_state
    )


# --- reads and the write fence ----------------------------------------------------------------


def test_a_fresh_install_reads_as_expanded(db):
    with db.engine.connect() as connection:
        row = read_activation(connection)
        locked = read_activation(connection, share_lock=True)
        assert capture_active(connection) is False
        assert writable_activation_state(connection) == "expanded"

    assert row == locked
    assert isinstance(row, ActivationRow)
    assert (row.state, row.runtime_generation, row.attempt_count) == ("expanded", 1, 0)
    assert (row.lease_token, row.lease_expires_at, row.collection_cursor) == (None, None, None)
    assert read_activation_state(db.engine) == "expanded"


def test_an_active_row_reads_as_capture_active(db):
    set_activation(db.engine, "active")

    with db.engine.connect() as connection:
        assert capture_active(connection) is True
        assert writable_activation_state(connection, share_lock=True) == "active"
    assert read_activation_state(db.engine) == "active"


def test_without_the_row_activation_never_ran_and_writes_are_allowed(db):
    with db.engine.begin() as connection:
        connection.execute(delete(schema.activation))

    with db.engine.connect() as connection:
        assert read_activation(connection) is None
        assert capture_active(connection) is False
        assert writable_activation_state(connection) == "expanded"
    assert read_activation_state(db.engine) is None


def test_without_the_table_activation_never_ran(empty_db):
    assert read_activation_state(empty_db.engine) is None


def test_writes_are_refused_while_activation_runs(db):
    _claim(db)

    with db.engine.connect() as connection:
        with pytest.raises(ActivationInProgressError):
            writable_activation_state(connection)
        with pytest.raises(ActivationInProgressError):
            writable_activation_state(connection, share_lock=True)
        assert capture_active(connection) is False
    assert read_activation_state(db.engine) == "activating"


def test_a_row_of_another_runtime_generation_is_refused(db):
    _set_row(db, runtime_generation=2, state="active")

    with db.engine.connect() as connection:
        with pytest.raises(ActivationGenerationError, match="runtime generation"):
            read_activation(connection)
        with pytest.raises(ActivationGenerationError):
            capture_active(connection)
    with pytest.raises(ActivationGenerationError):
        read_activation_state(db.engine)


# --- the lease claim --------------------------------------------------------------------------


def test_the_claim_takes_an_expanded_row_under_a_fresh_lease(db):
    before = db_now(db.engine)
    with db.engine.begin() as connection:
        token, row = claim_activation(connection)

    stored = _row(db)
    assert row.state == stored["state"] == "activating"
    assert row.lease_token == stored["lease_token"] == token and len(token) == 26
    assert row.attempt_count == stored["attempt_count"] == 1
    assert stored["last_error_code"] is None
    assert before <= stored["last_attempted_at"] == stored["updated_at"]
    assert stored["drain_confirmed_at"] is not None
    lease_length = ACTIVATION_LEASE_SECONDS
    assert (
        db_now(db.engine, lease_length - 60)
        < row.lease_expires_at
        <= db_now(db.engine, lease_length)
    )
    with db.engine.connect() as connection:
        assert lease_is_live(connection, token) is True
        assert lease_is_live(connection, STRANGER) is False


def test_a_live_lease_is_not_claimed_again(db):
    _claim(db)
    before = _row(db)

    with db.engine.begin() as connection:
        assert claim_activation(connection) is None
    assert _row(db) == before


def test_an_expired_lease_is_taken_over_and_its_owner_fenced(db):
    old = _claim(db)
    _set_row(db, last_error_code=ACTIVATION_ERROR_CODE)
    _expire_lease(db)
    with db.engine.connect() as connection:
        assert lease_is_live(connection, old) is False

    new = _claim(db)

    stored = _row(db)
    assert new != old and stored["lease_token"] == new
    assert (stored["attempt_count"], stored["last_error_code"]) == (2, None)
    with db.engine.begin() as connection:
        assert release_batch(connection, old, "posts") is False
        assert finalize_activation(connection, old, None) is False
        assert lease_is_live(connection, new) is True


def test_an_activating_row_without_an_owner_is_claimable(db):
    _claim(db)
    _set_row(db, lease_token=None, lease_expires_at=None)

    assert _claim(db) == _row(db)["lease_token"]


@pytest.mark.parametrize("state", ["active", "retired"])
def test_a_row_past_activation_is_never_claimed(db, state):
    set_activation(db.engine, state)
    before = _row(db)

    with db.engine.begin() as connection:
        assert claim_activation(connection) is None
    assert _row(db) == before


def test_a_row_of_another_runtime_generation_is_never_claimed(db):
    _set_row(db, runtime_generation=2)

    with db.engine.begin() as connection:
        assert claim_activation(connection) is None
    assert _row(db)["state"] == "expanded"


def test_the_lease_predicate_holds_for_the_live_owner_only(db):
    token = _claim(db)

    def held(lease_token: str) -> bool:
        with db.engine.connect() as connection:
            return (
                connection.execute(
                    select(literal(1)).where(activation_lease_is_held(lease_token))
                ).first()
                is not None
            )

    assert held(token) is True
    assert held(STRANGER) is False
    _expire_lease(db)
    assert held(token) is False


# --- lease-guarded writes ---------------------------------------------------------------------


def test_a_batch_hand_off_records_the_cursor_and_frees_the_lease(db):
    token = _claim(db)

    assert _in(db, lambda connection: release_batch(connection, token, "posts")) is True

    stored = _row(db)
    assert (stored["state"], stored["collection_cursor"]) == ("activating", "posts")
    assert (stored["lease_token"], stored["lease_expires_at"]) == (None, None)
    assert _in(db, lambda connection: release_batch(connection, token, "pages")) is False


@pytest.mark.parametrize("how", ["wrong_token", "expired"])
def test_a_hand_off_without_the_live_lease_changes_nothing(db, how):
    token = _claim(db)
    if how == "expired":
        _expire_lease(db)
    before = _row(db)

    owner = STRANGER if how == "wrong_token" else token
    assert _in(db, lambda connection: release_batch(connection, owner, "posts")) is False
    assert _in(db, lambda connection: finalize_activation(connection, owner, "posts")) is False
    assert _row(db) == before


def test_finalization_needs_every_registry_collection_active(db):
    _active_collection(db, "id-alpha", "alpha")
    _active_collection(db, "id-beta", "beta", capture_state="installing")
    token = _claim(db)
    before = _row(db)

    assert _in(db, lambda connection: finalize_activation(connection, token, "beta")) is False
    assert _row(db) == before

    with db.engine.begin() as connection:
        connection.execute(update(schema.index_status).values(capture_state="active"))
    assert _in(db, lambda connection: finalize_activation(connection, token, "beta")) is True

    stored = _row(db)
    assert (stored["state"], stored["collection_cursor"]) == ("active", "beta")
    assert (stored["lease_token"], stored["lease_expires_at"]) == (None, None)
    assert stored["activated_at"] is not None and stored["last_error_code"] is None


def test_a_status_row_of_another_identity_does_not_count_as_active(db):
    insert_registry(db.engine, id="id-alpha", slug="alpha")
    insert_status(db.engine, scope_key="alpha", collection_id="id-replaced", capture_state="active")
    token = _claim(db)

    with db.engine.connect() as connection:
        assert find_incomplete_collection(connection) == ("id-alpha", "alpha")
    assert _in(db, lambda connection: finalize_activation(connection, token, None)) is False
    assert _row(db)["state"] == "activating"


def test_an_empty_registry_finalizes_at_once(db):
    token = _claim(db)

    assert _in(db, lambda connection: finalize_activation(connection, token, None)) is True
    assert _row(db)["state"] == "active"


def test_a_failure_frees_the_lease_with_its_code(db):
    token = _claim(db)

    _in(db, lambda connection: record_activation_failure(connection, STRANGER))
    assert _row(db)["lease_token"] == token and _row(db)["last_error_code"] is None

    _in(db, lambda connection: record_activation_failure(connection, token))
    stored = _row(db)
    assert (stored["state"], stored["last_error_code"]) == ("activating", ACTIVATION_ERROR_CODE)
    assert (stored["lease_token"], stored["lease_expires_at"]) == (None, None)
    assert _claim(db) != token  # the row is claimable again


def test_an_expired_owner_may_still_record_its_failure_until_taken_over(db):
    token = _claim(db)
    _expire_lease(db)

    _in(db, lambda connection: record_activation_failure(connection, token))
    assert _row(db)["last_error_code"] == ACTIVATION_ERROR_CODE

    new = _claim(db)
    before = _row(db)
    _in(db, lambda connection: record_activation_failure(connection, token))
    assert _row(db) == before and before["lease_token"] == new


# --- the maintenance turn and the next collection ---------------------------------------------


def test_the_maintenance_turn_rotates_only_while_capture_is_active(db):
    for state in ("expanded", "activating"):
        _set_row(db, state=state)
        assert _in(db, rotate_maintenance_turn) is None
        assert _row(db)["media_usage_maintenance_turn"] == 2

    set_activation(db.engine, "active")
    turns = [_in(db, rotate_maintenance_turn) for _ in range(4)]

    assert turns == [0, 1, 2, 0]
    assert _row(db)["media_usage_maintenance_turn"] == 0


def test_the_next_collection_to_convert_is_the_first_slug_without_active_capture(db):
    _active_collection(db, "id-alpha", "alpha")
    _active_collection(db, "id-delta", "delta", capture_state="installing")
    insert_registry(db.engine, id="id-gamma", slug="gamma")  # no status row yet
    _active_collection(db, "id-beta", "beta", capture_state="ready")

    with db.engine.connect() as connection:
        assert find_incomplete_collection(connection) == ("id-beta", "beta")
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.index_status)
            .where(schema.index_status.c.scope_key.in_(["beta", "delta"]))
            .values(capture_state="active")
        )
        assert find_incomplete_collection(connection) == ("id-gamma", "gamma")
    insert_status(db.engine, scope_key="gamma", collection_id="id-gamma", capture_state="active")
    with db.engine.connect() as connection:
        assert find_incomplete_collection(connection) is None
