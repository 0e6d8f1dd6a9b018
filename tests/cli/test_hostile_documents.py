"""Hostile documents and registry rows: an entry nested far deeper than Python's recursion
limit is indexed as EmDash indexes it, and `verify` agrees, on both dialects."""

from __future__ import annotations

from sqlalchemy import text

from media_usage_orchestration.processing.verify import verify_index
from media_usage_orchestration.store import schema
from media_usage_orchestration.store.cms import CmsWriter
from tests.cli.cli_support import EXIT_OK, invoke
from tests.processing.projection_helpers import ADMISSION_FIELDS, active_collection
from tests.processing.test_verify import drain
from tests.support import all_rows

DEPTH = 10_000
DEEP_BODY = '[{"_type":"image","asset":{"_ref":"media-deep"}},' + "[" * DEPTH + "]" * DEPTH + "]"


def write_raw_json(db, slug: str, content_id: str, column: str, value: str) -> None:
    """Store JSON text the CMS writer could not serialize (too deep for Python's encoder)."""
    cast = "CAST(:value AS json)" if db.is_postgres else ":value"
    with db.engine.begin() as connection:
        connection.execute(
            text(f"UPDATE ec_{slug} SET {column} = {cast} WHERE id = :id"),
            {"value": value, "id": content_id},
        )


def test_a_deeply_nested_body_is_indexed_and_verified(db):
    active_collection(db.engine, "posts", ADMISSION_FIELDS)
    entry = {"id": "deep", "slug": "deep", "status": "published", "title": "Deep"}
    CmsWriter(db.engine).insert_entry("posts", entry)
    write_raw_json(db, "posts", "deep", "body", DEEP_BODY)

    drain(db.engine)

    rows = all_rows(db.engine, schema.occurrences)
    assert [(row["field_path"], row["provider_asset_id"]) for row in rows] == [
        ("body[0].asset._ref", "media-deep")
    ]
    assert verify_index(db.engine).differences == ()
    result = invoke(db, "verify")
    assert result.exit_code == EXIT_OK, result.output
    assert "Traceback" not in result.output and result.stderr == ""
    assert "No drift" in result.stdout
