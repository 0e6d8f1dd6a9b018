"""Statements several deletion methods share: due tombstones, the guarded tombstone update and lock, the cleanup rows that remain, a page of ids."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Connection,
    Select,
    exists,
    literal,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from media_usage_orchestration.store.core.clock import (
    now,
)
from media_usage_orchestration.store.core.leases import (
    bounded_limit,
    due_candidates_statement,
)
from media_usage_orchestration.store.core.predicates import (
    is_collection_status_row,
)
from media_usage_orchestration.store.core.schema import (
    collection_deletions,
    work,
)
from media_usage_orchestration.store.deletion.guards import canonical_sources, holds_deletion_lease
from media_usage_orchestration.store.deletion.records import (
    MAX_PAGE_LIMIT,
    DeletionLease,
    DeletionPhase,
    DeletionRecord,
)
from media_usage_orchestration.values.errors import (
    DeletionLeaseLost,
)

# --- statements shared by several methods ------------------------------------------------------


def find_due_statement(limit: int) -> Select:
    """One statement: the oldest due pending, retry and lease-expired tombstones."""
    limit = bounded_limit(
        limit, 1, MAX_PAGE_LIMIT, "Collection deletion candidate limit must be from 1 to 100"
    )
    return due_candidates_statement(collection_deletions, limit)


def update_deletion(
    connection: Connection, lease: DeletionLease, in_phase: DeletionPhase, /, **values: Any
) -> None:
    """A back-phase checkpoint: progress resets the failure count; 0 rows means we lost."""
    result = connection.execute(
        update(collection_deletions)
        .where(holds_deletion_lease(lease, phase=in_phase))
        .values(**values, attempt_count=0, last_error_code=None, updated_at=now())
    )
    if result.rowcount != 1:
        raise DeletionLeaseLost("Collection deletion lease was lost")


def lock_leased_tombstone(
    connection: Connection, lease: DeletionLease, phase: DeletionPhase
) -> DeletionRecord:
    """Read the step's own cursors under the lease; PostgreSQL serializes holders of one token."""
    row = connection.execute(
        select(collection_deletions)
        .where(holds_deletion_lease(lease, phase=phase))
        .with_for_update()
    ).first()
    if row is None:
        raise DeletionLeaseLost("Collection deletion lease was lost")
    return DeletionRecord.from_row(row._mapping)


def cleanup_rows_remain(
    connection: Connection, collection_id: str, collection_slug: str, *, include_status: bool
) -> bool:
    """One query: does any work, canonical source (or status row) of the collection remain?"""
    row = connection.execute(
        select(
            exists(select(literal(1)).where(work.c.collection_id == collection_id)).label(
                "work_present"
            ),
            exists(select(literal(1)).where(canonical_sources(collection_id))).label(
                "source_present"
            ),
            exists(
                select(literal(1)).where(is_collection_status_row(collection_id, collection_slug))
            ).label("status_present"),
        )
    ).one()
    return (
        bool(row.work_present)
        or bool(row.source_present)
        or (include_status and bool(row.status_present))
    )


def page_ids(
    connection: Connection, id_column, scope: ColumnElement[bool], after: str | None, batch: int
) -> list[str]:
    """Up to `batch + 1` ids ascending after the cursor: the extra one says "more remain"."""
    statement = select(id_column).where(scope)
    if after is not None:
        statement = statement.where(id_column > after)
    return list(connection.execute(statement.order_by(id_column).limit(batch + 1)).scalars())
