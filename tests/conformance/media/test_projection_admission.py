"""EmDash's projection admission tests (`media-usage-projection-admission*.test.ts`): the
planner on its own, and its effect on durable work, on both dialects."""

from __future__ import annotations

import json
from dataclasses import replace

from sqlalchemy import text, update

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, FieldSpec
from media_usage_orchestration.media.extraction import MediaOccurrence
from media_usage_orchestration.media.fields import ExtractionField, FieldDiscovery
from media_usage_orchestration.media.fingerprints import projection_fingerprint
from media_usage_orchestration.media.projection import (
    MAX_OCCURRENCE_MUTATION_UNITS,
    AdmissionBudget,
    AdmissionOutcome,
    canonical_source_keys,
    stored_source_byte_length,
)
from media_usage_orchestration.media.sources import ContentSource, source_key
from media_usage_orchestration.processing.work.content_reads import load_content_snapshots
from media_usage_orchestration.processing.work.processor import (
    WorkOutcome,
    process_work_after_write,
)
from media_usage_orchestration.processing.work.projection import plan_projection_admission
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.sources.writes import SourceRepository
from media_usage_orchestration.values.source_records import SourceRow
from tests.support.projection import (
    ADMISSION_FIELDS,
    active_collection,
    add_measured_draft,
    canonical_key,
    coverage,
    current_occurrence_count,
    drop_row_trigger,
    find_source,
    insert_measured_entry,
    measurement_data,
    occurrence_count,
    row_trigger,
    sql_statements,
    work_for,
)
from tests.support.states import recorded_statements

COLLECTION_ID = "collection-admission"
GALLERY = FieldDiscovery((ExtractionField("gallery", "image"),), ())


def planned_snapshot(content_id: str, variant: str, occurrences: int) -> ContentSource:
    """A snapshot built by hand (EmDash's test `snapshot()`), fingerprinted like a real one."""
    items = tuple(
        MediaOccurrence(
            "gallery",
            f"gallery[{index}]",
            index,
            "image_field",
            f"media-{index}",
            "local",
            f"media-{index}",
            "image",
            "image/webp",
        )
        for index in range(occurrences)
    )
    source = ContentSource(
        source_key=source_key(COLLECTION_ID, content_id, variant),
        source_type="content",
        collection_id=COLLECTION_ID,
        collection_slug="admission",
        content_id=content_id,
        source_variant=variant,
        locale="en",
        content_slug=content_id,
        content_title=content_id,
        source_updated_at="2026-08-11T00:00:00.000Z",
        source_version=1,
        identity_version=1,
    )
    fingerprint = projection_fingerprint(COLLECTION_ID, GALLERY, source, items)
    return replace(
        source,
        source_fingerprint=fingerprint.value,
        occurrences=items,
        projection_byte_length=fingerprint.byte_length,
    )


def plan(repository, snapshots, observed=None, budget=None):
    content_id = snapshots[0].content_id
    return plan_projection_admission(
        repository,
        snapshots,
        observed or {},
        canonical_source_keys(COLLECTION_ID, content_id),
        budget or AdmissionBudget(),
    )


# --- the planner ------------------------------------------------------------------------------


def test_a_whole_entry_is_admitted_only_when_both_variants_fit_together(db):
    repository = SourceRepository(db.engine)
    within = plan(
        repository,
        [planned_snapshot("e12", "columns", 6), planned_snapshot("e12", "draft_overlay", 6)],
    )
    over = plan(
        repository,
        [planned_snapshot("e13", "columns", 6), planned_snapshot("e13", "draft_overlay", 7)],
    )

    assert within.outcome is AdmissionOutcome.ADMITTED
    assert within.occurrence_mutation_units == 12
    assert over.outcome is AdmissionOutcome.INTRINSIC_RESOURCE_LIMIT


def test_one_claim_budget_is_reserved_and_later_excess_is_deferred(db):
    repository = SourceRepository(db.engine)
    budget = AdmissionBudget()
    first = plan(repository, [planned_snapshot("small", "columns", 1)], budget=budget)
    oversized = [planned_snapshot("large", "columns", 13)]
    deferred = plan(repository, oversized, budget=budget)
    fresh = plan(repository, oversized)

    assert first.outcome is AdmissionOutcome.ADMITTED
    assert budget.has_reserved_mutation is True
    assert budget.remaining_units == 11
    assert deferred.outcome is AdmissionOutcome.CLAIM_BUDGET_DEFERRED
    assert fresh.outcome is AdmissionOutcome.INTRINSIC_RESOURCE_LIMIT


def stored_entry_snapshots(engine, title: str, draft_title: str):
    """A real entry (columns: no media, `title`; draft: one image, `draft_title`) whose two
    sources are already published."""
    writer = CmsWriter(engine)
    collection = writer.create_collection(
        "admission", (FieldSpec("title", "string"), FieldSpec("hero", "image"))
    )
    writer.insert_entry("admission", {"id": "entry-1", "slug": "entry-1", "title": title})
    writer.save_draft("admission", "entry-1", {"title": draft_title, "hero": "media-draft"})
    loaded = load_content_snapshots(engine, "admission", "entry-1", collection.id)
    repository = SourceRepository(engine)
    for snapshot in loaded.snapshots:
        assert repository.replace_source_if_matching(snapshot, None, None).replaced
    keys = canonical_source_keys(collection.id, "entry-1")
    return repository, loaded.snapshots, repository.find_sources(keys), keys


def test_an_oversized_plan_is_recomputed_after_proving_its_replacement_unchanged(db):
    repository, (columns, draft), observed, keys = stored_entry_snapshots(
        db.engine, "é" * 270_000, "Small draft"
    )
    budget = AdmissionBudget()

    result = plan_projection_admission(repository, [columns], observed, keys, budget)

    assert result.outcome is AdmissionOutcome.ADMITTED
    assert result.no_op_source_keys == {columns.source_key}
    assert [source.source_key for source in result.absent_sources] == [draft.source_key]
    assert result.occurrence_mutation_units == 1
    assert budget.remaining_units == MAX_OCCURRENCE_MUTATION_UNITS - 1


def test_deleting_a_source_whose_stored_row_alone_exceeds_the_byte_limit_is_refused(db):
    repository, _, observed, keys = stored_entry_snapshots(db.engine, "small", "é" * 300_000)
    budget = AdmissionBudget()

    result = plan_projection_admission(repository, [], observed, keys, budget)

    assert result.outcome is AdmissionOutcome.INTRINSIC_RESOURCE_LIMIT
    assert budget.has_reserved_mutation is False


# --- durable work -----------------------------------------------------------------------------


def test_an_oversized_replacement_fails_terminally_before_publishing_either_variant(db):
    collection = active_collection(db.engine, "admission_runtime", ADMISSION_FIELDS)
    insert_measured_entry(db.engine, collection.slug, "oversized-variants", 6)
    add_measured_draft(
        db.engine, collection, "oversized-variants", measurement_data(7, "oversized-draft")
    )

    outcome = process_work_after_write(db.engine, collection.slug, "oversized-variants")

    assert outcome is WorkOutcome.FAILED
    work = work_for(db.engine, "oversized-variants")
    assert (work["state"], work["attempt_count"], work["last_error_code"]) == (
        "failed",
        1,
        "MEDIA_USAGE_RESOURCE_LIMIT",
    )
    for variant in ("columns", "draft_overlay"):
        key = canonical_key(collection, "oversized-variants", variant)
        assert find_source(db.engine, key) is None
        assert occurrence_count(db.engine, key) == 0
    status = coverage(db.engine, collection)
    assert (status["status"], status["last_error_code"]) == (
        "partial",
        "MEDIA_USAGE_RESOURCE_LIMIT",
    )


def test_the_occurrence_boundary_is_admitted_and_an_oversized_exact_projection_is_a_no_op(db):
    collection = active_collection(db.engine, "admission_runtime", ADMISSION_FIELDS)
    insert_measured_entry(db.engine, collection.slug, "boundary", 12)
    assert process_work_after_write(db.engine, collection.slug, "boundary") is WorkOutcome.COMPLETED
    assert current_occurrence_count(db.engine, canonical_key(collection, "boundary")) == 12

    insert_measured_entry(db.engine, collection.slug, "oversized-no-op", 13)
    loaded = load_content_snapshots(db.engine, collection.slug, "oversized-no-op", collection.id)
    (columns,) = loaded.snapshots
    assert SourceRepository(db.engine).replace_source_if_matching(columns, None, None).replaced
    stored = find_source(db.engine, columns.source_key)

    outcome = process_work_after_write(db.engine, collection.slug, "oversized-no-op")

    assert outcome is WorkOutcome.COMPLETED
    assert find_source(db.engine, columns.source_key).current_generation == (
        stored.current_generation
    )
    assert current_occurrence_count(db.engine, columns.source_key) == 13


def test_oversized_source_bytes_fail_without_mutation(db):
    collection = active_collection(db.engine, "admission_runtime", ADMISSION_FIELDS)
    insert_measured_entry(db.engine, collection.slug, "oversized-bytes", 0, "é" * 300_000)

    outcome = process_work_after_write(db.engine, collection.slug, "oversized-bytes")

    assert outcome is WorkOutcome.FAILED
    assert work_for(db.engine, "oversized-bytes")["last_error_code"] == "MEDIA_USAGE_RESOURCE_LIMIT"
    assert find_source(db.engine, canonical_key(collection, "oversized-bytes")) is None
    assert occurrence_count(db.engine, canonical_key(collection, "oversized-bytes")) == 0


def test_oversized_absent_source_cleanup_fails_without_mutation(db):
    collection = active_collection(db.engine, "admission_runtime", ADMISSION_FIELDS)
    insert_measured_entry(db.engine, collection.slug, "oversized-delete", 13)
    loaded = load_content_snapshots(db.engine, collection.slug, "oversized-delete", collection.id)
    (columns,) = loaded.snapshots
    assert SourceRepository(db.engine).replace_source_if_matching(columns, None, None).replaced
    stored = find_source(db.engine, columns.source_key)
    CmsWriter(db.engine).delete_entry(collection.slug, "oversized-delete")

    outcome = process_work_after_write(db.engine, collection.slug, "oversized-delete")

    assert outcome is WorkOutcome.FAILED
    assert work_for(db.engine, "oversized-delete")["last_error_code"] == (
        "MEDIA_USAGE_RESOURCE_LIMIT"
    )
    assert find_source(db.engine, columns.source_key).current_generation == (
        stored.current_generation
    )
    assert current_occurrence_count(db.engine, columns.source_key) == 13


def test_a_reserved_claim_defers_immediately_after_a_conflict(db):
    collection = active_collection(db.engine, "admission_runtime", ADMISSION_FIELDS)
    insert_measured_entry(db.engine, collection.slug, "conflict", 0)
    add_measured_draft(db.engine, collection, "conflict", measurement_data(12, "draft-initial"))
    assert process_work_after_write(db.engine, collection.slug, "conflict") is WorkOutcome.COMPLETED
    draft_key = canonical_key(collection, "conflict", "draft_overlay")
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.revisions)
            .where(schema.revisions.c.id == "revision-conflict")
            .values(data=json.dumps(measurement_data(12, "draft-changed")))
        )
        connection.execute(
            text(
                f"UPDATE {collection.table} SET updated_at = '2026-08-11T12:00:00.000Z' "
                "WHERE id = 'conflict'"
            )
        )
    # A concurrent writer touches the draft source as soon as its write lease is taken.
    row_trigger(
        db,
        "test_admission_draft_conflict",
        schema.generation_writes.name,
        "UPDATE _emdash_media_usage_sources SET updated_at = updated_at || 'x' "
        "WHERE source_key = NEW.source_key",
        when=f"NEW.source_key = '{draft_key}'",
    )
    rows_before = occurrence_count(db.engine, draft_key)

    with recorded_statements(db.engine) as sent:
        outcome = process_work_after_write(db.engine, collection.slug, "conflict")

    drop_row_trigger(db, "test_admission_draft_conflict", schema.generation_writes.name)
    assert outcome is WorkOutcome.RETRY
    assert len(sql_statements(sent)) <= 40
    # The losing generation stays behind, abandoned, for the projection GC.
    assert occurrence_count(db.engine, draft_key) - rows_before == 12
    work = work_for(db.engine, "conflict")
    assert (work["state"], work["attempt_count"], work["last_error_code"]) == (
        "retry",
        1,
        "MEDIA_USAGE_GENERATION_CONFLICT",
    )


def test_a_stored_source_is_charged_the_length_of_its_emdash_json():
    row = SourceRow(
        source_key="content:c:é:columns",
        source_type="content",
        collection_id="c",
        collection_slug="posts",
        content_id="é",
        source_variant="columns",
        locale="en",
        translation_group=None,
        content_slug="slug",
        content_title='Tïtle "quoted"\n',
        content_status="published",
        content_scheduled_at=None,
        content_deleted_at=None,
        revision_id=None,
        current_generation="01GEN",
        schema_version=1,
        source_updated_at="2026-08-11T00:00:00.000Z",
        source_version=3,
        source_fingerprint=None,
        identity_version=1,
        source_completeness="complete",
        last_attempted_at=None,
        last_error_code=None,
        indexed_at="2026-08-11T00:00:00.000Z",
        created_at="2026-08-11 00:00:00",
        updated_at="2026-08-11T00:00:00.000Z",
    )
    camel = {
        "".join(part if i == 0 else part.title() for i, part in enumerate(name.split("_"))): value
        for name, value in vars(row).items()
    }
    expected = json.dumps(camel, ensure_ascii=False, separators=(",", ":")).encode()

    assert list(camel)[:3] == ["sourceKey", "sourceType", "collectionId"]
    assert stored_source_byte_length(row) == len(expected)
