"""The reconciliation step functions as the op graph uses them, on both dialects: claim one
collection, prepare, page under one renewed lease, drain, walk sources, finalize; restarts
caused by captured writes; failures, stuck failures and maintenance."""

from __future__ import annotations

from dataclasses import replace

import pytest

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import MEDIA_FIELDS, sample_entries
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.loop.retry_policy import RECONCILIATION_RETRY, WORK_RETRY
from media_usage_orchestration.processing.reconciliation.driver import run_to_completion
from media_usage_orchestration.processing.reconciliation.maintenance import settle_reconciliations
from media_usage_orchestration.processing.reconciliation.model import (
    INVALID_SOURCE,
    ReconciliationOutcome,
    ScanOutcome,
)
from media_usage_orchestration.processing.reconciliation.steps import (
    claim_collection,
    enter_sources,
    finalize,
    prepare_run,
    record_step_failure,
    release,
    renew,
    restart,
    scan_page,
    source_page,
    work_barrier,
)
from media_usage_orchestration.processing.reconciliation.tick import process_due_reconciliation
from media_usage_orchestration.processing.work import processor as work_processing
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.reconciliation.records import WorkBarrierState
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from tests.support.factories import insert_source, insert_work, of
from tests.support.projection import canonical_key
from tests.support.reconciliation_steps import (
    captured_collection,
    claimed,
    coordinator,
    coverage,
    entry_ids,
    expire_lease,
    image_entry,
    make_due,
    mark_failed,
    source_rows,
    untrusted_collection,
    work_rows,
)
from tests.support.states import NO_MEDIA, count, db_now, set_activation, set_status

ADVANCED = ReconciliationOutcome.ADVANCED


def prepared(db, collection):
    result = prepare_run(db.engine, claimed(db.engine, collection))
    assert result.outcome is ADVANCED and result.claim is not None
    return result.claim


def scan_all(db, claim) -> list[ScanOutcome]:
    outcomes = []
    while (outcome := scan_page(db.engine, claim).outcome) is ScanOutcome.ADVANCED:
        outcomes.append(outcome)
        claim = renew(db.engine, claim)
        assert claim is not None
    outcomes.append(outcome)
    return outcomes


def assert_complete(db, collection) -> None:
    status = coverage(db.engine, collection)
    assert (status["status"], status["reconciliation_required"], status["cursor"]) == (
        "complete",
        0,
        None,
    )
    assert coordinator(db.engine, collection) is None
    assert work_rows(db.engine, collection) == {}


def assert_no_drift(db) -> None:
    report = verify_index(db.engine)
    assert report.differences == ()
    assert not report.has_drift


# --- claim_collection -------------------------------------------------------------------------


def test_claim_collection_seeds_and_claims_only_the_named_collection(db):
    first = untrusted_collection(db.engine, "first", ["entry-1"])
    second = untrusted_collection(db.engine, "second", ["entry-1"])

    attempt = claim_collection(db.engine, second.id)

    assert attempt.outcome is ADVANCED
    assert (attempt.claim.collection_id, attempt.claim.collection_slug) == (second.id, "second")
    assert coordinator(db.engine, second)["state"] == "leased"
    assert coordinator(db.engine, first) is None


def test_claim_collection_is_inactive_until_capture_is_activated(db):
    collection = untrusted_collection(db.engine, "articles", activate_capture=False)

    attempt = claim_collection(db.engine, collection.id)

    assert (attempt.outcome, attempt.claim) == (ReconciliationOutcome.INACTIVE, None)
    assert coordinator(db.engine, collection) is None


def test_complete_coverage_is_claimed_only_when_forced(db):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    set_status(db.engine, "articles", status="complete", reconciliation_required=0, change_epoch=3)

    attempt = claim_collection(db.engine, collection.id)
    assert attempt.outcome is ReconciliationOutcome.ALREADY_COMPLETE
    assert coordinator(db.engine, collection) is None

    forced = claim_collection(db.engine, collection.id, force=True)

    assert forced.outcome is ADVANCED
    status = coverage(db.engine, collection)
    assert (status["status"], status["reconciliation_required"], status["change_epoch"]) == (
        "stale",
        1,
        4,
    )
    assert run_to_completion_with(db, forced.claim) is ReconciliationOutcome.COMPLETED
    assert_complete(db, collection)


def run_to_completion_with(db, claim) -> ReconciliationOutcome:
    """Hand a claim back and let the driver take the collection from there."""
    assert release(db.engine, claim, 0)
    return run_to_completion(db.engine, claim.collection_id)


def test_force_never_takes_coverage_from_a_running_owner(db):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    set_status(db.engine, "articles", status="running", cursor="manual-repair")

    attempt = claim_collection(db.engine, collection.id, force=True)

    assert attempt.outcome is ADVANCED  # untrusted coverage needs no request
    assert prepare_run(db.engine, attempt.claim).outcome is ReconciliationOutcome.DEFERRED
    status = coverage(db.engine, collection)
    assert (status["status"], status["cursor"], status["change_epoch"]) == (
        "running",
        "manual-repair",
        0,
    )


def test_a_held_coordinator_is_claim_lost_and_a_waiting_one_is_not_due(db):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    claim = claimed(db.engine, collection)

    held = claim_collection(db.engine, collection.id)
    assert (held.outcome, held.claim) == (ReconciliationOutcome.CLAIM_LOST, None)
    assert claim.lease_expires_at in held.reason

    assert release(db.engine, claim, 30)
    waiting = claim_collection(db.engine, collection.id)
    assert waiting.outcome is ReconciliationOutcome.NOT_DUE
    make_due(db.engine, collection)
    assert claim_collection(db.engine, collection.id).outcome is ADVANCED


def test_reopen_resumes_a_run_after_a_recorded_failure(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(3))
    claim = prepared(db, collection)
    assert scan_page(db.engine, claim).outcome is ScanOutcome.ADVANCED
    assert record_step_failure(db.engine, claim) is ReconciliationOutcome.RETRY
    assert claim_collection(db.engine, collection.id).outcome is ReconciliationOutcome.NOT_DUE

    reopened = claim_collection(db.engine, collection.id, reopen=True)

    assert reopened.outcome is ADVANCED
    assert (reopened.claim.attempt_count, reopened.claim.target_epoch) == (0, None)
    assert reopened.claim.run_token == claim.run_token
    assert run_to_completion_with(db, reopened.claim) is ReconciliationOutcome.COMPLETED


def test_a_failed_run_is_reported_until_an_operator_reopens_it(db):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    claim = prepared(db, collection)
    assert record_step_failure(db.engine, replace(claim, attempt_count=4)) is (
        ReconciliationOutcome.FAILED
    )

    attempt = claim_collection(db.engine, collection.id)
    assert attempt.outcome is ReconciliationOutcome.FAILED
    assert "MEDIA_USAGE_RECONCILIATION_FAILED" in attempt.reason

    assert run_to_completion(db.engine, collection.id, reopen=True) is (
        ReconciliationOutcome.COMPLETED
    )
    assert_complete(db, collection)


# --- prepare_run --------------------------------------------------------------------------------


def test_prepare_run_is_idempotent(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(3))
    claim = claimed(db.engine, collection)

    first = prepare_run(db.engine, claim)
    second = prepare_run(db.engine, claim)

    assert first.outcome is second.outcome is ADVANCED
    assert first.claim.target_epoch == second.claim.target_epoch == 1
    assert first.claim == second.claim
    assert not first.restarted and not second.restarted
    assert coverage(db.engine, collection)["change_epoch"] == 1
    assert coordinator(db.engine, collection)["state"] == "leased"


def test_prepare_run_resumes_a_run_that_began_before_a_crash(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(3))
    claim = claimed(db.engine, collection)
    assert ReconciliationRepository(db.engine).begin_run(claim) == 1

    result = prepare_run(db.engine, claim)

    assert result.outcome is ADVANCED
    assert (result.claim.target_epoch, result.claim.scan_upper_id) == (1, "entry-002")
    assert coverage(db.engine, collection)["change_epoch"] == 1


def test_prepare_run_defers_to_a_manual_repair_and_waits(db):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    set_status(db.engine, "articles", status="running", cursor="manual-repair")

    result = prepare_run(db.engine, claimed(db.engine, collection))

    assert (result.outcome, result.claim) == (ReconciliationOutcome.DEFERRED, None)
    row = coordinator(db.engine, collection)
    assert (row["state"], row["target_epoch"]) == ("pending", None)
    assert row["next_attempt_at"] >= db_now(db.engine, 29)


def test_prepare_run_restarts_a_run_whose_fields_changed(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(3))
    claim = prepared(db, collection)
    with db.engine.begin() as connection:
        connection.execute(
            schema.reconciliations.update()
            .where(schema.reconciliations.c.collection_id == collection.id)
            .values(field_fingerprint="media-usage-fields:v1:sha256:" + "0" * 64)
        )

    result = prepare_run(db.engine, claim)

    assert (result.outcome, result.restarted) == (ADVANCED, True)
    assert result.claim.field_fingerprint == claim.field_fingerprint
    assert result.claim.target_epoch == 2


# --- paging under one lease ---------------------------------------------------------------------


def test_scan_pages_run_under_one_renewed_lease(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(120))
    claim = prepared(db, collection)
    cursors, expiries = [], []

    while scan_page(db.engine, claim).outcome is ScanOutcome.ADVANCED:
        row = coordinator(db.engine, collection)
        assert (row["state"], row["lease_token"]) == ("leased", claim.lease_token)
        cursors.append(row["scan_cursor"])
        claim = renew(db.engine, claim, 120)
        expiries.append(claim.lease_expires_at)

    assert cursors == ["entry-049", "entry-099", "entry-119"]
    assert expiries[0] >= db_now(db.engine, 110)
    assert len(work_rows(db.engine, collection)) == 120
    assert work_barrier(db.engine, claim).state is WorkBarrierState.PENDING
    waiting = enter_sources(db.engine, claim)
    assert waiting.outcome is ReconciliationOutcome.DEFERRED
    row = coordinator(db.engine, collection)
    assert (row["state"], row["phase"]) == ("pending", "scan")
    assert row["next_attempt_at"] >= db_now(db.engine, 29)


def test_a_lost_lease_is_reported_and_never_written(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(3))
    stale = prepared(db, collection)
    expire_lease(db.engine, collection)
    assert renew(db.engine, stale) is None
    successor = claimed(db.engine, collection)
    before = coordinator(db.engine, collection)

    assert scan_page(db.engine, stale).outcome is ScanOutcome.DEFERRED
    assert source_page(db.engine, stale).outcome is ReconciliationOutcome.CLAIM_LOST
    for step in (prepare_run, restart, enter_sources, finalize):
        assert step(db.engine, stale).outcome is ReconciliationOutcome.CLAIM_LOST
    assert release(db.engine, stale, 0) is False
    assert record_step_failure(db.engine, stale) is ReconciliationOutcome.CLAIM_LOST

    assert coordinator(db.engine, collection) == before
    assert work_rows(db.engine, collection) == {}
    assert run_to_completion_with(db, successor) is ReconciliationOutcome.COMPLETED


def test_an_expired_lease_is_not_mistaken_for_an_exhausted_walk(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(3))
    claim = prepared(db, collection)
    expire_lease(db.engine, collection)
    before = coordinator(db.engine, collection)

    # The guarded page reads see nothing once the lease expired, yet nothing is exhausted.
    assert scan_page(db.engine, claim).outcome is ScanOutcome.DEFERRED
    assert enter_sources(db.engine, claim).outcome is ReconciliationOutcome.CLAIM_LOST

    assert coordinator(db.engine, collection) == before
    assert work_rows(db.engine, collection) == {}


def test_a_carried_page_reads_nothing_before_it_writes(db, monkeypatch):
    """Pages after a walk's first start from the claim the previous checkpoint left: the
    coordinator and the fields are read by the first page and by the page that finds the
    scan exhausted, not by each page."""
    collection = untrusted_collection(db.engine, "articles", entry_ids(120))
    claim = prepared(db, collection)
    reads = []
    find = ReconciliationRepository.find_by_identity
    monkeypatch.setattr(
        ReconciliationRepository,
        "find_by_identity",
        lambda self, *args: reads.append(args) or find(self, *args),
    )

    paged = scan_page(db.engine, claim)
    outcomes, cursors = [paged.outcome], [paged.claim.scan_cursor]
    while paged.outcome is ScanOutcome.ADVANCED:
        paged = scan_page(db.engine, paged.claim, 60, paged.fields)
        outcomes.append(paged.outcome)
        cursors.append(paged.claim.scan_cursor)

    assert outcomes == [ScanOutcome.ADVANCED] * 3 + [ScanOutcome.EXHAUSTED]
    assert cursors[:3] == ["entry-049", "entry-099", "entry-119"]
    assert len(reads) == 2
    row = coordinator(db.engine, collection)
    assert row["scan_cursor"] == "entry-119"
    # The carried claim is the row as the last checkpoint left it.
    assert paged.claim.lease_expires_at == row["lease_expires_at"]
    assert len(work_rows(db.engine, collection)) == 120


def test_a_carried_page_whose_lease_was_taken_over_writes_nothing_and_stops(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(120))
    first = scan_page(db.engine, prepared(db, collection))
    assert first.outcome is ScanOutcome.ADVANCED
    expire_lease(db.engine, collection)
    successor = claimed(db.engine, collection)
    before = coordinator(db.engine, collection)

    # The page's enqueue and checkpoint are refused by their own guards; nothing was read
    # before them, and the row read afterwards says why.
    taken_over = scan_page(db.engine, first.claim, 60, first.fields)

    assert (taken_over.outcome, taken_over.fields) == (ScanOutcome.DEFERRED, None)
    assert coordinator(db.engine, collection) == before
    assert sorted(work_rows(db.engine, collection)) == entry_ids(50)
    assert before["lease_token"] == successor.lease_token


def test_a_carried_page_after_a_captured_write_writes_nothing_and_restarts(db):
    collection = captured_collection(
        db.engine, "articles", sample_entries("art", 120), MEDIA_FIELDS
    )
    first = scan_page(db.engine, prepared(db, collection))
    assert first.outcome is ScanOutcome.ADVANCED
    CmsWriter(db.engine).update_entry("articles", "art-e00100", {"title": "edited mid-run"})
    before = coordinator(db.engine, collection)
    queued = work_rows(db.engine, collection)

    moved = scan_page(db.engine, first.claim, 60, first.fields)

    assert moved.outcome is ScanOutcome.RESTART_REQUIRED
    assert coordinator(db.engine, collection) == before
    # Only the captured entry was queued since: the refused page enqueued nothing.
    assert set(work_rows(db.engine, collection)) == set(queued) | {"art-e00100"}


def test_an_unfinished_scan_is_handed_back_instead_of_entering_sources(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(60))
    claim = prepared(db, collection)
    assert scan_page(db.engine, claim).outcome is ScanOutcome.ADVANCED
    for content_id in entry_ids(50):
        assert work_processing.process_work_after_write(db.engine, "articles", content_id)

    result = enter_sources(db.engine, claim)

    assert result.outcome is ReconciliationOutcome.DEFERRED
    row = coordinator(db.engine, collection)
    assert (row["state"], row["phase"], row["scan_cursor"]) == ("pending", "scan", "entry-049")
    assert row["next_attempt_at"] <= db_now(db.engine)


# --- the whole graph ----------------------------------------------------------------------------


def test_steps_walk_a_run_from_claim_to_complete_coverage(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(55))
    claim = prepared(db, collection)
    assert scan_all(db, claim) == [ScanOutcome.ADVANCED] * 2 + [ScanOutcome.EXHAUSTED]
    assert work_processing.process_due_batch(db.engine, 100).counts.completed == 55
    insert_source(db.engine, canonical_key(collection, "gone"), **of(collection), content_id="gone")

    entered = enter_sources(db.engine, claim)
    assert entered.outcome is ADVANCED and entered.claim.phase == "sources"
    assert enter_sources(db.engine, entered.claim).outcome is ADVANCED  # re-executed
    # 56 canonical sources: the first page holds only entries that still exist.
    assert source_page(db.engine, entered.claim).outcome is ScanOutcome.ADVANCED
    assert work_rows(db.engine, collection) == {}
    assert source_page(db.engine, entered.claim).outcome is ScanOutcome.ADVANCED
    assert sorted(work_rows(db.engine, collection)) == ["gone"]
    assert source_page(db.engine, entered.claim).outcome is ScanOutcome.EXHAUSTED

    waiting = finalize(db.engine, entered.claim)
    assert waiting.outcome is ReconciliationOutcome.DEFERRED
    assert work_processing.process_due_batch(db.engine, 10).counts.completed == 1
    make_due(db.engine, collection)
    claim = claimed(db.engine, collection)
    assert prepare_run(db.engine, claim).outcome is ADVANCED
    assert scan_page(db.engine, claim).outcome is ScanOutcome.EXHAUSTED
    assert source_page(db.engine, claim).outcome is ScanOutcome.EXHAUSTED

    assert finalize(db.engine, claim).outcome is ReconciliationOutcome.COMPLETED
    assert_complete(db, collection)
    assert len(source_rows(db.engine, collection)) == 55
    assert finalize(db.engine, claim).outcome is ReconciliationOutcome.CLAIM_LOST


def test_captured_writes_during_a_run_restart_it_and_it_still_completes(db):
    collection = captured_collection(db.engine, "articles", sample_entries("art", 60), MEDIA_FIELDS)
    writer = CmsWriter(db.engine)
    claim = prepared(db, collection)
    epoch = claim.target_epoch
    assert scan_page(db.engine, claim).outcome is ScanOutcome.ADVANCED

    writer.update_entry("articles", "art-e00003", {"title": "edited mid-run"})
    writer.insert_entries("articles", sample_entries("art", 2, start=60))
    # One epoch per captured row: the edit and each of the two inserted entries.
    assert coverage(db.engine, collection)["change_epoch"] == epoch + 3
    assert scan_page(db.engine, claim).outcome is ScanOutcome.RESTART_REQUIRED

    restarted = restart(db.engine, claim)
    assert (restarted.outcome, restarted.restarted) == (ADVANCED, True)
    # The run already owns the status, so the restart keeps the epoch the writes moved to.
    assert restarted.claim.target_epoch == epoch + 3
    assert (restarted.claim.scan_cursor, restarted.claim.scan_upper_id) == (None, "art-e00061")
    assert coverage(db.engine, collection)["status"] == "running"

    assert run_to_completion_with(db, restarted.claim) is ReconciliationOutcome.COMPLETED
    assert_complete(db, collection)
    assert_no_drift(db)


def test_a_captured_write_during_the_source_walk_restarts_the_run(db):
    collection = captured_collection(db.engine, "articles", [image_entry("entry-1")])
    claim = prepared(db, collection)
    assert scan_all(db, claim)[-1] is ScanOutcome.EXHAUSTED
    assert work_processing.process_due_batch(db.engine, 10).counts.completed == 1
    entered = enter_sources(db.engine, claim)
    assert entered.claim.phase == "sources"

    CmsWriter(db.engine).insert_entry("articles", image_entry("entry-2"))
    assert source_page(db.engine, entered.claim).outcome is ScanOutcome.RESTART_REQUIRED
    moved = finalize(db.engine, entered.claim)
    assert (moved.outcome, moved.restarted, moved.claim.phase) == (ADVANCED, True, "scan")

    assert run_to_completion_with(db, moved.claim) is ReconciliationOutcome.COMPLETED
    assert_complete(db, collection)
    assert_no_drift(db)


def test_run_to_completion_reconciles_several_collections(db):
    sizes = {"empty": 0, "small": 7, "large": 120}
    writer = CmsWriter(db.engine)
    collections = {}
    for slug, size in sizes.items():
        collections[slug] = writer.create_collection(slug, MEDIA_FIELDS)
        writer.insert_entries(slug, sample_entries(slug[:3], size))
    activate(db.engine)

    for collection in collections.values():
        assert run_to_completion(db.engine, collection.id) is ReconciliationOutcome.COMPLETED

    for collection in collections.values():
        assert_complete(db, collection)
    assert count(db.engine, schema.work) == 0
    assert count(db.engine, schema.reconciliations) == 0
    assert_no_drift(db)
    assert run_to_completion(db.engine, collections["small"].id) is (
        ReconciliationOutcome.ALREADY_COMPLETE
    )


def test_a_spent_step_budget_hands_the_run_back_to_resume_later(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(120))

    assert run_to_completion(db.engine, collection.id, max_steps=2) is ADVANCED
    row = coordinator(db.engine, collection)
    assert (row["state"], row["scan_cursor"]) == ("pending", "entry-099")
    assert row["next_attempt_at"] <= db_now(db.engine)

    assert run_to_completion(db.engine, collection.id) is ReconciliationOutcome.COMPLETED
    assert_complete(db, collection)


def test_an_exception_in_a_driven_step_is_recorded_for_retry(db, monkeypatch):
    collection = untrusted_collection(db.engine, "articles", entry_ids(3))

    def broken(*_args, **_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(ReconciliationRepository, "find_scan_page", broken)
    assert run_to_completion(db.engine, collection.id) is ReconciliationOutcome.RETRY

    row = coordinator(db.engine, collection)
    assert (row["state"], row["attempt_count"], row["last_error_code"]) == (
        "retry",
        1,
        "MEDIA_USAGE_RECONCILIATION_FAILED",
    )


# --- failures -----------------------------------------------------------------------------------


def test_failed_work_fails_the_run_when_entering_sources(db):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    claim = prepared(db, collection)
    assert scan_all(db, claim)[-1] is ScanOutcome.EXHAUSTED
    with db.engine.begin() as connection:
        connection.execute(
            schema.work.update().values(
                state="failed", last_error_code="MEDIA_USAGE_SNAPSHOT_FAILED"
            )
        )

    assert enter_sources(db.engine, claim).outcome is ReconciliationOutcome.FAILED

    row = coordinator(db.engine, collection)
    assert (row["state"], row["last_error_code"]) == (
        "failed",
        "MEDIA_USAGE_RECONCILIATION_ENTRY_FAILED",
    )
    status = coverage(db.engine, collection)
    assert (status["status"], status["last_error_code"]) == (
        "failed",
        "MEDIA_USAGE_SNAPSHOT_FAILED",
    )


def test_an_invalid_canonical_source_fails_the_run_terminally(db):
    collection = untrusted_collection(db.engine, "articles")
    insert_source(
        db.engine, canonical_key(collection, "odd"), **of(collection), source_variant="other"
    )
    claim = prepared(db, collection)
    assert scan_page(db.engine, claim).outcome is ScanOutcome.EXHAUSTED
    assert enter_sources(db.engine, claim).outcome is ADVANCED

    assert source_page(db.engine, claim).outcome is ReconciliationOutcome.FAILED

    row = coordinator(db.engine, collection)
    assert (row["state"], row["last_error_code"], row["target_epoch"]) == (
        "failed",
        INVALID_SOURCE,
        1,
    )
    status = coverage(db.engine, collection)
    # A canonical index exists, so coverage is partial rather than failed.
    assert (status["status"], status["last_error_code"]) == ("partial", INVALID_SOURCE)


def test_without_media_fields_every_canonical_source_gets_work(db):
    collection = untrusted_collection(db.engine, "plain", ["entry-1", "entry-2"], NO_MEDIA)
    for content_id in ("entry-1", "entry-2", "gone"):
        key = canonical_key(collection, content_id)
        insert_source(db.engine, key, **of(collection), content_id=content_id)
    claim = prepared(db, collection)
    assert scan_page(db.engine, claim).outcome is ScanOutcome.EXHAUSTED
    assert enter_sources(db.engine, claim).outcome is ADVANCED

    assert source_page(db.engine, claim).outcome is ScanOutcome.ADVANCED

    work = work_rows(db.engine, collection)
    assert sorted(work) == ["entry-1", "entry-2", "gone"]
    assert {row["change_epoch"] for row in work.values()} == {1}


# --- the stuck failure without a target epoch -----------------------------------------------------


def stuck_failure(db):
    """A terminal failure recorded before the run ever owned coverage."""
    collection = captured_collection(db.engine, "articles", [image_entry("entry-1")])
    epoch = coverage(db.engine, collection)["change_epoch"]
    claim = claimed(db.engine, collection)
    assert record_step_failure(db.engine, replace(claim, attempt_count=4)) is (
        ReconciliationOutcome.FAILED
    )
    row = coordinator(db.engine, collection)
    # Pinned to the epoch it failed at, so the seed's own reset can reopen it later.
    assert (row["state"], row["target_epoch"]) == ("failed", epoch)
    status = coverage(db.engine, collection)
    assert (status["status"], status["cursor"], status["change_epoch"]) == ("never", None, epoch)
    return collection


def test_a_stuck_failure_heals_automatically_once_the_status_epoch_moves(db):
    collection = stuck_failure(db)
    assert settle_reconciliations(db.engine).counts["failed_reset"] == 0
    assert claim_collection(db.engine, collection.id).outcome is ReconciliationOutcome.FAILED
    assert process_due_reconciliation(db.engine).outcome is ReconciliationOutcome.NOT_DUE

    CmsWriter(db.engine).insert_entry("articles", image_entry("entry-2"))
    settled = settle_reconciliations(db.engine)

    assert settled.counts["failed_reset"] == 1
    row = coordinator(db.engine, collection)
    assert (row["state"], row["target_epoch"], row["attempt_count"]) == ("pending", None, 0)
    assert run_to_completion(db.engine, collection.id) is ReconciliationOutcome.COMPLETED
    assert_complete(db, collection)
    assert_no_drift(db)


def test_a_stuck_failure_heals_by_operator_retry(db):
    collection = stuck_failure(db)

    assert run_to_completion(db.engine, collection.id, reopen=True) is (
        ReconciliationOutcome.COMPLETED
    )

    assert_complete(db, collection)
    assert_no_drift(db)


def test_repeated_exceptions_before_begin_run_leave_a_failure_that_heals(db, monkeypatch):
    collection = captured_collection(db.engine, "articles", [image_entry("entry-1")])

    def broken(*_args, **_kwargs):
        raise RuntimeError("status unavailable")

    monkeypatch.setattr(ReconciliationRepository, "begin_run", broken)
    outcomes = []
    for _ in range(5):
        outcomes.append(process_due_reconciliation(db.engine, rng=lambda: 0.0).outcome)
        make_due(db.engine, collection)
    monkeypatch.undo()

    assert outcomes == [ReconciliationOutcome.RETRY] * 4 + [ReconciliationOutcome.FAILED]
    epoch = coverage(db.engine, collection)["change_epoch"]
    assert coordinator(db.engine, collection)["target_epoch"] == epoch
    CmsWriter(db.engine).update_entry("articles", "entry-1", {"title": "moved"})
    assert process_due_reconciliation(db.engine).outcome is ADVANCED  # the seed's reset
    assert run_to_completion(db.engine, collection.id) is ReconciliationOutcome.COMPLETED


# --- maintenance --------------------------------------------------------------------------------


def test_settle_deletes_obsolete_settles_failed_pins_stuck_and_seeds(db):
    names = ("obsolete", "published", "reset", "stuck", "fresh_a", "fresh_b")
    collections = {name: untrusted_collection(db.engine, name, ["entry-1"]) for name in names}
    repository = ReconciliationRepository(db.engine)
    for name in ("obsolete", "published", "reset", "stuck"):
        assert repository.seed_collection(collections[name].id)
    set_status(db.engine, "obsolete", status="complete", reconciliation_required=0)
    published = prepared(db, collections["published"])
    mark_failed(db.engine, collections["published"], target_epoch=published.target_epoch)
    mark_failed(db.engine, collections["reset"], target_epoch=0)
    set_status(db.engine, "reset", change_epoch=2)
    mark_failed(db.engine, collections["stuck"], target_epoch=None)

    settled = settle_reconciliations(db.engine)

    assert dict(settled.counts) == {
        "obsolete_deleted": 1,
        "failed_published": 1,
        "failed_reset": 1,
        "stuck_pinned": 1,
        "seeded": 2,
    }
    assert coordinator(db.engine, collections["obsolete"]) is None
    assert coverage(db.engine, collections["published"])["status"] == "failed"
    assert coordinator(db.engine, collections["reset"])["state"] == "pending"
    stuck_epoch = coverage(db.engine, collections["stuck"])["change_epoch"]
    assert coordinator(db.engine, collections["stuck"])["target_epoch"] == stuck_epoch
    for name in ("fresh_a", "fresh_b"):
        assert coordinator(db.engine, collections[name])["state"] == "pending"
    assert settle_reconciliations(db.engine).counts == dict.fromkeys(settled.counts, 0)


def test_settle_is_inert_while_capture_is_inactive(db):
    untrusted_collection(db.engine, "articles", activate_capture=False)

    settled = settle_reconciliations(db.engine)

    assert settled.inactive
    assert count(db.engine, schema.reconciliations) == 0


def test_the_tick_reports_the_collection_it_touched(db):
    collection = untrusted_collection(db.engine, "articles", ["entry-1"])
    insert_work(db.engine, **of(collection), content_id="entry-1", change_epoch=0)
    set_activation(db.engine)

    first = process_due_reconciliation(db.engine)

    assert (first.outcome, first.collection_id) == (ADVANCED, collection.id)
    set_status(db.engine, "articles", status="complete", reconciliation_required=0, cursor=None)
    obsolete = process_due_reconciliation(db.engine)
    assert (obsolete.outcome, obsolete.collection_id) == (
        ReconciliationOutcome.COMPLETED,
        collection.id,
    )


@pytest.mark.parametrize(
    ("attempt_count", "lowest", "highest"),
    [(0, 30, 37), (1, 60, 74), (2, 120, 149), (3, 240, 299), (4, 480, 599), (6, 900, 900)],
)
def test_retry_delay_is_the_work_processors_backoff(attempt_count, lowest, highest):
    assert RECONCILIATION_RETRY.delay_seconds(attempt_count, rng=lambda: 0.0) == lowest
    assert RECONCILIATION_RETRY.delay_seconds(attempt_count, rng=lambda: 0.999999) == highest
    assert RECONCILIATION_RETRY.delay_seconds(attempt_count, rng=lambda: 0.5) == (
        WORK_RETRY.delay_seconds(attempt_count, rng=lambda: 0.5)
    )
    assert RECONCILIATION_RETRY == WORK_RETRY


def test_retry_delay_refuses_a_negative_attempt_count():
    with pytest.raises(ValueError, match="attempt count"):
        RECONCILIATION_RETRY.delay_seconds(-1)
