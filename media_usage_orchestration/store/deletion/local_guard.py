"""EmDash's local deletion guard (`executeLocalCollectionDeletionGuard`), `isMediaUsageCollectionSlugDeleting` and the synchronous deletion of a collection whose capture never activated."""

from __future__ import annotations

from sqlalchemy import (
    Connection,
    Engine,
    column,
    delete,
    literal,
    select,
    table,
    update,
)
from sqlalchemy.exc import DBAPIError

from media_usage_orchestration.store.core.clock import (
    now,
)
from media_usage_orchestration.store.core.engine import (
    is_missing_table,
    is_postgres,
    read_transaction,
)
from media_usage_orchestration.store.core.leases import (
    parse_choice,
    require_flag,
)
from media_usage_orchestration.store.core.predicates import (
    is_collection_status_row,
    is_content_collection_status,
    registry_identity_is_current,
)
from media_usage_orchestration.store.core.schema import (
    collection_deletions,
    collections,
    fields,
    index_status,
    occurrences,
    sources,
)
from media_usage_orchestration.store.deletion.guards import holds_deletion_lease
from media_usage_orchestration.store.deletion.records import (
    FTS_TABLE_PREFIX,
    FTS_TRIGGER_SUFFIXES,
    DeletionLease,
    DeletionPhase,
    GuardAction,
    GuardOutcome,
    validated_identity,
)
from media_usage_orchestration.values.identifiers import (
    content_table_name,
    quote_identifier,
    require_text,
    validate_identifier,
)


def is_slug_deleting(engine: Engine, collection_slug: str) -> bool:
    """The slug lock: a tombstone holds the slug until its deletion finalizes."""
    validate_identifier(collection_slug, "collection slug")
    try:
        with read_transaction(engine) as connection:
            row = connection.execute(
                select(collection_deletions.c.collection_id).where(
                    collection_deletions.c.collection_slug == collection_slug
                )
            ).first()
    except DBAPIError as error:
        if is_missing_table(error):
            return False
        raise
    return row is not None


# --- the local deletion guard -----------------------------------------------------------------


def execute_local_deletion_guard(
    engine: Engine,
    action: GuardAction | str,
    collection_id: str,
    collection_slug: str,
    lease_token: str,
    force_delete: bool = False,
) -> GuardOutcome:
    """Fence capture or drop the content table, in one transaction, only under the live lease
    of the matching phase (`fence` for fencing, `table` for dropping)."""
    action = _guard_action(action)
    collection_id, collection_slug = validated_identity(collection_id, collection_slug)
    require_text(lease_token, "Collection deletion requires a lease token")
    force_delete = require_flag(force_delete, "force_delete")
    content_table_name(collection_slug)
    lease = DeletionLease(collection_id, lease_token)
    with engine.begin() as connection:
        if not _lock_live_tombstone(connection, lease, collection_slug, action):
            return GuardOutcome.STALE
        if action is GuardAction.FENCE:
            return _fence_collection(connection, lease, collection_slug, force_delete)
        drop_content_table(connection, collection_slug)
        return GuardOutcome.DROPPED


def _guard_action(value: object) -> GuardAction:
    return parse_choice(GuardAction, value, "collection deletion guard action")


def _lock_live_tombstone(
    connection: Connection, lease: DeletionLease, collection_slug: str, action: GuardAction
) -> bool:
    """Hold the tombstone row for the whole guard so no takeover can interleave with it."""
    phase = DeletionPhase.FENCE if action is GuardAction.FENCE else DeletionPhase.TABLE
    guard = holds_deletion_lease(lease, phase=phase, collection_slug=collection_slug)
    if is_postgres(connection):
        row = connection.execute(
            select(collection_deletions.c.collection_id).where(guard).with_for_update()
        )
        return row.first() is not None
    # SQLite: BEGIN IMMEDIATE already holds the write lock; the no-op write proves the guard.
    result = connection.execute(
        update(collection_deletions)
        .where(guard)
        .values(updated_at=collection_deletions.c.updated_at)
    )
    return result.rowcount == 1


def _fence_collection(
    connection: Connection, lease: DeletionLease, collection_slug: str, force_delete: bool
) -> GuardOutcome:
    table_name = content_table_name(collection_slug)
    if is_postgres(connection):
        # Waits for in-flight content writes and blocks new ones until this transaction ends,
        # so the has-content check below cannot miss a concurrent insert.
        connection.exec_driver_sql(
            f"LOCK TABLE {quote_identifier(table_name)} IN SHARE ROW EXCLUSIVE MODE"
        )
    if not force_delete and table_has_live_content(connection, table_name):
        return GuardOutcome.HAS_CONTENT
    result = connection.execute(
        update(index_status)
        .where(
            is_collection_status_row(lease.collection_id, collection_slug),
            index_status.c.capture_state == "active",
            registry_identity_is_current(lease.collection_id, collection_slug),
        )
        .values(capture_state="deleting", updated_at=now())
    )
    return GuardOutcome.FENCED if result.rowcount == 1 else GuardOutcome.STALE


def delete_collection_synchronously(
    connection: Connection, collection_id: str, collection_slug: str
) -> None:
    """EmDash's delete while capture is not activated, inside the caller's transaction: the FTS
    and content tables, the registry row and its fields, the collection's sources (by slug)
    with their occurrences, and its status row."""
    drop_content_table(connection, collection_slug)
    connection.execute(delete(fields).where(fields.c.collection_id == collection_id))
    connection.execute(delete(collections).where(collections.c.id == collection_id))
    _delete_sources_by_slug(connection, collection_slug)
    connection.execute(
        delete(index_status).where(
            is_content_collection_status(), index_status.c.scope_key == collection_slug
        )
    )


def _delete_sources_by_slug(connection: Connection, collection_slug: str) -> None:
    # Occurrences have no foreign key to their source: delete them first, explicitly.
    by_slug = (sources.c.source_type == "content", sources.c.collection_slug == collection_slug)
    keys = select(sources.c.source_key).where(*by_slug)
    connection.execute(delete(occurrences).where(occurrences.c.source_key.in_(keys)))
    connection.execute(delete(sources).where(*by_slug))


def read_capture_state(
    connection: Connection, collection_id: str, collection_slug: str
) -> str | None:
    """The capture state of exactly this collection identity's status row (None without one)."""
    return connection.execute(
        select(index_status.c.capture_state).where(
            is_collection_status_row(collection_id, collection_slug)
        )
    ).scalar()


def table_has_live_content(connection: Connection, table_name: str) -> bool:
    """Trashed rows (deleted_at set) are not content worth keeping."""
    content = table(table_name, column("deleted_at"))
    statement = select(literal(1)).select_from(content).where(content.c.deleted_at.is_(None))
    return connection.execute(statement.limit(1)).first() is not None


def drop_content_table(connection: Connection, collection_slug: str) -> None:
    """Drop the collection's FTS table (with its triggers), then `ec_<slug>`."""
    _drop_fts_table(connection, collection_slug)
    connection.exec_driver_sql(
        f"DROP TABLE IF EXISTS {quote_identifier(content_table_name(collection_slug))}"
    )


def _drop_fts_table(connection: Connection, collection_slug: str) -> None:
    """EmDash's FTSManager.dropFtsTable: FTS5 exists only on SQLite, elsewhere a no-op."""
    if is_postgres(connection):
        return
    fts_table = f"{FTS_TABLE_PREFIX}{validate_identifier(collection_slug, 'collection slug')}"
    for suffix in FTS_TRIGGER_SUFFIXES:
        connection.exec_driver_sql(f'DROP TRIGGER IF EXISTS "{fts_table}_{suffix}"')
    connection.exec_driver_sql(f'DROP TABLE IF EXISTS "{fts_table}"')
