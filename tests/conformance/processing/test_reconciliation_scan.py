"""EmDash's `media-usage-reconciliation-scan.test.ts` through the processor, on both dialects.

The stale-publication scenario of that file (a canonical publication refused after a delete,
a newer version or a stale revision, accepted with the current revision) is a projection
write guard, covered by `tests/store/test_sources.py::test_a_stale_snapshot_is_never_published`
and `::test_the_current_revision_is_published`.
"""

from __future__ import annotations

import re

from sqlalchemy import update

from media_usage_orchestration.processing.reconciliation.model import (
    ReconciliationOutcome,
    ScanOutcome,
)
from media_usage_orchestration.processing.reconciliation.steps import scan_page
from media_usage_orchestration.store.core import schema
from tests.support.factories import PAST, insert_work, of
from tests.support.reconciliation_steps import (
    FINGERPRINT_PATTERN,
    claimed,
    coordinator,
    coverage,
    entry_ids,
    make_due,
    tick,
    untrusted_collection,
    work_rows,
)
from tests.support.states import NO_MEDIA, db_now, set_activation

ENTRIES = entry_ids(51)


def scan_collection(db):
    """51 entries with an image; `entry-001` failed at epoch 0, `entry-002` at epoch 99."""
    collection = untrusted_collection(db.engine, "articles", ENTRIES, activate_capture=False)
    insert_work(
        db.engine,
        **of(collection),
        content_id="entry-001",
        change_epoch=0,
        state="failed",
        last_error_code="OLD_FAILURE",
    )
    insert_work(
        db.engine,
        **of(collection),
        content_id="entry-002",
        state="failed",
        change_epoch=99,
        last_error_code="NEWER_FAILURE",
    )
    set_activation(db.engine)
    return collection


def versions(db, collection) -> dict[str, int]:
    return {cid: row["work_version"] for cid, row in work_rows(db.engine, collection).items()}


def test_first_step_pins_the_run_and_enqueues_one_page_without_resetting_newer_work(db):
    collection = scan_collection(db)

    assert tick(db.engine) is ReconciliationOutcome.ADVANCED

    row = coordinator(db.engine, collection)
    assert row["target_epoch"] == 1
    assert re.fullmatch(FINGERPRINT_PATTERN, row["field_fingerprint"])
    assert (row["scan_upper_id"], row["scan_cursor"], row["phase"]) == (
        "entry-050",
        "entry-049",
        "scan",
    )
    # EmDash hands the lease back after every step that advanced, due at once.
    assert (row["state"], row["lease_token"]) == ("pending", None)
    assert row["next_attempt_at"] <= db_now(db.engine)
    work = work_rows(db.engine, collection)
    assert sorted(work) == ENTRIES[:50]
    reopened = work["entry-001"]
    assert (reopened["change_epoch"], reopened["work_version"], reopened["state"]) == (
        1,
        2,
        "pending",
    )
    assert reopened["last_error_code"] is None
    untouched = work["entry-002"]
    assert (untouched["change_epoch"], untouched["work_version"], untouched["state"]) == (
        99,
        1,
        "failed",
    )
    assert untouched["last_error_code"] == "NEWER_FAILURE"


def test_replaying_a_page_after_resetting_the_cursor_is_idempotent(db):
    collection = scan_collection(db)
    assert tick(db.engine) is ReconciliationOutcome.ADVANCED
    before = versions(db, collection)
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.reconciliations)
            .where(schema.reconciliations.c.collection_id == collection.id)
            .values(scan_cursor=None, state="pending", next_attempt_at=PAST)
        )

    assert tick(db.engine) is ReconciliationOutcome.ADVANCED

    assert versions(db, collection) == before
    assert coordinator(db.engine, collection)["scan_cursor"] == "entry-049"


def test_the_scan_reaches_its_bound_then_waits_for_the_work_it_enqueued(db):
    collection = untrusted_collection(db.engine, "articles", ENTRIES)
    assert tick(db.engine) is ReconciliationOutcome.ADVANCED

    assert tick(db.engine) is ReconciliationOutcome.ADVANCED
    assert coordinator(db.engine, collection)["scan_cursor"] == "entry-050"
    assert len(work_rows(db.engine, collection)) == 51

    # Exhausted with work outstanding: the barrier makes the run wait 30 s.
    assert tick(db.engine) is ReconciliationOutcome.DEFERRED
    row = coordinator(db.engine, collection)
    assert (row["state"], row["phase"]) == ("pending", "scan")
    assert row["next_attempt_at"] >= db_now(db.engine, 29)
    assert tick(db.engine) is ReconciliationOutcome.NOT_DUE

    make_due(db.engine, collection)
    assert scan_page(db.engine, claimed(db.engine, collection)).outcome is ScanOutcome.EXHAUSTED


def test_newer_failed_work_left_untouched_by_the_scan_fails_the_run(db):
    collection = scan_collection(db)
    assert tick(db.engine) is ReconciliationOutcome.ADVANCED
    assert tick(db.engine) is ReconciliationOutcome.ADVANCED

    assert tick(db.engine) is ReconciliationOutcome.FAILED

    row = coordinator(db.engine, collection)
    assert (row["state"], row["last_error_code"], row["target_epoch"]) == (
        "failed",
        "MEDIA_USAGE_RECONCILIATION_ENTRY_FAILED",
        1,
    )
    status = coverage(db.engine, collection)
    assert (status["status"], status["cursor"], status["last_error_code"]) == (
        "failed",
        None,
        "NEWER_FAILURE",
    )


def test_no_media_fields_means_an_immediately_exhausted_scan_and_no_work(db):
    collection = untrusted_collection(db.engine, "plain", ["entry-1"], NO_MEDIA)

    assert scan_page(db.engine, claimed(db.engine, collection)).outcome is ScanOutcome.EXHAUSTED

    assert work_rows(db.engine, collection) == {}
    row = coordinator(db.engine, collection)
    assert row["scan_upper_id"] is None
    assert row["target_epoch"] == 1
    assert re.fullmatch(FINGERPRINT_PATTERN, row["field_fingerprint"])


def test_without_media_fields_the_tick_moves_straight_to_the_source_walk(db):
    collection = untrusted_collection(db.engine, "plain", ["entry-1"], NO_MEDIA)

    assert tick(db.engine) is ReconciliationOutcome.ADVANCED

    row = coordinator(db.engine, collection)
    assert (row["phase"], row["scan_upper_id"], row["source_upper_key"]) == (
        "sources",
        None,
        None,
    )
    assert work_rows(db.engine, collection) == {}
    assert tick(db.engine) is ReconciliationOutcome.COMPLETED
    assert coordinator(db.engine, collection) is None
