"""The same entry gives the same source on SQLite (JSON columns read as text) and PostgreSQL
(`json` columns read back decoded)."""

from __future__ import annotations

from sqlalchemy import text

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, FieldSpec, SubField
from media_usage_orchestration.media.snapshots import build_columns_source
from media_usage_orchestration.processing.work.content_reads import load_fields
from media_usage_orchestration.store.core.schema import SYSTEM_COLUMNS

COLLECTION_ID = "01JDIALECT0000000000000000"
FIELDS = (
    FieldSpec("title", "string"),
    FieldSpec("hero", "image"),
    FieldSpec("body", "portableText"),
    FieldSpec("gallery", "repeater", sub_fields=(SubField("image", "image"),)),
)
ENTRY = {
    "id": "entry-1",
    "slug": "entry-one",
    "status": "published",
    "title": "Entrée ☕",
    "hero": {"id": "hero-1", "mimeType": "image/jpeg"},
    "body": [{"_type": "image", "asset": {"_ref": "pt-1", "mimeType": "image/png"}}],
    "gallery": [{"image": {"id": "gal-1", "provider": "cloudinary"}}, {"image": "gal-2"}],
}
PLAIN_ROW = {**ENTRY, "locale": "en", "translation_group": "entry-1", "version": 1}


def test_sources_are_dialect_independent(db):
    writer = CmsWriter(db.engine)
    writer.create_collection("posts", FIELDS, collection_id=COLLECTION_ID)
    writer.insert_entry("posts", ENTRY)
    with db.engine.connect() as connection:
        discovery = load_fields(connection, "posts", COLLECTION_ID)
        columns = ", ".join(f'"{name}"' for name in (*SYSTEM_COLUMNS, *discovery.column_slugs))
        row = connection.execute(text(f"SELECT {columns} FROM ec_posts")).mappings().one()

    source = build_columns_source(COLLECTION_ID, "posts", discovery, row)
    expected = build_columns_source(COLLECTION_ID, "posts", discovery, PLAIN_ROW)
    assert source.source_fingerprint == expected.source_fingerprint
    assert source.occurrences == expected.occurrences
    assert [item.field_path for item in source.occurrences] == [
        "body[0].asset._ref",
        "gallery[0].image",
        "gallery[1].image",
        "hero",
    ]
