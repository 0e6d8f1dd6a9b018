"""The reads and guard pieces of EmDash's `MediaUsageRepository` that the single-row protocol
(`source_writes`) and the batch protocol (`source_batch_writes`) both use; the rows they read
and write are values of `source_records`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Dialect, LargeBinary, cast, column, func, select, table
from sqlalchemy.sql import ClauseElement

from media_usage_orchestration.store.core.engine import is_postgres
from media_usage_orchestration.store.core.id_lists import in_text_list
from media_usage_orchestration.store.core.schema import (
    CLEANUP_TASK_KEY,
    cleanup,
    occurrences,
    sources,
)
from media_usage_orchestration.values.identifiers import content_table_name
from media_usage_orchestration.values.source_records import SourceRow

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


_SOURCES_BY_KEY = select(sources).where(in_text_list(sources.c.source_key, "source_keys"))


def sources_by_key(connection: Connection, source_keys: Sequence[str]) -> dict[str, SourceRow]:
    """The stored rows of `source_keys` inside the caller's transaction, keyed by source key."""
    unique = list(dict.fromkeys(source_keys))
    if not unique:
        return {}
    rows = connection.execute(_SOURCES_BY_KEY, {"source_keys": unique})
    return {row.source_key: SourceRow.from_row(row._mapping) for row in rows}


# --- one statement, many rows -------------------------------------------------------------------


@dataclass(frozen=True)
class _ManyRows:
    """A statement compiled once for `executemany`: its SQL, and for each parameter either a
    row key or the value the statement itself binds (a literal it compares with)."""

    sql: str
    positional: bool
    slots: tuple[tuple[bool, Any], ...]  # (from the row?, row key or fixed value)
    fixed: Mapping[str, Any]

    def parameters(self, rows: Sequence[Mapping[str, Any]]) -> list:
        if self.positional:
            slots = self.slots
            return [tuple([row[key] if own else key for own, key in slots]) for row in rows]
        return [{**self.fixed, **row} for row in rows]


@functools.lru_cache(maxsize=128)
def _many_rows(
    dialect: Dialect, statement: ClauseElement, column_keys: tuple[str, ...] | None
) -> _ManyRows:
    compiled = statement.compile(
        dialect=dialect, column_keys=list(column_keys) if column_keys is not None else None
    )
    if compiled.literal_execute_params or compiled.post_compile_params:
        raise ValueError("A statement run for many rows cannot expand parameters")
    if any(compiled._bind_processors.values()):
        raise ValueError("A statement run for many rows must bind its values as they are")
    values = compiled.construct_params(_check=False)
    required = {bind.key for bind in compiled.binds.values() if bind.required}
    if column_keys is not None:
        required |= set(column_keys)
    fixed = {name: value for name, value in values.items() if name not in required}
    names = compiled.positiontup or ()
    slots = tuple((name in required, name if name in required else fixed[name]) for name in names)
    return _ManyRows(compiled.string, bool(compiled.positional), slots, fixed)


def execute_many(
    connection: Connection,
    statement: ClauseElement,
    rows: Sequence[Mapping[str, Any]],
    column_keys: tuple[str, ...] | None = None,
) -> None:
    """`statement` once per row in one driver `executemany`, every row keyed by the
    statement's unvalued parameters (or, for a plain INSERT, by `column_keys`).

    `connection.execute(statement, rows)` would run each row through SQLAlchemy's parameter
    processing, which for a page's occurrences costs more than the driver's insert; the
    statement is compiled once per dialect instead and its rows handed to the driver as they
    are. Each row's statement is still the whole statement, its guards included."""
    if not rows:
        return
    many = _many_rows(connection.dialect, statement, column_keys)
    connection.exec_driver_sql(many.sql, many.parameters(rows))


__all__ = [
    "content_table",
    "execute_many",
    "lock_cleanup",
    "occurrence_bytes",
    "sources_by_key",
]
