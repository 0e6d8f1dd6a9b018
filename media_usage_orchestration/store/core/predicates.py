"""Guard predicates shared by the repositories.

Each is one EXISTS / comparison the seeds repeat in many WHERE clauses. Repositories compose
them by name so a reader can check a statement's guards against the seed line by line.
"""

from __future__ import annotations

from sqlalchemy import Text, and_, column, exists, literal, select, table
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import FromClause

from media_usage_orchestration.store.core.schema import (
    ACTIVATION_KEY,
    COLLECTION_SCOPE,
    CONTENT_ADAPTER_ID,
    activation,
    collection_deletions,
    collections,
    index_status,
    narrow,
)

# Guards read only these columns. They alias the table each time a statement is built, and an
# alias of the full `Table` would proxy every one of its columns, on every step of every run.
_REGISTRY = table(collections.name, column("id", Text), column("slug", Text))
_TOMBSTONES = table(collection_deletions.name, column("collection_id", Text))
_OWNING_STATUS = narrow(
    index_status,
    "adapter_id",
    "scope_type",
    "collection_id",
    "scope_key",
    "capture_state",
    "reconciliation_required",
    "status",
    "cursor",
    "change_epoch",
)


def activation_is_active() -> ColumnElement[bool]:
    """The global capture activation row is `active`: every processor is a no-op otherwise."""
    return exists(
        select(literal(1))
        .select_from(activation)
        .where(activation.c.task_key == ACTIVATION_KEY, activation.c.state == "active")
    )


def registry_identity_is_current(
    collection_id: ColumnElement | str, collection_slug: ColumnElement | str
) -> ColumnElement[bool]:
    """ "Collection identity is current": a registry row with exactly (id, slug)."""
    registry = _REGISTRY.alias("current_collection")
    return exists(
        select(literal(1))
        .select_from(registry)
        .where(registry.c.id == collection_id, registry.c.slug == collection_slug)
    )


def no_deletion_tombstone(collection_id: ColumnElement | str) -> ColumnElement[bool]:
    """No collection-deletion tombstone exists for the collection."""
    deletion = _TOMBSTONES.alias("deletion")
    return ~exists(
        select(literal(1)).select_from(deletion).where(deletion.c.collection_id == collection_id)
    )


def is_content_collection_status(status=index_status) -> ColumnElement[bool]:
    """The row is the content-media adapter's per-collection status row."""
    return and_(status.c.adapter_id == CONTENT_ADAPTER_ID, status.c.scope_type == COLLECTION_SCOPE)


def is_collection_status_row(
    collection_id: ColumnElement | str, collection_slug: ColumnElement | str
) -> ColumnElement[bool]:
    """The content-media status row of exactly this collection identity (id and slug)."""
    return and_(
        is_content_collection_status(),
        index_status.c.scope_key == collection_slug,
        index_status.c.collection_id == collection_id,
    )


def capture_is_active(status: FromClause = index_status) -> ColumnElement[bool]:
    """The content-media status row `status` has capture `active`."""
    return and_(is_content_collection_status(status), status.c.capture_state == "active")


def status_row_owns_run(
    status: FromClause, run_token: ColumnElement | str, change_epoch: ColumnElement | int
) -> ColumnElement[bool]:
    """The seed's `statusOwnsRun` on the status row `status`: coverage is untrusted and this run
    is its running owner at exactly this epoch, so any captured write, schema change, operator
    retry or newer run (each moves the epoch or the cursor) fences the run."""
    return and_(
        capture_is_active(status),
        status.c.reconciliation_required == 1,
        status.c.status == "running",
        status.c.cursor == run_token,
        status.c.change_epoch == change_epoch,
    )


def status_owns_run(
    collection_id: ColumnElement | str,
    collection_slug: ColumnElement | str,
    run_token: ColumnElement | str,
    change_epoch: ColumnElement | int,
) -> ColumnElement[bool]:
    """EXISTS: the status row of exactly this collection identity owns the run at this epoch."""
    status = _OWNING_STATUS.alias("status")
    return exists(
        select(literal(1))
        .select_from(status)
        .where(
            status.c.collection_id == collection_id,
            status.c.scope_key == collection_slug,
            status_row_owns_run(status, run_token, change_epoch),
        )
    )
