"""The index oracle: `verify_index` and `media-usage verify`, on both dialects."""

from __future__ import annotations

from click.testing import CliRunner
from sqlalchemy import delete, select, update

from media_usage_orchestration.cli import main
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import sample_entry
from media_usage_orchestration.processing.integrity.verify import DriftKind, verify_index
from media_usage_orchestration.store.core import schema
from tests.support.projection import (
    active_collection,
    canonical_key,
    drain,
    insert_entry,
    processed_collection,
)
from tests.support.states import count


def test_no_drift_after_processing(db):
    collection = processed_collection(db.engine)

    report = verify_index(db.engine)

    assert report.differences == ()
    assert not report.has_drift
    (summary,) = report.collections
    assert (summary.collection_id, summary.entry_count) == (collection.id, 8)
    assert summary.source_count == 10  # 8 columns sources and 2 draft overlays
    assert summary.abandoned_occurrence_count == 0
    assert summary.pending_work_count == 0


def test_a_deleted_occurrence_row_is_drift(db):
    collection = processed_collection(db.engine)
    key = canonical_key(collection, sample_entry("art", 2)["id"])
    with db.engine.begin() as connection:
        victim = connection.execute(
            select(schema.occurrences.c.id, schema.occurrences.c.field_path)
            .where(schema.occurrences.c.source_key == key)
            .limit(1)
        ).one()
        connection.execute(delete(schema.occurrences).where(schema.occurrences.c.id == victim.id))

    report = verify_index(db.engine)

    assert [difference.kind for difference in report.differences] == [DriftKind.MISSING_OCCURRENCE]
    (difference,) = report.differences
    assert difference.source_key == key
    assert victim.field_path in difference.detail


def test_a_tampered_fingerprint_is_drift(db):
    collection = processed_collection(db.engine)
    key = canonical_key(collection, sample_entry("art", 1)["id"])
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.sources)
            .where(schema.sources.c.source_key == key)
            .values(source_fingerprint="media-usage-projection:v1:sha256:" + "0" * 64)
        )

    report = verify_index(db.engine)

    assert [(d.kind, d.source_key) for d in report.differences] == [
        (DriftKind.FINGERPRINT_MISMATCH, key)
    ]


def test_content_changed_without_processing_is_drift(db):
    collection = processed_collection(db.engine)
    entry = sample_entry("art", 4)
    CmsWriter(db.engine).update_entry(
        "articles", entry["id"], {"hero": {"id": "replaced-hero", "mimeType": "image/png"}}
    )

    report = verify_index(db.engine)

    kinds = {difference.kind for difference in report.differences}
    assert kinds == {
        DriftKind.FINGERPRINT_MISMATCH,
        DriftKind.MISSING_OCCURRENCE,
        DriftKind.UNEXPECTED_OCCURRENCE,
    }
    assert {d.source_key for d in report.differences} == {canonical_key(collection, entry["id"])}
    assert report.pending_work_count == 1

    drain(db.engine)
    assert not verify_index(db.engine).has_drift


def test_missing_and_unexpected_sources_are_drift(db):
    collection = processed_collection(db.engine)
    missing = canonical_key(collection, sample_entry("art", 6)["id"])
    with db.engine.begin() as connection:
        connection.execute(delete(schema.sources).where(schema.sources.c.source_key == missing))
    with db.engine.begin() as connection:
        # The entry disappears without its work being processed.
        connection.exec_driver_sql(
            f"DELETE FROM {collection.table} WHERE id = '{sample_entry('art', 7)['id']}'"
        )

    report = verify_index(db.engine)

    assert {(d.kind, d.source_key) for d in report.differences} == {
        (DriftKind.MISSING_SOURCE, missing),
        (DriftKind.UNEXPECTED_SOURCE, canonical_key(collection, sample_entry("art", 7)["id"])),
    }
    # The deleted source's occurrences are orphans: counted, not drift.
    assert report.abandoned_occurrence_count > 0


def test_replaced_generations_are_counted_not_drift(db):
    pages = active_collection(db.engine, "pages")
    insert_entry(db.engine, "pages", "entry-1")
    drain(db.engine)
    CmsWriter(db.engine).update_entry("pages", "entry-1", {"hero": "media-2"})
    drain(db.engine)

    report = verify_index(db.engine)

    assert not report.has_drift
    assert report.abandoned_occurrence_count == 1
    assert count(db.engine, schema.sources, source_key=canonical_key(pages, "entry-1")) == 1


def test_the_cli_exits_one_on_drift_and_zero_otherwise(db):
    collection = processed_collection(db.engine)
    runner = CliRunner()

    clean = runner.invoke(main, ["verify", "--database-url", db.url])
    assert clean.exit_code == 0, clean.output
    assert "No drift" in clean.output

    key = canonical_key(collection, sample_entry("art", 1)["id"])
    with db.engine.begin() as connection:
        connection.execute(delete(schema.occurrences).where(schema.occurrences.c.source_key == key))
    drifted = runner.invoke(main, ["verify", "--database-url", db.url, "--collection", "articles"])
    assert drifted.exit_code == 1
    assert "missing_occurrence" in drifted.output
