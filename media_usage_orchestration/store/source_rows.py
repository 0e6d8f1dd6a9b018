"""The reads and guard pieces of EmDash's `MediaUsageRepository` that the single-row protocol
(`source_writes`) and the batch protocol (`source_batch_writes`) both use; the rows they read
and write are values of `source_records`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, LargeBinary, cast, column, func, select, table

from .engine import is_postgres
from .identifiers import content_table_name
from .schema import CLEANUP_TASK_KEY, cleanup, occurrences, sources
from .source_records import SourceRow

_MEASURED_OCCURRENCE_COLUMNS = (
    "field_slug",
    "field_path",
    "reference_type",
    "media_id",
    "provider",
    "provider_asset_id",
    "media_kind",
    "mime_type",
)


# --- reads and guard pieces -------------------------------------------------------------------


def content_table(collection_slug: str):
    """The columns of `ec_<slug>` a source's guards compare with its snapshot."""
    columns = ("id", "version", "updated_at", "live_revision_id", "draft_revision_id")
    return table(content_table_name(collection_slug), *(column(name) for name in columns))


def occurrence_bytes(dialect_name: str):
    payload = func.coalesce(occurrences.c[_MEASURED_OCCURRENCE_COLUMNS[0]], "")
    for name in _MEASURED_OCCURRENCE_COLUMNS[1:]:
        payload = payload.op("||")(func.coalesce(occurrences.c[name], ""))
    if dialect_name == "postgresql":
        return func.octet_length(payload)
    return func.length(cast(payload, LargeBinary))


def lock_cleanup(connection: Connection) -> None:
    """On PostgreSQL, order source deletes against a running projection GC pass."""
    if is_postgres(connection):
        connection.execute(
            select(cleanup.c.task_key)
            .where(cleanup.c.task_key == CLEANUP_TASK_KEY)
            .with_for_update(read=True)
        )


def sources_by_key(connection: Connection, source_keys: Sequence[str]) -> dict[str, SourceRow]:
    """The stored rows of `source_keys` inside the caller's transaction, keyed by source key."""
    unique = list(dict.fromkeys(source_keys))
    if not unique:
        return {}
    rows = connection.execute(select(sources).where(sources.c.source_key.in_(unique)))
    return {row.source_key: SourceRow.from_mapping(row._mapping) for row in rows}


__all__ = ["content_table", "lock_cleanup", "occurrence_bytes", "sources_by_key"]
