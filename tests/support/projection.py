"""Shared states for the work processor, projection and verify tests: an active, trusted,
captured collection (EmDash's `createActiveFixture`), entries and index lookups."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, func, select

from media_usage_orchestration.emdash_double.cms_writer import (
    CmsWriter,
    Collection,
    FieldSpec,
    SubField,
)
from media_usage_orchestration.emdash_double.sample_content import (
    MEDIA_FIELDS,
    draft_revision_data,
    sample_entries,
    sample_entry,
)
from media_usage_orchestration.media.sources import source_key
from media_usage_orchestration.processing.work.processor import process_due_batch
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.sources.writes import SourceRepository
from media_usage_orchestration.values.source_records import SourceRow
from tests.support.factories import draft_revision
from tests.support.states import IMAGE_ONLY, count, one, set_activation, set_status
from tests.support.triggers import create_trigger, drop_trigger

ADMISSION_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("title", "string"),
    FieldSpec("body", "portableText"),
    FieldSpec("sections", "repeater", sub_fields=(SubField("image", "image"),)),
)
NON_STATEMENTS = ("BEGIN", "BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")


def active_collection(
    engine: Engine,
    slug: str,
    fields: Sequence[FieldSpec] = IMAGE_ONLY,
    *,
    collection_id: str | None = None,
) -> Collection:
    """Capture active, the collection captured by triggers, and coverage trusted `complete`.
    A fixed `collection_id` lets two databases hold the same source keys."""
    set_activation(engine, "active")
    collection = CmsWriter(engine).create_collection(slug, fields, collection_id=collection_id)
    set_status(
        engine,
        slug,
        status="complete",
        completed_at="2026-08-01T00:00:00.000Z",
        reconciliation_required=0,
    )
    return collection


def processed_collection(engine, slug: str = "articles", entries: int = 8):
    """A captured collection of sample content (drafts, a trash, every media shape), with
    all of its work processed."""
    collection = active_collection(engine, slug, MEDIA_FIELDS)
    writer = CmsWriter(engine)
    writer.insert_entries(slug, sample_entries(slug[:3], entries))
    for index in (0, 3):
        entry = sample_entry(slug[:3], index)
        writer.save_draft(slug, entry["id"], draft_revision_data(entry))
    writer.trash_entry(slug, sample_entry(slug[:3], 5)["id"])
    drain(engine)
    return collection


def drain(engine: Engine) -> None:
    """Process every due work item; none may be left."""
    for _ in range(20):
        if process_due_batch(engine, 25).counts.claimed == 0:
            break
    assert count(engine, schema.work) == 0


def image(media_id: str) -> dict[str, str]:
    return {"id": media_id, "provider": "local", "mimeType": "image/webp"}


def insert_entry(engine: Engine, slug: str, content_id: str, media_id: str = "media-1") -> None:
    CmsWriter(engine).insert_entry(
        slug,
        {
            "id": content_id,
            "slug": content_id,
            "status": "published",
            "title": content_id,
            "hero": image(media_id),
        },
    )


def measurement_data(count_: int, prefix: str) -> dict[str, list[dict[str, Any]]]:
    """EmDash's `mediaUsageMeasurementData`: `count_` references split between portable text
    images and repeater images."""
    body = [
        {"_type": "image", "_key": f"body-{index}", "asset": {"_ref": f"{prefix}-body-{index}"}}
        for index in range((count_ + 1) // 2)
    ]
    sections = [
        {"_key": f"section-{index}", "image": image(f"{prefix}-section-{index}")}
        for index in range(count_ // 2)
    ]
    return {"body": body, "sections": sections}


def insert_measured_entry(
    engine: Engine, slug: str, content_id: str, occurrences: int, title: str | None = None
) -> None:
    CmsWriter(engine).insert_entry(
        slug,
        {
            "id": content_id,
            "slug": content_id,
            "status": "published",
            "title": title if title is not None else content_id,
            **measurement_data(occurrences, content_id),
        },
    )


def add_measured_draft(
    engine: Engine, collection: Collection, content_id: str, data: dict[str, Any]
) -> str:
    """A `revisions` row named `revision-<id>` and the entry pointing at it (a captured write)."""
    return draft_revision(engine, collection.slug, content_id, data)


def canonical_key(collection: Collection, content_id: str, variant: str = "columns") -> str:
    return source_key(collection.id, content_id, variant)


def find_source(engine: Engine, key: str) -> SourceRow | None:
    return SourceRepository(engine).find_source(key)


def current_occurrence_count(engine: Engine, key: str) -> int:
    source = find_source(engine, key)
    if source is None:
        return 0
    return count(engine, schema.occurrences, source_key=key, generation=source.current_generation)


def occurrence_count(engine: Engine, key: str) -> int:
    return count(engine, schema.occurrences, source_key=key)


def work_count(engine: Engine) -> int:
    return count(engine, schema.work)


def work_for(engine: Engine, content_id: str) -> dict[str, Any] | None:
    return one(engine, schema.work, content_id=content_id)


def coverage(engine: Engine, collection: Collection) -> dict[str, Any]:
    row = one(engine, schema.index_status, collection_id=collection.id)
    assert row is not None
    return row


def sql_statements(statements: Sequence[str]) -> list[str]:
    """Recorded statements minus transaction control (not queries in EmDash's count)."""
    return [each for each in statements if each.strip().upper() not in NON_STATEMENTS]


def row_trigger(db, name: str, table: str, body: str, when: str | None = None) -> None:
    """An AFTER INSERT row trigger running `body` (may use NEW.<column>): a concurrent writer
    acting between two statements of the code under test."""
    create_trigger(db.engine, name, table=table, event="AFTER INSERT", action=body, when=when)


def drop_row_trigger(db, name: str, table: str) -> None:
    drop_trigger(db.engine, name, table)


def supersede_work_sql(content_id: str) -> str:
    """A re-enqueue of the entry's work (EmDash's projection supersession trigger)."""
    return (
        "UPDATE _emdash_media_usage_work SET work_version = work_version + 1, "
        "state = 'pending', lease_token = NULL, lease_expires_at = NULL, "
        f"next_attempt_at = updated_at WHERE content_id = '{content_id}'"
    )


def total_rows(engine: Engine, table) -> int:
    with engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(table)).scalar_one()
