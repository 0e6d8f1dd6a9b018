"""Reading one entry's projection inputs (EmDash `content-snapshots.ts`).

The content row is read joined to the exact registry identity, so an entry of a replaced
collection with the same slug reads as absent. The result is the entry's snapshots - the
`columns` source, then the `draft_overlay` source when the row names a draft revision - or the
reason none can be built.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Select, column, select, table

from ..store.identifiers import content_table_name, validate_identifier
from ..store.schema import collections, narrow, revisions
from .fields import FieldDiscovery, load_fields
from .sources import (
    ContentSource,
    DraftRevisionError,
    build_columns_source,
    build_draft_overlay_source,
)

CONTENT_SYSTEM_COLUMNS = (
    "id",
    "slug",
    "status",
    "created_at",
    "updated_at",
    "published_at",
    "scheduled_at",
    "deleted_at",
    "version",
    "live_revision_id",
    "draft_revision_id",
    "locale",
    "translation_group",
)
COLLECTION_ID_RESULT = "__emdash_media_usage_collection_id"
_REGISTRY = narrow(collections, "id", "slug")


class SnapshotError(StrEnum):
    CONTENT_NOT_FOUND = "CONTENT_NOT_FOUND"
    DRAFT_REVISION_NOT_FOUND = "DRAFT_REVISION_NOT_FOUND"
    DRAFT_REVISION_INVALID = "DRAFT_REVISION_INVALID"
    DRAFT_REVISION_MISMATCH = "DRAFT_REVISION_MISMATCH"


@dataclass(frozen=True)
class SnapshotResult:
    """`snapshots` in order (columns, then draft overlay), or `error`. On a draft revision
    error, `attempted_source` is the draft source that could not be built."""

    snapshots: tuple[ContentSource, ...] = ()
    error: SnapshotError | None = None
    attempted_source: ContentSource | None = None

    @property
    def success(self) -> bool:
        return self.error is None


def content_columns(discovery: FieldDiscovery) -> tuple[str, ...]:
    """System columns, then extraction and display field columns, each once."""
    names = tuple(dict.fromkeys([*CONTENT_SYSTEM_COLUMNS, *discovery.column_slugs]))
    for name in names:
        validate_identifier(name, "content media usage column")
    return names


def content_rows_query(
    collection_slug: str, collection_id: str, discovery: FieldDiscovery
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


def load_content_snapshots(
    connection: Connection,
    collection_slug: str,
    content_id: str,
    collection_id: str,
    discovery: FieldDiscovery | None = None,
) -> SnapshotResult:
    """The canonical snapshots of one entry of the collection (`collection_id`, slug)."""
    if not collection_id:
        raise ValueError("Canonical media usage snapshots require a collection identity")
    if discovery is None:
        discovery = load_fields(connection, collection_slug, collection_id)
    query, content = content_rows_query(collection_slug, collection_id, discovery)
    row = connection.execute(query.where(content.c.id == content_id).limit(1)).first()
    if row is None:
        return SnapshotResult(error=SnapshotError.CONTENT_NOT_FOUND)
    values = dict(row._mapping)
    revision = None
    if isinstance(values.get("draft_revision_id"), str) and values["draft_revision_id"]:
        revision = load_revision(connection, values["draft_revision_id"])
    return build_content_snapshots(collection_id, collection_slug, discovery, values, revision)


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
        ).where(revisions.c.id.in_(wanted))
    )
    return {row.id: dict(row._mapping) for row in rows}


def build_content_snapshots(
    collection_id: str,
    collection_slug: str,
    discovery: FieldDiscovery,
    row: Mapping[str, Any],
    revision: Mapping[str, Any] | None,
) -> SnapshotResult:
    """Snapshots of a content row read by `content_rows_query`, with its draft revision row
    (None when the row has no draft or the revision does not exist)."""
    read_collection_id = row.get(COLLECTION_ID_RESULT)
    if not isinstance(read_collection_id, str) or not read_collection_id:
        raise ValueError("Media usage snapshot query did not return a collection identity")
    columns = build_columns_source(read_collection_id, collection_slug, discovery, row)
    if not row.get("draft_revision_id"):
        return SnapshotResult(snapshots=(columns,))
    try:
        draft = build_draft_overlay_source(
            read_collection_id, collection_slug, discovery, row, revision
        )
    except DraftRevisionError as error:
        return SnapshotResult(
            snapshots=(columns,), error=SnapshotError(error.code), attempted_source=error.source
        )
    return SnapshotResult(snapshots=(columns, draft))


__all__ = [
    "COLLECTION_ID_RESULT",
    "CONTENT_SYSTEM_COLUMNS",
    "SnapshotError",
    "SnapshotResult",
    "build_content_snapshots",
    "content_columns",
    "content_rows_query",
    "load_content_snapshots",
    "load_revision",
    "load_revisions",
]
