"""An entry's projection inputs inside the caller's transaction: the rows `store.content`
reads, turned into a field discovery and snapshots by `media/`."""

from __future__ import annotations

from media_usage_orchestration.media.fields import FieldDiscovery, discover_fields
from media_usage_orchestration.media.snapshots import (
    SnapshotError,
    SnapshotResult,
    build_content_snapshots,
)
from media_usage_orchestration.store.content import content_row, field_rows, load_revision
from media_usage_orchestration.store.core.engine import Connection


def load_fields(
    connection: Connection, collection_slug: str, collection_id: str | None = None
) -> FieldDiscovery:
    """Discover the fields of the registry collection `collection_slug` (and `collection_id`,
    when given, so a replaced collection with the same slug is not read)."""
    return discover_fields(field_rows(connection, collection_slug, collection_id))


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
    row = content_row(connection, collection_slug, collection_id, discovery, content_id)
    if row is None:
        return SnapshotResult(error=SnapshotError.CONTENT_NOT_FOUND)
    revision = None
    if isinstance(row.get("draft_revision_id"), str) and row["draft_revision_id"]:
        revision = load_revision(connection, row["draft_revision_id"])
    return build_content_snapshots(collection_id, collection_slug, discovery, row, revision)


__all__ = ["load_content_snapshots", "load_fields"]
