"""Guarded statements on a collection's index status row (`_emdash_media_usage_index_status`)
that belong to capture lifecycles (activation, collection creation, schema changes) and to
the outcomes of incremental work.

The status row is the coverage record and the capture fence at once: `capture_state` decides
whether content writes are accepted, `change_epoch` orders every captured change.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Text,
    and_,
    bindparam,
    case,
    exists,
    literal,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from media_usage_orchestration.store.core.clock import now
from media_usage_orchestration.store.core.engine import single_statement
from media_usage_orchestration.store.core.predicates import (
    is_collection_status_row,
    registry_identity_is_current,
)
from media_usage_orchestration.store.core.schema import (
    ACTIVATION_KEY,
    COLLECTION_SCOPE,
    CONTENT_ADAPTER_ID,
    activation,
    dialect_insert,
    index_status,
    reconciliations,
    work,
)
from media_usage_orchestration.store.host.activation import (
    RUNTIME_GENERATION,
    activation_lease_is_held,
)
from media_usage_orchestration.values.errors import LifecycleConflictError
from media_usage_orchestration.values.identifiers import validate_error_code

STALE_CODE = "CONTENT_USAGE_STALE"


def _activation_active():
    return exists(
        select(literal(1))
        .select_from(activation)
        .where(
            activation.c.task_key == ACTIVATION_KEY,
            activation.c.state == "active",
            activation.c.runtime_generation == RUNTIME_GENERATION,
        )
    )


def _active_bound_row(collection_id: str, slug: str):
    """The collection's status row, capture active, its registry identity current."""
    return and_(
        is_collection_status_row(collection_id, slug),
        index_status.c.capture_state == "active",
        registry_identity_is_current(collection_id, slug),
    )


def prepare_for_activation(
    connection: Connection, collection_id: str, slug: str, lease_token: str
) -> None:
    """Bind the status row to the collection and fence it as `installing`, untrusted.

    A `complete` or `running` coverage becomes `stale`: writes made before capture existed
    were never recorded, so only a full reconciliation can trust the index again.
    """
    was_trusted = index_status.c.status.in_(("complete", "running"))
    # The lease guards the INSERT too: with no row yet, a caller that lost the lease inserts
    # nothing (and is refused below), as the ON CONFLICT update refuses it on an existing row.
    held = activation_lease_is_held(lease_token)
    statement = _insert_installing(connection, collection_id, slug, guard=held)
    statement = statement.on_conflict_do_update(
        index_elements=["adapter_id", "scope_type", "scope_key"],
        set_={
            "status": case((was_trusted, "stale"), else_=index_status.c.status),
            "completed_at": case((was_trusted, None), else_=index_status.c.completed_at),
            "cursor": None,
            "collection_id": collection_id,
            "reconciliation_required": 1,
            "capture_state": "installing",
            "updated_at": now(),
        },
        where=and_(
            or_(
                index_status.c.collection_id.is_(None),
                index_status.c.collection_id == collection_id,
            ),
            or_(index_status.c.capture_state.is_(None), index_status.c.capture_state != "deleting"),
            held,
        ),
    ).returning(index_status.c.collection_id)
    bound = connection.execute(statement).scalar_one_or_none()
    if bound != collection_id:
        raise LifecycleConflictError("Media usage collection lifecycle identity conflict")


def activate_for_activation(
    connection: Connection, collection_id: str, slug: str, lease_token: str
) -> bool:
    result = connection.execute(
        update(index_status)
        .where(
            is_collection_status_row(collection_id, slug),
            index_status.c.capture_state == "installing",
            registry_identity_is_current(collection_id, slug),
            activation_lease_is_held(lease_token),
        )
        .values(capture_state="active", updated_at=now())
    )
    return result.rowcount > 0


def insert_installing_for_new_collection(
    connection: Connection, collection_id: str, slug: str, creation_fingerprint: str | None = None
) -> None:
    """A collection created after activation starts fenced: `installing`, untrusted, `never`."""
    connection.execute(
        _insert_installing(connection, collection_id, slug, cursor=creation_fingerprint)
    )


def _insert_installing(
    connection: Connection,
    collection_id: str,
    slug: str,
    *,
    guard: ColumnElement[bool] | None = None,
    **extra: Any,
):
    """INSERT of a collection's status row as never reconciled, untrusted and `installing`;
    with `guard`, an INSERT ... SELECT that inserts only while the guard holds."""
    values = {
        "adapter_id": CONTENT_ADAPTER_ID,
        "scope_type": COLLECTION_SCOPE,
        "scope_key": slug,
        "status": "never",
        "collection_id": collection_id,
        "reconciliation_required": 1,
        "capture_state": "installing",
        "updated_at": now(),
        **extra,
    }
    insert = dialect_insert(connection, index_status)
    if guard is None:
        return insert.values(**values)
    row = [
        value if isinstance(value, ColumnElement) else literal(value, index_status.c[name].type)
        for name, value in values.items()
    ]
    return insert.from_select(list(values), select(*row).where(guard))


def mark_capture_ready(connection: Connection, collection_id: str, slug: str) -> None:
    _update_fenced(
        connection,
        "Media usage collection readiness lost its fence",
        [
            is_collection_status_row(collection_id, slug),
            index_status.c.capture_state.in_(("installing", "ready")),
            _activation_active(),
        ],
        capture_state="ready",
        updated_at=now(),
    )


def finalize_collection_capture(connection: Connection, collection_id: str, slug: str) -> None:
    _update_fenced(
        connection,
        "Media usage collection activation lost its fence",
        [
            is_collection_status_row(collection_id, slug),
            index_status.c.capture_state == "ready",
            registry_identity_is_current(collection_id, slug),
            _activation_active(),
        ],
        capture_state="active",
        cursor=None,
        updated_at=now(),
    )


def invalidate_for_schema_change(connection: Connection, collection_id: str, slug: str) -> None:
    """A field change while capture is active: coverage is untrusted until reconciled."""
    _update_fenced(
        connection,
        "Media usage coverage invalidation lost its fence",
        [_active_bound_row(collection_id, slug)],
        change_epoch=index_status.c.change_epoch + 1,
        status="stale",
        completed_at=None,
        cursor=None,
        last_error_code=STALE_CODE,
        reconciliation_required=1,
        updated_at=now(),
    )


def _update_fenced(
    connection: Connection, lost_message: str, guards: list[Any], **values: Any
) -> None:
    """A lifecycle transition of the status row; no row updated means its fence was lost."""
    result = connection.execute(update(index_status).where(*guards).values(**values))
    if result.rowcount == 0:
        raise LifecycleConflictError(lost_message)


# --- incremental work outcomes (spec 5.7) -----------------------------------------------------


def record_incremental_success(engine: Engine, collection_id: str, slug: str) -> bool:
    """Note a completed work item; coverage becomes `complete` only if it was already trusted
    and no work of the collection remains. Untrusted coverage (`reconciliation_required = 1`)
    only a full reconciliation can complete.

    One statement: the seed reads the epoch and re-asserts it in the update, which decides on
    the row as that statement finds it all the same; the read added a round trip per batch."""
    identity = {_SUCCESS_COLLECTION_ID.key: collection_id, _SUCCESS_SLUG.key: slug}
    with single_statement(engine) as connection:
        result = connection.execute(_record_success_statement(), identity)
    return result.rowcount > 0


# Every completed batch records a success: the statement is built once, bound per call.
_SUCCESS_COLLECTION_ID = bindparam("success_collection_id", type_=Text)
_SUCCESS_SLUG = bindparam("success_collection_slug", type_=Text)


@functools.cache
def _record_success_statement():
    can_complete = and_(
        index_status.c.reconciliation_required == 0,
        index_status.c.status.in_(("complete", "stale", "partial")),
        ~exists(
            select(literal(1))
            .select_from(work)
            .where(work.c.collection_id == _SUCCESS_COLLECTION_ID)
        ),
    )
    stamp = now()
    return (
        update(index_status)
        .where(
            _active_bound_row(_SUCCESS_COLLECTION_ID, _SUCCESS_SLUG),
        )
        .values(
            status=case((can_complete, "complete"), else_=index_status.c.status),
            completed_at=case((can_complete, stamp), else_=index_status.c.completed_at),
            last_error_code=case((can_complete, null()), else_=index_status.c.last_error_code),
            last_incremental_success_at=stamp,
            updated_at=stamp,
        )
    )


def record_incremental_failure(
    connection: Connection,
    collection_id: str,
    slug: str,
    content_id: str,
    work_version: int,
    error_code: str,
) -> bool:
    """Publish a terminal work failure on the coverage row, only while that exact work
    version is still the failed one: newer work for the entry makes the failure obsolete."""
    code = validate_error_code(error_code, "Media usage incremental failure code")
    reconciliation = reconciliations.alias("reconciliation")
    automatic_run_owns_coverage = exists(
        select(literal(1))
        .select_from(reconciliation)
        .where(
            reconciliation.c.collection_id == collection_id,
            reconciliation.c.run_token == index_status.c.cursor,
        )
    )
    status_ = index_status.c.status
    untrusting = or_(index_status.c.reconciliation_required == 0, status_ == "running")
    failed_work = work.alias("failed_work")
    result = connection.execute(
        update(index_status)
        .where(
            is_collection_status_row(collection_id, slug),
            exists(
                select(literal(1))
                .select_from(failed_work)
                .where(
                    failed_work.c.collection_id == collection_id,
                    failed_work.c.content_id == content_id,
                    failed_work.c.work_version == work_version,
                    failed_work.c.state == "failed",
                    failed_work.c.last_error_code == code,
                )
            ),
            registry_identity_is_current(collection_id, slug),
        )
        .values(
            status=case(
                (automatic_run_owns_coverage, status_),
                (index_status.c.reconciliation_required == 0, "partial"),
                (status_ == "running", "stale"),
                else_=status_,
            ),
            completed_at=case(
                (automatic_run_owns_coverage, index_status.c.completed_at),
                (untrusting, null()),
                else_=index_status.c.completed_at,
            ),
            cursor=case(
                (automatic_run_owns_coverage, index_status.c.cursor),
                (status_ == "running", null()),
                else_=index_status.c.cursor,
            ),
            last_error_code=code,
            updated_at=now(),
        )
    )
    return result.rowcount > 0
