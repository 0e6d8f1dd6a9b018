"""EmDash core's `media` table (the EmDash double creates it with EmDash's own DDL), its rows,
and the media the content references, read from the content itself."""

from __future__ import annotations

import json

from sqlalchemy import Engine, MetaData, Table, insert, select

from media_usage_orchestration.emdash_double import media_library as emdash_media
from media_usage_orchestration.emdash_double import sample_content
from media_usage_orchestration.media.snapshots import deserialize_column_value
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.host.registry import list_collection_slugs
from media_usage_orchestration.store.sources.usage import media_library
from media_usage_orchestration.values.identifiers import content_table_name


def create_media_table(engine: Engine) -> None:
    with engine.begin() as connection:
        assert emdash_media.create_media_table(connection)


def add_media(engine: Engine, *items: tuple[str, int | None]) -> None:
    """Media rows `(id, size)`, images in local storage."""
    rows = [
        {
            "id": media_id,
            "filename": f"{media_id}.webp",
            "mime_type": "image/webp",
            "size": size,
            "storage_key": f"uploads/{media_id}.webp",
            "status": "ready",
        }
        for media_id, size in items
    ]
    with engine.begin() as connection:
        connection.execute(insert(media_library), rows)


def media_referenced_by_content(engine: Engine) -> set[str]:
    """Every local media id the registry's collections reference now, read from the content
    (each entry's columns, trashed entries too, and its draft revision), not from the index."""
    referenced: set[str] = set()
    with engine.connect() as connection:
        for slug in list_collection_slugs(connection):
            table = Table(content_table_name(slug), MetaData(), autoload_with=connection)
            for row in connection.execute(select(table)).mappings():
                values = {key: deserialize_column_value(value) for key, value in row.items()}
                referenced.update(_media_ids(values))
                if row["draft_revision_id"]:
                    draft = _revision_data(connection, row["draft_revision_id"])
                    referenced.update(_media_ids({**values, **draft}))
    return referenced


def _media_ids(data: dict) -> set[str]:
    return {media_id for media_id, _ in sample_content.local_media(data)}


def _revision_data(connection, revision_id: str) -> dict:
    statement = select(schema.revisions.c.data).where(schema.revisions.c.id == revision_id)
    return json.loads(connection.execute(statement).scalar_one())
