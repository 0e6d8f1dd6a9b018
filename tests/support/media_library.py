"""EmDash core's `media` table (the EmDash double creates it with EmDash's own DDL) and its rows."""

from __future__ import annotations

from sqlalchemy import Engine, insert

from media_usage_orchestration.emdash_double import media_library as emdash_media
from media_usage_orchestration.store.sources.usage import media_library


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
