"""Rows of any table in any state, for tests that build database states directly.

One function per table: `<table>_row(**overrides)` returns the row with this module's
defaults (expressed once, here) and any column overridden; `insert_<table>(engine, ...)`
writes it. States are overrides too: the small presets below (`leased`, `expired`, `failed`,
`backing_off`) return column values to splat into a row. Times relative to now are database
time (`ago`, `from_now`), never the Python clock; `PAST` and `FUTURE` are fixed instants.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Engine, Table, insert, text
from sqlalchemy.sql.elements import ClauseElement

from media_usage_orchestration.emdash_double.cms_writer import Collection
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.clock import timestamp_offset
from media_usage_orchestration.store.core.schema import COLLECTION_SCOPE, CONTENT_ADAPTER_ID
from media_usage_orchestration.values.identifiers import content_table_name

PAST = "2000-01-01T00:00:00.000Z"
FUTURE = "2999-01-01T00:00:00.000Z"
LIVE_LEASE_SECONDS = 300

Row = dict[str, Any]


# --- database time ------------------------------------------------------------------------------


def ago(seconds: int) -> timestamp_offset:
    """Database time `seconds` ago, as a column value (backdating without sleeping)."""
    return timestamp_offset(-seconds)


def from_now(seconds: int) -> timestamp_offset:
    """Database time `seconds` from now, as a column value."""
    return timestamp_offset(seconds)


# --- states, as column overrides ----------------------------------------------------------------


def of(collection: Collection) -> Row:
    """The identity columns of a row that belongs to `collection`."""
    return {"collection_id": collection.id, "collection_slug": collection.slug}


def leased(
    token: str = "lease-token", *, seconds: int = LIVE_LEASE_SECONDS, expires_at: Any = None
) -> Row:
    """Held by a worker under a live lease (for `seconds`, or until the instant `expires_at`)."""
    return {
        "state": "leased",
        "lease_token": token,
        "lease_expires_at": from_now(seconds) if expires_at is None else expires_at,
    }


def expired(token: str = "lease-token", *, seconds_ago: int = 1, expired_at: Any = None) -> Row:
    """Leased, but the lease lapsed `seconds_ago` (or at the instant `expired_at`): a crashed
    worker's row."""
    return {
        "state": "leased",
        "lease_token": token,
        "lease_expires_at": ago(seconds_ago) if expired_at is None else expired_at,
    }


def failed(code: str, *, attempts: int = 5) -> Row:
    """Terminally failed after `attempts`, no lease held."""
    return {
        "state": "failed",
        "attempt_count": attempts,
        "last_error_code": code,
        "lease_token": None,
        "lease_expires_at": None,
    }


def backing_off(*, seconds: int = 60, until: Any = None) -> Row:
    """Waiting to be retried, `seconds` from now (or at the instant `until`)."""
    return {"state": "retry", "next_attempt_at": from_now(seconds) if until is None else until}


# --- one function per table ---------------------------------------------------------------------


def work_row(**overrides: Any) -> Row:
    return {
        "collection_id": "collection-1",
        "collection_slug": "posts",
        "content_id": "entry-1",
        "change_epoch": 1,
        "work_version": 1,
        "state": "pending",
        "attempt_count": 0,
        "next_attempt_at": PAST,
        "lease_token": None,
        "lease_expires_at": None,
        "last_attempted_at": None,
        "last_error_code": None,
        **overrides,
    }


def insert_work(engine: Engine, **overrides: Any) -> Row:
    return insert_row(engine, schema.work, work_row(**overrides))


def insert_works(engine: Engine, rows: Iterable[Mapping[str, Any]], **shared: Any) -> list[Row]:
    """Work rows, each `shared` + its own overrides."""
    return insert_all(engine, schema.work, [work_row(**shared, **row) for row in rows])


def reconciliation_row(**overrides: Any) -> Row:
    return {
        "collection_id": "collection-1",
        "collection_slug": "posts",
        "run_token": "run-token",
        "state": "pending",
        "phase": "scan",
        "next_attempt_at": PAST,
        **overrides,
    }


def insert_reconciliation(engine: Engine, **overrides: Any) -> Row:
    return insert_row(engine, schema.reconciliations, reconciliation_row(**overrides))


def deletion_row(**overrides: Any) -> Row:
    """A collection-deletion tombstone."""
    return {
        "collection_id": "collection-1",
        "collection_slug": "posts",
        "force_delete": 0,
        "state": "pending",
        "phase": "fence",
        "next_attempt_at": PAST,
        **overrides,
    }


def insert_deletion(engine: Engine, **overrides: Any) -> Row:
    return insert_row(engine, schema.collection_deletions, deletion_row(**overrides))


def source_row(source_key: str, **overrides: Any) -> Row:
    """A canonical content source of `collection-1` (identity_version 1); the content id is the
    key's last segment unless given."""
    return {
        "source_key": source_key,
        "source_type": "content",
        "collection_id": "collection-1",
        "collection_slug": "posts",
        "content_id": source_key.split(":")[-1],
        "source_variant": "columns",
        "current_generation": "generation-1",
        "identity_version": 1,
        **overrides,
    }


def insert_source(engine: Engine, source_key: str, **overrides: Any) -> Row:
    return insert_row(engine, schema.sources, source_row(source_key, **overrides))


def occurrence_row(source_key: str, index: int = 0, **overrides: Any) -> Row:
    """The `index`-th image-field occurrence of a source's generation."""
    return {
        "id": f"usage-{index:03d}",
        "source_key": source_key,
        "generation": "generation-1",
        "field_slug": "hero",
        "field_path": "hero",
        "occurrence_index": index,
        "reference_type": "image_field",
        "media_id": f"media-{index}",
        "provider_asset_id": f"media-{index}",
        **overrides,
    }


def insert_occurrences(engine: Engine, rows: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Occurrences, each given as `occurrence_row` arguments (`source_key`, `index`, overrides)."""
    return insert_all(engine, schema.occurrences, [occurrence_row(**row) for row in rows])


def status_row(**overrides: Any) -> Row:
    """A collection's coverage (index status) row."""
    return {
        "adapter_id": CONTENT_ADAPTER_ID,
        "scope_type": COLLECTION_SCOPE,
        "scope_key": "posts",
        "status": "stale",
        **overrides,
    }


def insert_status(engine: Engine, **overrides: Any) -> Row:
    return insert_row(engine, schema.index_status, status_row(**overrides))


def registry_row(**overrides: Any) -> Row:
    """A collection registry row (no content table: see `CmsWriter` for a whole collection)."""
    row = {"id": "collection-1", "slug": "posts", **overrides}
    return {"label": row["slug"], **row}


def insert_registry(engine: Engine, **overrides: Any) -> Row:
    return insert_row(engine, schema.collections, registry_row(**overrides))


def revision_row(**overrides: Any) -> Row:
    return {
        "id": "revision-1",
        "collection": "posts",
        "entry_id": "entry-1",
        "data": "{}",
        **overrides,
    }


def insert_revision(engine: Engine, **overrides: Any) -> Row:
    return insert_row(engine, schema.revisions, revision_row(**overrides))


def draft_revision(
    engine: Engine, slug: str, content_id: str, data: Any, *, revision_id: str | None = None
) -> str:
    """A revision of the entry (`data` as given when text, else as JSON) and the entry's
    draft pointer moved to it: a draft saved behind the CMS writer's back."""
    revision_id = revision_id or f"revision-{content_id}"
    encoded = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    row = revision_row(id=revision_id, collection=slug, entry_id=content_id, data=encoded)
    with engine.begin() as connection:
        connection.execute(insert(schema.revisions).values(**row))
        connection.execute(
            text(
                f"UPDATE {content_table_name(slug)} "
                "SET draft_revision_id = :revision WHERE id = :id"
            ),
            {"revision": revision_id, "id": content_id},
        )
    return revision_id


# --- writing ------------------------------------------------------------------------------------


def insert_row(engine: Engine, table: Table, row: Row) -> Row:
    insert_all(engine, table, [row])
    return row


def insert_all(engine: Engine, table: Table, rows: list[Row]) -> list[Row]:
    """Insert rows in one transaction. Rows holding SQL expressions (database time) are
    written one by one; plain rows in one executemany per column set."""
    with engine.begin() as connection:
        plain: dict[tuple[str, ...], list[Row]] = {}
        for row in rows:
            if any(isinstance(value, ClauseElement) for value in row.values()):
                connection.execute(insert(table).values(**row))
            else:
                plain.setdefault(tuple(row), []).append(row)
        for group in plain.values():
            connection.execute(insert(table), group)
    return rows
