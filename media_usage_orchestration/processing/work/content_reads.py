"""An entry's projection inputs: the rows `store.content` reads, turned into a field discovery
and snapshots by `media/`. The rows are read in a short read transaction that ends before
extraction, canonical JSON and fingerprints run, so no transaction stays open across them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from media_usage_orchestration.media.fields import FieldDiscovery, discover_fields
from media_usage_orchestration.media.snapshots import (
    SnapshotError,
    SnapshotResult,
    build_content_snapshots,
)
from media_usage_orchestration.store.core.engine import Connection, Engine, read_transaction
from media_usage_orchestration.store.host.content import content_row, field_rows, load_revision


@dataclass(frozen=True)
class EntryRows:
    """What one entry's snapshots are built from, as read: its collection's field discovery,
    its content row (None: absent) and the draft revision the row points at (if any)."""

    discovery: FieldDiscovery
    row: dict[str, Any] | None
    revision: dict[str, Any] | None


def load_fields(
    connection: Connection, collection_slug: str, collection_id: str | None = None
) -> FieldDiscovery:
    """Discover the fields of the registry collection `collection_slug` (and `collection_id`,
    when given, so a replaced collection with the same slug is not read)."""
    return discover_fields(field_rows(connection, collection_slug, collection_id))


def read_fields(
    engine: Engine, collection_slug: str, collection_id: str | None = None
) -> FieldDiscovery:
    """`load_fields` in a read of its own, the discovery made after it ended."""
    with read_transaction(engine) as connection:
        rows = field_rows(connection, collection_slug, collection_id)
    return discover_fields(rows)


def _read_entry(
    connection: Connection, collection_slug: str, content_id: str, collection_id: str
) -> EntryRows:
    """One entry's rows inside the caller's transaction (the discovery decides the columns)."""
    discovery = load_fields(connection, collection_slug, collection_id)
    row = content_row(connection, collection_slug, collection_id, discovery, content_id)
    revision_id = row.get("draft_revision_id") if row is not None else None
    revision = None
    if isinstance(revision_id, str) and revision_id:
        revision = load_revision(connection, revision_id)
    return EntryRows(discovery, row, revision)


def _snapshots(collection_id: str, collection_slug: str, entry: EntryRows) -> SnapshotResult:
    if entry.row is None:
        return SnapshotResult(error=SnapshotError.CONTENT_NOT_FOUND)
    return build_content_snapshots(
        collection_id, collection_slug, entry.discovery, entry.row, entry.revision
    )


def load_content_snapshots(
    engine: Engine, collection_slug: str, content_id: str, collection_id: str
) -> SnapshotResult:
    """The canonical snapshots of one entry of the collection (`collection_id`, slug): its rows
    read in a read transaction of their own, its snapshots built after it ended."""
    if not collection_id:
        raise ValueError("Canonical media usage snapshots require a collection identity")
    with read_transaction(engine) as connection:
        entry = _read_entry(connection, collection_slug, content_id, collection_id)
    return _snapshots(collection_id, collection_slug, entry)


__all__ = ["EntryRows", "load_content_snapshots", "load_fields", "read_fields"]
