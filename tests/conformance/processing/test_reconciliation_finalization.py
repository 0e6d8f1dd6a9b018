"""EmDash's `media-usage-reconciliation-finalization.test.ts` through the processor, on both
dialects. (Its deletion scenario, the `status` phase removing the coordinator and the status
row, belongs to the deletion processor's tests.)"""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import update

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, FieldSpec
from media_usage_orchestration.processing.reconciliation.model import (
    ENTRY_FAILED,
    RECONCILIATION_FAILED,
    ReconciliationOutcome,
)
from media_usage_orchestration.processing.reconciliation.steps import record_step_failure
from media_usage_orchestration.processing.work.processor import process_due_work
from media_usage_orchestration.processing.work.projection import refresh_content_for_work
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.host import status as status_store
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from tests.support.factories import insert_source, of
from tests.support.projection import canonical_key, find_source
from tests.support.reconciliation_steps import (
    claimed,
    coordinator,
    coverage,
    make_due,
    tick,
    untrusted_collection,
    work_rows,
)
from tests.support.states import db_now, set_activation

RESOURCE_LIMIT = "MEDIA_USAGE_RESOURCE_LIMIT"


def historical_collection(db):
    """`historical` was indexed, then deleted while nothing captured it; a legacy source
    (no identity version) sits next to it."""
    collection = untrusted_collection(db.engine, "articles", ["historical"], activate_capture=False)
    assert refresh_content_for_work(db.engine, collection.id, "articles", "historical").success
    insert_source(
        db.engine,
        canonical_key(collection, "quarantined"),
        **of(collection),
        content_id="quarantined",
        current_generation="legacy-generation",
        identity_version=None,
    )
    CmsWriter(db.engine).delete_entry("articles", "historical")
    set_activation(db.engine)
    return collection


def test_reconciles_historical_missing_content_through_entry_work(db):
    collection = historical_collection(db)
    historical = canonical_key(collection, "historical")
    assert find_source(db.engine, historical) is not None

    assert tick(db.engine) is ReconciliationOutcome.ADVANCED
    assert tick(db.engine) is ReconciliationOutcome.ADVANCED
    work = work_rows(db.engine, collection)
    assert [(cid, row["state"]) for cid, row in work.items()] == [("historical", "pending")]

    assert process_due_work(db.engine).counts.completed == 1
    assert find_source(db.engine, historical) is None
    assert tick(db.engine) is ReconciliationOutcome.COMPLETED

    status = coverage(db.engine, collection)
    assert (
        status["status"],
        status["reconciliation_required"],
        status["cursor"],
        status["last_error_code"],
    ) == ("complete", 0, None, None)
    assert coordinator(db.engine, collection) is None
    assert find_source(db.engine, canonical_key(collection, "quarantined")) is not None


def fail_work_terminally(db, collection) -> None:
    """The entry's work fails terminally (as the work processor records it)."""
    with db.engine.begin() as connection:
        failed = connection.execute(
            update(schema.work)
            .where(schema.work.c.collection_id == collection.id)
            .values(state="failed", last_error_code=RESOURCE_LIMIT)
            .returning(schema.work.c.content_id, schema.work.c.work_version)
        ).one()
        status_store.record_incremental_failure(
            connection,
            collection.id,
            collection.slug,
            failed.content_id,
            failed.work_version,
            RESOURCE_LIMIT,
        )


def test_automatic_ownership_is_kept_until_failed_work_reaches_terminal_coverage(db):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    assert tick(db.engine) is ReconciliationOutcome.ADVANCED
    before = coordinator(db.engine, collection)
    fail_work_terminally(db, collection)
    status = coverage(db.engine, collection)
    assert (status["status"], status["cursor"], status["last_error_code"]) == (
        "running",
        before["run_token"],
        RESOURCE_LIMIT,
    )

    assert tick(db.engine) is ReconciliationOutcome.FAILED

    row = coordinator(db.engine, collection)
    assert (row["state"], row["last_error_code"], row["target_epoch"]) == (
        "failed",
        ENTRY_FAILED,
        before["target_epoch"],
    )
    status = coverage(db.engine, collection)
    assert (
        status["status"],
        status["reconciliation_required"],
        status["cursor"],
        status["last_error_code"],
    ) == ("failed", 1, None, RESOURCE_LIMIT)
    # Nothing reopens it until the epoch moves past the one it failed at.
    assert tick(db.engine) is ReconciliationOutcome.NOT_DUE
    assert coordinator(db.engine, collection)["state"] == "failed"


def test_entry_failure_is_refused_without_failed_work(db):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    assert tick(db.engine) is ReconciliationOutcome.ADVANCED
    claim = claimed(db.engine, collection)

    assert ReconciliationRepository(db.engine).record_entry_failure(claim) is False

    assert coordinator(db.engine, collection)["state"] == "leased"


def test_a_new_media_field_restarts_the_run_at_a_newer_epoch(db):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    assert tick(db.engine) is ReconciliationOutcome.ADVANCED
    assert process_due_work(db.engine).counts.completed == 1
    assert tick(db.engine) is ReconciliationOutcome.ADVANCED
    before = coordinator(db.engine, collection)
    assert before["phase"] == "sources"

    CmsWriter(db.engine).add_field("articles", FieldSpec("attachment", "file"))
    assert tick(db.engine) is ReconciliationOutcome.ADVANCED

    after = coordinator(db.engine, collection)
    assert after["target_epoch"] > before["target_epoch"]
    assert after["field_fingerprint"] != before["field_fingerprint"]
    assert (after["phase"], after["scan_cursor"], after["source_cursor"]) == ("scan", None, None)
    assert after["run_token"] == before["run_token"]


def test_a_manual_repair_owner_defers_the_run_and_keeps_coverage(db):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    assert tick(db.engine) is ReconciliationOutcome.ADVANCED
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.index_status)
            .where(schema.index_status.c.collection_id == collection.id)
            .values(status="running", cursor="manual-repair")
        )

    assert tick(db.engine) is ReconciliationOutcome.DEFERRED

    status = coverage(db.engine, collection)
    assert (status["status"], status["cursor"]) == ("running", "manual-repair")
    assert coordinator(db.engine, collection)["state"] == "pending"


def test_a_terminal_failure_after_begin_run_keeps_the_claimed_epoch(db):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    claim = claimed(db.engine, collection)
    epoch = ReconciliationRepository(db.engine).begin_run(claim)
    assert epoch == 1

    outcome = record_step_failure(db.engine, replace(claim, attempt_count=4))

    assert outcome is ReconciliationOutcome.FAILED
    row = coordinator(db.engine, collection)
    assert (row["state"], row["target_epoch"], row["attempt_count"]) == ("failed", epoch, 1)
    status = coverage(db.engine, collection)
    assert (status["status"], status["cursor"], status["last_error_code"]) == (
        "failed",
        None,
        RECONCILIATION_FAILED,
    )


def test_an_exception_in_a_tick_step_is_retried_then_fails_terminally(db, monkeypatch):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])

    def broken(*_args, **_kwargs):
        raise RuntimeError("initialization failed")

    monkeypatch.setattr(ReconciliationRepository, "initialize_scan", broken)
    for attempt in range(1, 5):
        assert tick(db.engine) is ReconciliationOutcome.RETRY
        row = coordinator(db.engine, collection)
        assert (row["state"], row["attempt_count"], row["last_error_code"]) == (
            "retry",
            attempt,
            RECONCILIATION_FAILED,
        )
        assert tick(db.engine) is ReconciliationOutcome.NOT_DUE
        make_due(db.engine, collection)

    assert tick(db.engine) is ReconciliationOutcome.FAILED

    row = coordinator(db.engine, collection)
    # begin_run kept its epoch across the attempts, and the failure keeps it as its target.
    assert (row["state"], row["attempt_count"], row["target_epoch"]) == ("failed", 5, 1)
    status = coverage(db.engine, collection)
    assert (status["status"], status["cursor"], status["reconciliation_required"]) == (
        "failed",
        None,
        1,
    )


@pytest.mark.parametrize("attempt_count", [0, 3])
def test_a_non_terminal_step_failure_backs_off_from_thirty_seconds(db, attempt_count):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    claim = replace(claimed(db.engine, collection), attempt_count=attempt_count)

    outcome = record_step_failure(db.engine, claim, rng=lambda: 0.0)

    assert outcome is ReconciliationOutcome.RETRY
    row = coordinator(db.engine, collection)
    assert (row["state"], row["lease_token"]) == ("retry", None)
    delay = 30 * 2**attempt_count
    assert db_now(db.engine, delay - 2) <= row["next_attempt_at"] <= db_now(db.engine, delay)
