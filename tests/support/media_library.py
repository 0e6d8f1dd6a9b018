"""EmDash core's `media` table, created from EmDash's own schema dumps, and its rows."""

from __future__ import annotations

import re

from sqlalchemy import Engine, insert

from media_usage_orchestration.store.sources.usage import media_library
from tests.fixtures import SCHEMA_POSTGRES, SCHEMA_SQLITE


def _media_ddl(dialect: str) -> str:
    if dialect == "postgresql":
        match = re.search(r"CREATE TABLE public\.media \(.*?\);", SCHEMA_POSTGRES.read_text(), re.S)
        assert match, "EmDash's PostgreSQL dump has no media table"
        return match.group(0).replace("public.", "")
    match = re.search(r'CREATE TABLE "media" \(.*?\);\n', SCHEMA_SQLITE.read_text(), re.S)
    assert match, "EmDash's SQLite dump has no media table"
    return match.group(0)


def create_media_table(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.exec_driver_sql(_media_ddl(engine.dialect.name))


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
