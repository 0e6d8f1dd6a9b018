"""The global capture activation row (`_emdash_media_usage_activation`), lease-guarded.

Activation moves `expanded -> activating -> active`. While `activating`, one owner holds a
300 s lease and converts one collection per step; every write re-asserts that lease. Once
`active`, the row also carries the turn of EmDash's scheduled lane.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Engine, and_, exists, literal, or_, select, update
from sqlalchemy.exc import DBAPIError
from ulid import ULID

from media_usage_orchestration.store.core.clock import (
    is_due_at_clock,
    lease_live_at_clock,
    now,
    timestamp_offset,
)
from media_usage_orchestration.store.core.engine import is_missing_table, read_transaction
from media_usage_orchestration.store.core.predicates import is_content_collection_status
from media_usage_orchestration.store.core.schema import (
    ACTIVATION_KEY,
    activation,
    collections,
    index_status,
)
from media_usage_orchestration.values.errors import (
    ActivationError,
    ActivationGenerationError,
    ActivationInProgressError,
)
from media_usage_orchestration.values.records import record_from_row

RUNTIME_GENERATION = 1
ACTIVATION_LEASE_SECONDS = 5 * 60
ACTIVATION_ERROR_CODE = ActivationError.code


@dataclass(frozen=True)
class ActivationRow:
    state: str
    runtime_generation: int
    collection_cursor: str | None
    lease_token: str | None
    lease_expires_at: str | None
    attempt_count: int
    last_error_code: str | None
    activated_at: str | None


def _this_row(row=activation):
    return and_(
        row.c.task_key == ACTIVATION_KEY,
        row.c.runtime_generation == RUNTIME_GENERATION,
    )


def _holds_lease(lease_token: str, row=activation):
    return and_(
        _this_row(row),
        row.c.state == "activating",
        row.c.lease_token == lease_token,
        row.c.lease_expires_at.is_not(None),
        lease_live_at_clock(row.c.lease_expires_at),
    )


def activation_lease_is_held(lease_token: str):
    """EXISTS predicate other statements use to re-assert the activation lease."""
    holder = activation.alias("activation_lease")
    return exists(select(literal(1)).select_from(holder).where(_holds_lease(lease_token, holder)))


def read_activation(connection: Connection, *, share_lock: bool = False) -> ActivationRow | None:
    """The activation row. With `share_lock` the row stays share-locked until the reader
    commits, so a claim (an UPDATE) waits for a schema change that saw `expanded` (PostgreSQL;
    SQLite writers are already serialized by BEGIN IMMEDIATE)."""
    statement = select(activation).where(activation.c.task_key == ACTIVATION_KEY)
    if share_lock:
        statement = statement.with_for_update(read=True)
    row = connection.execute(statement).mappings().first()
    if row is None:
        return None
    if row["runtime_generation"] != RUNTIME_GENERATION:
        raise ActivationGenerationError("Media usage activation runtime generation mismatch")
    return record_from_row(ActivationRow, row)


def capture_active(connection: Connection) -> bool:
    """Whether capture is `active`, read inside the caller's transaction."""
    row = read_activation(connection)
    return row is not None and row.state == "active"


def read_activation_state(engine: Engine) -> str | None:
    """The activation state; None when the row or the whole table is missing (never activated)."""
    try:
        with read_transaction(engine) as connection:
            row = read_activation(connection)
    except DBAPIError as error:
        if is_missing_table(error):
            return None
        raise
    return row.state if row else None


def writable_activation_state(connection: Connection, *, share_lock: bool = False) -> str:
    """EmDash's write fence: the activation state (`expanded` without a row); schema and
    content writes are refused while activation runs.

    A schema change decided on `expanded` must commit before activation can claim its lease,
    or the pass could finalize without the new collection or field: it passes `share_lock`
    (content writes need no lock: a collection's capture triggers wait for them, and it is
    left untrusted)."""
    row = read_activation(connection, share_lock=share_lock)
    state = row.state if row else "expanded"
    if state == "activating":
        raise ActivationInProgressError()
    return state


def claim_activation(connection: Connection) -> tuple[str, ActivationRow] | None:
    """Take the activation lease: from `expanded`, or from `activating` when unowned/expired."""
    token = str(ULID())
    claimable = or_(
        activation.c.state == "expanded",
        and_(
            activation.c.state == "activating",
            or_(
                activation.c.lease_token.is_(None),
                and_(
                    activation.c.lease_expires_at.is_not(None),
                    is_due_at_clock(activation.c.lease_expires_at),
                ),
            ),
        ),
    )
    row = (
        connection.execute(
            update(activation)
            .where(_this_row(), claimable)
            .values(
                state="activating",
                drain_confirmed_at=now(),
                lease_token=token,
                lease_expires_at=timestamp_offset(ACTIVATION_LEASE_SECONDS),
                attempt_count=activation.c.attempt_count + 1,
                last_attempted_at=now(),
                last_error_code=None,
                updated_at=now(),
            )
            .returning(*activation.c)
        )
        .mappings()
        .first()
    )
    if row is None:
        return None
    return token, record_from_row(ActivationRow, row)


MAINTENANCE_TURNS = 3


def rotate_maintenance_turn(connection: Connection) -> int | None:
    """EmDash's lane turn: advance `media_usage_maintenance_turn` modulo 3 and return the new
    turn, in one `UPDATE ... RETURNING`; None (nothing changed) unless capture is `active`.
    The rotation and the state check are one statement, so two lanes never share a turn and
    a lane never takes one while activation runs."""
    turn = activation.c.media_usage_maintenance_turn
    return connection.execute(
        update(activation)
        .where(activation.c.task_key == ACTIVATION_KEY, activation.c.state == "active")
        .values(media_usage_maintenance_turn=(turn + 1) % MAINTENANCE_TURNS)
        .returning(turn)
    ).scalar_one_or_none()


def lease_is_live(connection: Connection, lease_token: str) -> bool:
    found = connection.execute(select(activation.c.task_key).where(_holds_lease(lease_token)))
    return found.first() is not None


def release_batch(connection: Connection, lease_token: str, cursor: str | None) -> bool:
    result = connection.execute(
        update(activation)
        .where(_holds_lease(lease_token))
        .values(collection_cursor=cursor, lease_token=None, lease_expires_at=None, updated_at=now())
    )
    return result.rowcount > 0


def _has_active_status(registry):
    """The registry row (`registry`, correlated) has an active status row of its identity."""
    status = index_status.alias("status")
    return exists(
        select(literal(1))
        .select_from(status)
        .where(
            is_content_collection_status(status),
            status.c.scope_key == registry.c.slug,
            status.c.collection_id == registry.c.id,
            status.c.capture_state == "active",
        )
    )


def _every_collection_active():
    registry = collections.alias("collection")
    return ~exists(select(literal(1)).select_from(registry).where(~_has_active_status(registry)))


def finalize_activation(connection: Connection, lease_token: str, cursor: str | None) -> bool:
    """`activating -> active`, only when every registry collection has an active status row."""
    result = connection.execute(
        update(activation)
        .where(_holds_lease(lease_token), _every_collection_active())
        .values(
            state="active",
            collection_cursor=cursor,
            lease_token=None,
            lease_expires_at=None,
            last_error_code=None,
            activated_at=now(),
            updated_at=now(),
        )
    )
    return result.rowcount > 0


def record_activation_failure(connection: Connection, lease_token: str) -> None:
    connection.execute(
        update(activation)
        .where(
            _this_row(),
            activation.c.state == "activating",
            activation.c.lease_token == lease_token,
        )
        .values(
            lease_token=None,
            lease_expires_at=None,
            last_error_code=ACTIVATION_ERROR_CODE,
            updated_at=now(),
        )
    )


def find_incomplete_collection(connection: Connection) -> tuple[str, str] | None:
    row = connection.execute(
        select(collections.c.id, collections.c.slug)
        .where(~_has_active_status(collections))
        .order_by(collections.c.slug)
        .limit(1)
    ).first()
    return (row.id, row.slug) if row else None
