"""Reads of content entries, their draft revisions and their collection's field definitions.

The content row is read joined to the exact registry identity, so an entry of a replaced
collection with the same slug reads as absent. Rows come back as plain mappings: `media/`
turns field rows into a field discovery and content rows into snapshots.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from sqlalchemy import Connection, Select, column, select, table

from media_usage_orchestration.store.core.id_lists import in_text_list
from media_usage_orchestration.store.core.schema import (
    SYSTEM_COLUMNS,
    collections,
    fields,
    narrow,
    revisions,
)
from media_usage_orchestration.values.identifiers import (
    COLLECTION_ID_RESULT,
    content_table_name,
    validate_identifier,
)

# Authorship is never projected, so content reads leave it out.
_AUTHORSHIP_COLUMNS = frozenset({"author_id", "primary_byline_id"})
CONTENT_SYSTEM_COLUMNS = tuple(name for name in SYSTEM_COLUMNS if name not in _AUTHORSHIP_COLUMNS)
# The label under which a content row read carries its registry row's id.
_REGISTRY = narrow(collections, "id", "slug")


class ContentFields(Protocol):
    """A field discovery (`media.fields.FieldDiscovery`) as far as reads need it."""

    @property
    def column_slugs(self) -> tuple[str, ...]: ...


def field_rows(
    connection: Connection, collection_slug: str, collection_id: str | None = None
) -> list[dict[str, Any]]:
    """The `_emdash_fields` rows (`slug`, `type`, `validation`) of the registry collection
    `collection_slug` (and `collection_id`, when given, so a replaced collection with the same
    slug is not read)."""
    validate_identifier(collection_slug, "collection slug")
    query = (
        select(fields.c.slug, fields.c.type, fields.c.validation)
        .select_from(fields.join(collections, collections.c.id == fields.c.collection_id))
        .where(collections.c.slug == collection_slug)
    )
    if collection_id is not None:
        query = query.where(collections.c.id == collection_id)
    return [dict(row._mapping) for row in connection.execute(query)]


def content_columns(discovery: ContentFields) -> tuple[str, ...]:
    """System columns, then extraction and display field columns, each once."""
    names = tuple(dict.fromkeys([*CONTENT_SYSTEM_COLUMNS, *discovery.column_slugs]))
    for name in names:
        validate_identifier(name, "content media usage column")
    return names


def content_rows_query(
    collection_slug: str, collection_id: str, discovery: ContentFields
) -> tuple[Select, Any]:
    """`SELECT <columns>, collection.id FROM ec_<slug> AS content JOIN _emdash_collections`
    on the exact (slug, id); returns the query and the content alias to filter and order by."""
    names = content_columns(discovery)
    content = table(content_table_name(collection_slug), *(column(name) for name in names))
    content = content.alias("content")
    registry = _REGISTRY.alias("collection")
    query = select(
        *(content.c[name] for name in names), registry.c.id.label(COLLECTION_ID_RESULT)
    ).select_from(
        content.join(
            registry, (registry.c.slug == collection_slug) & (registry.c.id == collection_id)
        )
    )
    return query, content


def content_row(
    connection: Connection,
    collection_slug: str,
    collection_id: str,
    discovery: ContentFields,
    content_id: str,
) -> dict[str, Any] | None:
    """One entry's row as `content_rows_query` reads it, or None."""
    query, content = content_rows_query(collection_slug, collection_id, discovery)
    row = connection.execute(query.where(content.c.id == content_id).limit(1)).first()
    return dict(row._mapping) if row is not None else None


def content_rows(
    connection: Connection,
    collection_slug: str,
    collection_id: str,
    discovery: ContentFields,
    content_ids: Sequence[str],
) -> dict[str, dict[str, Any]]:
    """`content_row` for many entries in one read, keyed by id (missing ones absent)."""
    query, content = content_rows_query(collection_slug, collection_id, discovery)
    found = connection.execute(
        query.where(in_text_list(content.c.id, "content_ids")), {"content_ids": list(content_ids)}
    )
    return {row.id: dict(row._mapping) for row in found}


def load_revision(connection: Connection, revision_id: str) -> dict[str, Any] | None:
    row = connection.execute(
        select(revisions.c.id, revisions.c.collection, revisions.c.entry_id, revisions.c.data)
        .where(revisions.c.id == revision_id)
        .limit(1)
    ).first()
    return dict(row._mapping) if row else None


def load_revisions(
    connection: Connection, revision_ids: Iterable[str]
) -> dict[str, dict[str, Any]]:
    """`load_revision` for many revisions in one read, keyed by id (missing ones absent)."""
    wanted = sorted(set(revision_ids))
    if not wanted:
        return {}
    rows = connection.execute(
        select(
            revisions.c.id, revisions.c.collection, revisions.c.entry_id, revisions.c.data
        ).where(in_text_list(revisions.c.id, "revision_ids")),
        {"revision_ids": wanted},
    )
    return {row.id: dict(row._mapping) for row in rows}


__all__ = [
    "CONTENT_SYSTEM_COLUMNS",
    "ContentFields",
    "content_columns",
    "content_row",
    "content_rows",
    "content_rows_query",
    "field_rows",
    "load_revision",
    "load_revisions",
]
