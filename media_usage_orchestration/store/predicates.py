"""Guard predicates shared by the repositories.

Each is one EXISTS / comparison the seeds repeat in many WHERE clauses. Repositories compose
them by name so a reader can check a statement's guards against the seed line by line.
"""

from __future__ import annotations

from sqlalchemy import Text, and_, column, exists, literal, select, table
from sqlalchemy.sql.elements import ColumnElement

from .schema import (
    ACTIVATION_KEY,
    COLLECTION_SCOPE,
    CONTENT_ADAPTER_ID,
    activation,
    collection_deletions,
    collections,
    index_status,
)

# Guards read only these columns. They alias the table each time a statement is built, and an
# alias of the full `Table` would proxy every one of its columns, on every step of every run.
_REGISTRY = table(collections.name, column("id", Text), column("slug", Text))
_TOMBSTONES = table(collection_deletions.name, column("collection_id", Text))


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
