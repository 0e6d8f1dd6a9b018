"""Hostile documents and registry rows, on both dialects: an entry nested far deeper than
Python's recursion limit is indexed as EmDash indexes it and `verify` agrees; one registry or
field row with an invalid slug is reported with its code while every other collection is still
listed and verified."""

from __future__ import annotations

from sqlalchemy import text

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.integrity import verify as verify_module
from media_usage_orchestration.processing.integrity.verify import DriftKind, verify_index
from media_usage_orchestration.store.core import schema
from tests.conformance.processing.test_verify import drain
from tests.support.cli import EXIT_OK, EXIT_PROBLEM, invoke, invoke_json, trusted_collection
from tests.support.factories import insert_registry, insert_row, insert_status
from tests.support.projection import ADMISSION_FIELDS, active_collection, insert_entry
from tests.support.states import all_rows

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


# --- one invalid registry or field row ---------------------------------------------------------


def add_bad_field(db, collection_id: str, slug: str = "Bad-Slug") -> None:
    """A field row the CMS writer would refuse, written directly."""
    insert_row(
        db.engine,
        schema.fields,
        {
            "id": "field-bad",
            "collection_id": collection_id,
            "slug": slug,
            "label": slug,
            "type": "image",
            "column_type": "TEXT",
        },
    )


def assert_problem_line(result, *words: str) -> None:
    assert result.exit_code == EXIT_PROBLEM, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for word in words:
        assert word in result.stderr


def test_status_lists_every_collection_and_reports_an_invalid_registry_slug(db):
    trusted_collection(db)
    insert_registry(db.engine, id="collection-upper", slug="UPPER")

    result = invoke(db, "status")

    assert_problem_line(result, "UPPER", "MEDIA_USAGE_PROCESSING_FAILED", "Invalid collection slug")
    assert "posts" in result.stdout and "UPPER" in result.stdout
    listed = invoke_json(db, "status", exit_code=EXIT_PROBLEM)
    by_slug = {each["collection_slug"]: each for each in listed}
    assert by_slug["UPPER"]["problem_code"] == "MEDIA_USAGE_PROCESSING_FAILED"
    assert by_slug["UPPER"]["entries"] is None
    assert by_slug["posts"]["problem_code"] is None and by_slug["posts"]["entries"] == 0


def test_verify_reports_an_invalid_field_slug_and_verifies_the_rest(db):
    active_collection(db.engine, "posts")
    insert_entry(db.engine, "posts", "entry-1")
    pictures = active_collection(db.engine, "pictures")
    add_bad_field(db, pictures.id)
    drain(db.engine)

    result = invoke(db, "verify")

    assert result.exit_code == EXIT_PROBLEM, result.output
    assert "Traceback" not in result.output and result.stderr == ""
    assert "field_discovery_failed" in result.stdout and "1 differences" in result.stdout
    report = invoke_json(db, "verify", exit_code=EXIT_PROBLEM)
    (difference,) = report["differences"]
    assert difference["collection_slug"] == "pictures"
    assert difference["kind"] == DriftKind.FIELD_DISCOVERY_FAILED.value
    assert difference["detail"].startswith("MEDIA_USAGE_PROCESSING_FAILED: Invalid media usage")
    entries = {each["collection_slug"]: each["entry_count"] for each in report["collections"]}
    assert entries == {"pictures": 0, "posts": 1}


def test_verify_reports_an_invalid_captured_registry_slug_and_verifies_the_rest(db):
    active_collection(db.engine, "posts")
    insert_entry(db.engine, "posts", "entry-1")
    drain(db.engine)
    insert_registry(db.engine, id="collection-upper", slug="UPPER")
    insert_status(
        db.engine, scope_key="UPPER", collection_id="collection-upper", capture_state="active"
    )

    report = invoke_json(db, "verify", exit_code=EXIT_PROBLEM)

    (difference,) = report["differences"]
    assert (difference["collection_slug"], difference["kind"]) == (
        "UPPER",
        "field_discovery_failed",
    )
    assert difference["detail"].startswith("MEDIA_USAGE_PROCESSING_FAILED: Invalid collection slug")
    entries = {each["collection_slug"]: each["entry_count"] for each in report["collections"]}
    assert entries == {"UPPER": 0, "posts": 1}


def test_verify_reports_an_entry_whose_snapshots_fail_and_checks_the_others(db, monkeypatch):
    active_collection(db.engine, "posts")
    for content_id in ("entry-1", "entry-2", "entry-3"):
        insert_entry(db.engine, "posts", content_id)
    drain(db.engine)
    real = verify_module.build_content_snapshots

    def failing_for_entry_2(collection_id, slug, discovery, row, revision):
        if row["id"] == "entry-2":
            raise ValueError("unreadable entry")
        return real(collection_id, slug, discovery, row, revision)

    monkeypatch.setattr(verify_module, "build_content_snapshots", failing_for_entry_2)

    report = invoke_json(db, "verify", exit_code=EXIT_PROBLEM)

    (difference,) = report["differences"]
    assert (difference["content_id"], difference["kind"]) == ("entry-2", "snapshot_failed")
    assert difference["detail"] == "MEDIA_USAGE_PROCESSING_FAILED: ValueError: unreadable entry"
    assert [each["entry_count"] for each in report["collections"]] == [3]
