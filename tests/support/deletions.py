"""Builders for collection-deletion states shared by the deletion tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Engine, inspect, update

from media_usage_orchestration.emdash_double.cms_writer import Collection
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.deletion.records import (
    DeletionClaim,
    DeletionPhase,
    DeletionRecord,
)
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from tests.support.factories import (
    insert_occurrences,
    insert_reconciliation,
    insert_source,
    insert_works,
    of,
)
from tests.support.states import backdate, one

LEASE_SECONDS = 300
FIXED_TIME = "2026-01-01T00:00:00.000Z"


def tombstone(
    engine: Engine,
    collection: Collection,
    phase: DeletionPhase = DeletionPhase.FENCE,
    *,
    force: bool = False,
) -> DeletionRecord:
    """A pending tombstone already moved to `phase` (as if earlier phases had run)."""
    record = DeletionRepository(engine).create_tombstone(collection.id, collection.slug, force)
    if phase is not DeletionPhase.FENCE:
        table = schema.collection_deletions
        with engine.begin() as connection:
            connection.execute(
                update(table)
                .where(table.c.collection_id == collection.id)
                .values(phase=phase.value)
            )
    return record


def claimed(
    engine: Engine,
    collection: Collection,
    phase: DeletionPhase = DeletionPhase.FENCE,
    *,
    force: bool = False,
) -> DeletionClaim:
    tombstone(engine, collection, phase, force=force)
    claim = DeletionRepository(engine).claim(collection.id, phase, LEASE_SECONDS)
    assert claim is not None
    return claim


def expire_lease(engine: Engine, collection_id: str, seconds_ago: int = 1) -> None:
    table = schema.collection_deletions
    assert backdate(engine, table, "lease_expires_at", seconds_ago, collection_id=collection_id)


def set_tombstone(engine: Engine, collection_id: str, **values) -> None:
    table = schema.collection_deletions
    with engine.begin() as connection:
        connection.execute(
            update(table).where(table.c.collection_id == collection_id).values(**values)
        )


def add_work(
    engine: Engine, collection: Collection, content_ids: Iterable[str], state: str = "pending"
) -> None:
    insert_works(
        engine,
        [{"content_id": content_id} for content_id in content_ids],
        **of(collection),
        state=state,
        next_attempt_at=FIXED_TIME,
    )


def add_source(
    engine: Engine,
    source_key: str,
    *,
    collection_id: str | None,
    collection_slug: str,
    identity_version: int | None = 1,
    occurrence_ids: Iterable[str] = (),
) -> None:
    insert_source(
        engine,
        source_key,
        collection_id=collection_id,
        collection_slug=collection_slug,
        content_id="entry-000",
        current_generation="gen-1",
        identity_version=identity_version,
    )
    insert_occurrences(
        engine,
        [
            {"source_key": source_key, "index": index, "id": occurrence_id, "generation": "gen-1"}
            for index, occurrence_id in enumerate(occurrence_ids)
        ],
    )


def add_reconciliation(engine: Engine, collection: Collection) -> None:
    insert_reconciliation(
        engine, **of(collection), run_token=f"run-{collection.slug}", next_attempt_at=FIXED_TIME
    )


def ids(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{index:03d}" for index in range(count)]


def tombstone_row(engine: Engine, collection_id: str) -> dict[str, Any] | None:
    """The collection's deletion tombstone, or None."""
    return one(engine, schema.collection_deletions, collection_id=collection_id)


def table_exists(engine: Engine, name: str) -> bool:
    return inspect(engine).has_table(name)
