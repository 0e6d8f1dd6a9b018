"""EmDash core's media library: the `media` table exactly as EmDash creates it on each dialect,
and rows shaped like its uploads (filename, mime type, size, image dimensions, storage key,
content hash), for the demo and the tests. The project itself only ever reads this table
(`store/sources/usage.py`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, insert, inspect

from media_usage_orchestration.store.sources.usage import media_library

# Verbatim from EmDash's schema dumps (tests/fixtures/emdash-schema.*.sql; a unit test keeps
# them equal): the table, its primary key and its six indexes.
MEDIA_TABLE_DDL: dict[str, tuple[str, ...]] = {
    "sqlite": (
        'CREATE TABLE "media" ("id" text primary key, "filename" text not null, "mime_type" text '
        'not null, "size" integer, "width" integer, "height" integer, "alt" text, "caption" '
        'text, "storage_key" text not null, "content_hash" text, "created_at" text default '
        "(datetime('now')), \"author_id\" text, \"status\" text default 'ready' not null, "
        "blurhash TEXT, dominant_color TEXT);",
        'CREATE INDEX "idx_media_content_hash" on "media" ("content_hash");',
        'CREATE INDEX "idx_media_created_at" on "media" ("created_at");',
        'CREATE INDEX "idx_media_filename" on "media" ("filename");',
        'CREATE INDEX "idx_media_mime_type" on "media" ("mime_type");',
        'CREATE INDEX "idx_media_status" on "media" ("status");',
        'CREATE INDEX "idx_media_storage_key" on "media" ("storage_key");',
    ),
    "postgresql": (
        "CREATE TABLE public.media (\n"
        "    id text NOT NULL,\n"
        "    filename text NOT NULL,\n"
        "    mime_type text NOT NULL,\n"
        "    size integer,\n"
        "    width integer,\n"
        "    height integer,\n"
        "    alt text,\n"
        "    caption text,\n"
        "    storage_key text NOT NULL,\n"
        "    content_hash text,\n"
        "    created_at text DEFAULT CURRENT_TIMESTAMP,\n"
        "    author_id text,\n"
        "    status text DEFAULT 'ready'::text NOT NULL,\n"
        "    blurhash text,\n"
        "    dominant_color text\n"
        ");",
        "ALTER TABLE ONLY public.media\n    ADD CONSTRAINT media_pkey PRIMARY KEY (id);",
        "CREATE INDEX idx_media_content_hash ON public.media USING btree (content_hash);",
        "CREATE INDEX idx_media_created_at ON public.media USING btree (created_at);",
        "CREATE INDEX idx_media_filename ON public.media USING btree (filename);",
        "CREATE INDEX idx_media_mime_type ON public.media USING btree (mime_type);",
        "CREATE INDEX idx_media_status ON public.media USING btree (status);",
        "CREATE INDEX idx_media_storage_key ON public.media USING btree (storage_key);",
    ),
}
# The extension of each kind of file and its size in bytes, low and high: sizes are spread
# between them by the media id.
_KINDS = {
    "image/jpeg": (".jpg", 90_000, 2_400_000),
    "image/png": (".png", 30_000, 900_000),
    "image/gif": (".gif", 150_000, 3_000_000),
    "image/webp": (".webp", 40_000, 600_000),
    "image/avif": (".avif", 30_000, 400_000),
    "image/svg+xml": (".svg", 2_000, 80_000),
    "application/pdf": (".pdf", 60_000, 6_000_000),
    "video/mp4": (".mp4", 4_000_000, 90_000_000),
    "audio/mpeg": (".mp3", 1_500_000, 12_000_000),
    "application/zip": (".zip", 400_000, 40_000_000),
    "text/plain": (".txt", 800, 60_000),
}
_OTHER_KIND = ("", 10_000, 1_000_000)
_DIMENSIONS = ((1600, 900), (1200, 1200), (800, 600), (2400, 1600), (640, 960))


@dataclass(frozen=True)
class MediaFile:
    """One upload: its media id, the filename it was uploaded as and its mime type."""

    id: str
    mime_type: str
    filename: str | None = None


def create_media_table(connection: Connection) -> bool:
    """EmDash's `media` table with its indexes, unless the database has one already (an EmDash
    database always does); True when it was created."""
    if inspect(connection).has_table(media_library.name):
        return False
    for statement in MEDIA_TABLE_DDL[connection.dialect.name]:
        # The dump names the `public` schema; the table belongs in the connection's own.
        connection.exec_driver_sql(statement.replace("public.", ""))
    return True


def add_media(connection: Connection, files: Iterable[MediaFile]) -> int:
    """Insert one `ready` media row per file, in one statement; returns the rows."""
    rows = [media_row(file) for file in files]
    if rows:
        connection.execute(insert(media_library), rows)
    return len(rows)


def media_row(file: MediaFile) -> dict[str, Any]:
    """The row EmDash's upload would write: size, dimensions and hash derived from the id, so
    the same file always gets the same row."""
    digest = hashlib.sha256(file.id.encode()).digest()
    mime = file.mime_type.split(";")[0].strip()
    extension, low, high = _KINDS.get(mime, _OTHER_KIND)
    row: dict[str, Any] = {
        "id": file.id,
        "filename": file.filename or f"{file.id}{extension}",
        "mime_type": file.mime_type,
        "size": low + int.from_bytes(digest[:4]) % (high - low),
        "storage_key": f"{file.id}{extension}",
        "content_hash": digest.hex(),
        "status": "ready",
        "width": None,
        "height": None,
        "dominant_color": None,
    }
    if mime.startswith("image/"):
        row["width"], row["height"] = _DIMENSIONS[digest[4] % len(_DIMENSIONS)]
        row["dominant_color"] = f"#{digest[5:8].hex()}"
    return row
