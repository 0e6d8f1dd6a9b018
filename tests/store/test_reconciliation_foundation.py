"""EmDash's `media-usage-reconciliation-foundation` scenarios, the coverage outcomes of the
reconciliation repository, and the additions beyond the seed (lease renewal, healing of the
stuck failed state, operator retry)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from sqlalchemy import inspect, select, update

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.leases import LeaseState, due_candidates_statement
from media_usage_orchestration.store.probes import claimable_reconciliations
from media_usage_orchestration.store.reconciliations import (
    ENTRY_FAILED_CODE,
    LIFECYCLE_MESSAGE,
    ReconciliationPhase,
    ReconciliationRepository,
    WorkBarrier,
    WorkBarrierState,
    find_due_statement,
)
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome
from tests.factories import (
    FUTURE,
    PAST,
    backing_off,
    insert_deletion,
    insert_source,
    insert_work,
    of,
)
from tests.store.reconciliation_helpers import (
    FINGERPRINT,
    OTHER_FINGERPRINT,
    reconciliation_row,
    reload_claim,
    seed_and_claim,
    start_scan,
)
from tests.store.work_helpers import ULID_PATTERN
from tests.support import (
    all_rows,
    assert_same_statement_time,
    backdate,
    count,
    make_collection,
    recorded_statements,
    set_activation,
    set_status,
    snapshot,
    status_row,
)

FAILED_CODE = "MEDIA_USAGE_RECONCILIATION_FAILED"
INVALID_SOURCE_CODE = "MEDIA_USAGE_RECONCILIATION_INVALID_SOURCE"


def identities(db) -> list[tuple[str, str]]:
    rows = all_rows(db.engine, schema.reconciliations)
    return sorted((row["collection_id"], row["collection_slug"]) for row in rows)


def set_reconciliation(db, collection_id: str, **values) -> None:
    table = schema.reconciliations
    with db.engine.begin() as connection:
        connection.execute(
            update(table).where(table.c.collection_id == collection_id).values(**values)
        )


def terminal_failure_without_target(db):
    """The seed's stuck state: a terminal failure while the status is not running this run."""
    repository = ReconciliationRepository(db.engine)
    collection, claim = seed_and_claim(db.engine)
    assert repository.record_failure(
        collection.id, claim.run_token, claim.lease_token, FAILED_CODE, 0, terminal=True
    )
    return repository, collection, claim


# --- upstream foundation scenarios ---------------------------------------------------------------


def test_schema_installs_with_dormant_scheduling(db):
    inspector = inspect(db.engine)
    assert schema.reconciliations.name in inspector.get_table_names()
    names = {index["name"] for index in inspector.get_indexes(schema.reconciliations.name)}
    assert {
        "idx__emdash_media_usage_reconciliations_due",
        "idx__emdash_media_usage_reconciliations_lease",
        "idx__emdash_media_usage_reconciliations_failed",
    } <= names
    status_indexes = {index["name"] for index in inspector.get_indexes(schema.index_status.name)}
    assert "idx__emdash_media_usage_status_reconciliation" in status_indexes
    with db.engine.connect() as connection:
        activation = connection.execute(
            select(schema.activation.c.state, schema.activation.c.media_usage_maintenance_turn)
        ).one()
    assert tuple(activation) == ("expanded", 2)


def test_seeds_at_most_one_exact_active_collection_per_call(db):
    first = make_collection(db.engine, "articles")
    second = make_collection(db.engine, "pages")
    repository = ReconciliationRepository(db.engine)

    assert repository.seed_next_candidate() is False
    set_activation(db.engine)

    assert repository.seed_next_candidate() is True
    expected = sorted([(first.id, first.slug), (second.id, second.slug)])
    assert identities(db) == expected[:1]
    assert repository.seed_next_candidate() is True
    assert identities(db) == expected
    assert repository.seed_next_candidate() is False

    row = reconciliation_row(db.engine, first.id)
    assert re.match(ULID_PATTERN, row["run_token"])
    assert (row["state"], row["phase"], row["target_epoch"]) == ("pending", "scan", None)
    assert_same_statement_time(row["next_attempt_at"], row["updated_at"])


def test_installing_complete_deleting_and_unbound_collections_are_never_seeded(db):
    make_collection(db.engine, "inactive", capture_state="installing")
    make_collection(db.engine, "complete", reconciliation_required=0, status="complete")
    make_collection(db.engine, "deleting", capture_state="deleting")
    insert_deletion(db.engine, **of(make_collection(db.engine, "tombstoned")))
    make_collection(db.engine, "drifted")
    set_status(db.engine, "drifted", collection_id="not-the-registry-id")
    set_activation(db.engine)

    assert ReconciliationRepository(db.engine).seed_next_candidate() is False
    assert identities(db) == []


def test_claims_due_row_once_and_fences_stale_lease_owners(db):
    collection = make_collection(db.engine, "articles")
    set_activation(db.engine)
    repository = ReconciliationRepository(db.engine)
    assert repository.seed_next_candidate()
    [candidate] = repository.find_due(4)

    claim = repository.claim(collection.id, candidate.run_token, 60)
    assert claim is not None
    assert (claim.state, claim.collection_id) == (LeaseState.LEASED, collection.id)
    assert re.match(ULID_PATTERN, claim.lease_token)
    assert claim.lease_expires_at > claim.updated_at
    assert repository.claim(collection.id, candidate.run_token, 60) is None

    assert repository.release(collection.id, candidate.run_token, "stale-owner", 30) is False
    assert repository.release(collection.id, candidate.run_token, claim.lease_token, 30) is True
    row = reconciliation_row(db.engine, collection.id)
    assert (row["state"], row["lease_token"], row["attempt_count"]) == ("pending", None, 0)
    assert row["next_attempt_at"] > row["updated_at"]


def test_does_not_claim_after_coverage_becomes_complete(db):
    collection = make_collection(db.engine, "articles")
    set_activation(db.engine)
    repository = ReconciliationRepository(db.engine)
    assert repository.seed_next_candidate()
    [candidate] = repository.find_due(4)
    set_status(db.engine, "articles", status="complete", reconciliation_required=0)

    assert repository.claim(collection.id, candidate.run_token, 60) is None


@pytest.mark.parametrize(
    "change",
    ["inactive_activation", "tombstone", "registry_drift"],
)
def test_claim_requires_active_current_undeleted_collection(db, change):
    collection = make_collection(db.engine, "articles")
    set_activation(db.engine)
    repository = ReconciliationRepository(db.engine)
    assert repository.seed_next_candidate()
    [candidate] = repository.find_due(4)
    if change == "inactive_activation":
        set_activation(db.engine, "expanded")
    elif change == "tombstone":
        insert_deletion(db.engine, **of(collection))
    else:
        set_status(db.engine, "articles", collection_id="other-id")

    assert repository.claim(collection.id, candidate.run_token, 60) is None
    assert reconciliation_row(db.engine, collection.id)["state"] == "pending"


def test_bounded_retry_and_terminal_failure_without_hot_looping(db):
    collection, first_claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    run_token = first_claim.run_token

    assert repository.record_failure(
        collection.id, run_token, first_claim.lease_token, FAILED_CODE, 30, terminal=False
    )
    row = reconciliation_row(db.engine, collection.id)
    assert (row["state"], row["attempt_count"], row["lease_token"]) == ("retry", 1, None)
    assert row["next_attempt_at"] > row["updated_at"]
    assert repository.find_due(4) == []
    assert repository.claim(collection.id, run_token, 60) is None

    set_reconciliation(db, collection.id, next_attempt_at=PAST)
    retry_claim = repository.claim(collection.id, run_token, 60)
    assert retry_claim is not None
    assert repository.record_failure(
        collection.id, run_token, retry_claim.lease_token, INVALID_SOURCE_CODE, 0, terminal=True
    )

    assert repository.find_due(4) == []
    assert repository.find_failed(4) == []
    row = reconciliation_row(db.engine, collection.id)
    assert (row["state"], row["attempt_count"], row["last_error_code"]) == (
        "failed",
        2,
        INVALID_SOURCE_CODE,
    )
    assert row["target_epoch"] is None


def test_fifth_non_terminal_failure_fails(db):
    collection, claim = seed_and_claim(db.engine)
    set_reconciliation(db, collection.id, attempt_count=4)
    repository = ReconciliationRepository(db.engine)

    assert repository.record_failure(
        collection.id, claim.run_token, claim.lease_token, FAILED_CODE, 30, terminal=False
    )
    row = reconciliation_row(db.engine, collection.id)
    assert (row["state"], row["attempt_count"]) == ("failed", 5)


def test_failure_is_refused_once_the_lease_expired(db):
    collection, claim = seed_and_claim(db.engine)
    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=collection.id)
    repository = ReconciliationRepository(db.engine)

    assert not repository.record_failure(
        collection.id, claim.run_token, claim.lease_token, FAILED_CODE, 0, terminal=True
    )
    assert not repository.release(collection.id, claim.run_token, claim.lease_token, 0)
    assert reconciliation_row(db.engine, collection.id)["state"] == "leased"


def test_reopens_failed_work_only_after_a_newer_coverage_epoch(db):
    collection = make_collection(db.engine, "articles")
    set_activation(db.engine)
    repository = ReconciliationRepository(db.engine)
    assert repository.seed_next_candidate()
    set_reconciliation(
        db,
        collection.id,
        state="failed",
        target_epoch=4,
        attempt_count=5,
        last_error_code=FAILED_CODE,
    )
    run_token = reconciliation_row(db.engine, collection.id)["run_token"]
    observed = repository.find_by_identity(collection.id, run_token)

    set_status(db.engine, "articles", change_epoch=4, cursor=None)
    assert repository.find_failed(4) == []
    assert repository.reset_failed_for_new_epoch(observed) is False

    set_status(db.engine, "articles", change_epoch=5)
    assert repository.find_failed(4) == [observed]
    assert repository.reset_failed_for_new_epoch(observed) is True
    row = reconciliation_row(db.engine, collection.id)
    assert (row["state"], row["target_epoch"], row["attempt_count"], row["last_error_code"]) == (
        "pending",
        None,
        0,
        None,
    )
    assert row["phase"] == "scan" and row["run_token"] == observed.run_token


def test_failed_rows_are_listed_when_coverage_was_completed_or_is_still_running(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim)
    assert repository.record_failure(
        collection.id, claim.run_token, claim.lease_token, FAILED_CODE, 0, terminal=True
    )
    [listed] = repository.find_failed(4)
    assert (listed.collection_id, listed.target_epoch) == (collection.id, epoch)

    set_status(db.engine, "articles", status="complete", reconciliation_required=0, cursor=None)
    assert [record.collection_id for record in repository.find_failed(4)] == [collection.id]


# --- runs, restarts and coverage outcomes -------------------------------------------------------


def test_begin_run_takes_coverage_once_per_run_and_defers_to_a_foreign_owner(db):
    _collection, claim = seed_and_claim(db.engine)
    set_status(db.engine, "articles", indexed_source_count=7, last_error_code="OLD_CODE")
    repository = ReconciliationRepository(db.engine)

    assert repository.begin_run(claim) == 1
    status = status_row(db.engine, "articles")
    assert (status["status"], status["cursor"], status["change_epoch"]) == (
        "running",
        claim.run_token,
        1,
    )
    assert (status["indexed_source_count"], status["last_error_code"]) == (0, None)
    started_at = status["started_at"]
    assert repository.begin_run(claim) == 1
    assert status_row(db.engine, "articles")["started_at"] == started_at

    set_status(db.engine, "articles", cursor="manual-repair-token")
    before = status_row(db.engine, "articles")
    assert repository.begin_run(claim) is None
    assert status_row(db.engine, "articles") == before


def test_begin_run_requires_the_live_claim(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    assert repository.begin_run(replace(claim, lease_token="stale-owner")) is None
    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=collection.id)
    assert repository.begin_run(claim) is None
    assert status_row(db.engine, "articles")["status"] == "stale"


def test_terminal_failure_after_begin_run_keeps_the_running_epoch(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    epoch = repository.begin_run(claim)

    assert repository.record_failure(
        collection.id, claim.run_token, claim.lease_token, FAILED_CODE, 0, terminal=True
    )
    assert reconciliation_row(db.engine, collection.id)["target_epoch"] == epoch


def test_interrupted_restart_keeps_the_epoch_it_already_moved(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim, "entry-009")
    assert repository.checkpoint_scan(claim, epoch, None, "entry-004")
    assert repository.owns_run(claim, epoch)
    started_at = status_row(db.engine, "articles")["started_at"]

    set_status(db.engine, "articles", change_epoch=epoch + 1)  # a captured write
    assert not repository.owns_run(claim, epoch)
    assert repository.restart_run(claim, epoch) == epoch + 1
    assert repository.restart_run(claim, epoch) == epoch + 1
    assert status_row(db.engine, "articles")["started_at"] == started_at

    assert not repository.restart_scan(claim, epoch + 1, epoch + 1, OTHER_FINGERPRINT, None)
    assert repository.restart_scan(claim, epoch, epoch + 1, OTHER_FINGERPRINT, "entry-010")
    row = reconciliation_row(db.engine, collection.id)
    assert (row["target_epoch"], row["field_fingerprint"], row["phase"]) == (
        epoch + 1,
        OTHER_FINGERPRINT,
        "scan",
    )
    assert (row["scan_cursor"], row["scan_upper_id"], row["source_cursor"]) == (
        None,
        "entry-010",
        None,
    )
    assert repository.owns_run(claim, epoch + 1)

    assert repository.restart_run(claim, epoch + 1) == epoch + 2


def test_restart_run_defers_to_a_foreign_owner(db):
    _collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim)
    set_status(db.engine, "articles", cursor="manual-repair-token", change_epoch=epoch + 1)
    assert repository.restart_run(claim, epoch) is None
    assert status_row(db.engine, "articles")["cursor"] == "manual-repair-token"


def test_initialize_scan_only_once_per_run_and_only_while_the_status_is_owned(db):
    _collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    epoch = repository.begin_run(claim)
    assert not repository.initialize_scan(claim, epoch + 1, FINGERPRINT, None)
    assert repository.initialize_scan(claim, epoch, FINGERPRINT, None)
    assert not repository.initialize_scan(claim, epoch, FINGERPRINT, None)


def test_finish_failed_coverage_reports_failed_without_an_index(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    start_scan(db.engine, claim)
    assert not repository.finish_failed_coverage(collection.id, claim.run_token)

    assert repository.record_failure(
        collection.id, claim.run_token, claim.lease_token, FAILED_CODE, 0, terminal=True
    )
    assert not repository.finish_failed_coverage(collection.id, "another-run")
    assert repository.finish_failed_coverage(collection.id, claim.run_token)
    status = status_row(db.engine, "articles")
    assert (status["status"], status["cursor"], status["reconciliation_required"]) == (
        "failed",
        None,
        1,
    )
    assert (status["last_error_code"], status["completed_at"]) == (FAILED_CODE, None)
    assert not repository.finish_failed_coverage(collection.id, claim.run_token)


def test_finish_failed_coverage_reports_partial_over_a_canonical_index(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    insert_source(db.engine, "content:articles:entry-000", **of(collection))
    start_scan(db.engine, claim)
    assert repository.record_failure(
        collection.id, claim.run_token, claim.lease_token, FAILED_CODE, 0, terminal=True
    )
    assert repository.finish_failed_coverage(collection.id, claim.run_token)
    assert status_row(db.engine, "articles")["status"] == "partial"


def test_legacy_sources_do_not_make_coverage_partial(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    insert_source(db.engine, "legacy:entry-000", **of(collection), identity_version=None)
    start_scan(db.engine, claim)
    assert repository.record_failure(
        collection.id, claim.run_token, claim.lease_token, FAILED_CODE, 0, terminal=True
    )
    assert repository.finish_failed_coverage(collection.id, claim.run_token)
    assert status_row(db.engine, "articles")["status"] == "failed"


def test_entry_failure_is_refused_without_failed_work_and_reports_the_first_work_code(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    _epoch, claim = start_scan(db.engine, claim)
    assert repository.record_entry_failure(claim) is False
    insert_work(db.engine, **of(collection), content_id="entry-000", change_epoch=0)
    assert repository.record_entry_failure(claim) is False
    assert repository.find_work_barrier(collection.id) == WorkBarrier(WorkBarrierState.PENDING)

    insert_work(
        db.engine,
        **of(collection),
        content_id="entry-009",
        change_epoch=0,
        state="failed",
        last_error_code="LATE",
    )
    insert_work(
        db.engine,
        **of(collection),
        content_id="entry-005",
        change_epoch=0,
        state="failed",
        last_error_code="FIRST",
    )
    assert repository.find_work_barrier(collection.id) == WorkBarrier(
        WorkBarrierState.FAILED, "FIRST"
    )
    assert repository.record_entry_failure(replace(claim, lease_token="stale")) is False
    assert repository.record_entry_failure(claim) is True
    row = reconciliation_row(db.engine, collection.id)
    assert (row["state"], row["attempt_count"], row["last_error_code"]) == (
        "failed",
        1,
        ENTRY_FAILED_CODE,
    )
    assert (row["lease_token"], row["lease_expires_at"]) == (None, None)

    assert repository.finish_failed_coverage(collection.id, claim.run_token)
    assert status_row(db.engine, "articles")["last_error_code"] == "FIRST"


def test_entry_failure_without_a_work_code_keeps_the_entry_failed_code(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    _epoch, claim = start_scan(db.engine, claim)
    insert_work(db.engine, **of(collection), content_id="entry-001", change_epoch=0, state="failed")
    assert repository.find_work_barrier(collection.id).error_code == (
        "MEDIA_USAGE_PROCESSING_FAILED"
    )
    assert repository.record_entry_failure(claim)
    assert repository.finish_failed_coverage(collection.id, claim.run_token)
    assert status_row(db.engine, "articles")["last_error_code"] == ENTRY_FAILED_CODE


def _in_sources_phase(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim)
    assert repository.transition_to_sources(claim, epoch, FINGERPRINT, None)
    return repository, collection, reload_claim(db.engine, claim), epoch


def test_finalize_coverage_guards_then_delete_finalized(db):
    repository, collection, claim, epoch = _in_sources_phase(db)
    assert repository.delete_finalized(claim) is False

    assert not repository.finalize_coverage(claim, epoch, OTHER_FINGERPRINT)
    assert not repository.finalize_coverage(claim, epoch + 1, FINGERPRINT)
    assert not repository.finalize_coverage(replace(claim, lease_token="stale"), epoch, FINGERPRINT)
    insert_work(db.engine, **of(collection), content_id="entry-000", change_epoch=epoch)
    assert not repository.finalize_coverage(claim, epoch, FINGERPRINT)
    with db.engine.begin() as connection:
        connection.execute(schema.work.delete())
    set_activation(db.engine, "expanded")
    assert not repository.finalize_coverage(claim, epoch, FINGERPRINT)
    set_activation(db.engine, "active")
    assert status_row(db.engine, "articles")["status"] == "running"

    assert repository.finalize_coverage(claim, epoch, FINGERPRINT)
    status = status_row(db.engine, "articles")
    assert (status["status"], status["reconciliation_required"], status["cursor"]) == (
        "complete",
        0,
        None,
    )
    assert status["completed_at"] is not None and status["schema_version"] == 1

    assert repository.delete_finalized(replace(claim, lease_token="stale")) is False
    assert repository.delete_finalized(claim) is True
    assert reconciliation_row(db.engine, collection.id) is None


@pytest.mark.parametrize("change", ["expired_lease", "tombstone", "scan_phase"])
def test_finalize_coverage_is_refused_without_a_live_sources_claim(db, change):
    repository, collection, claim, epoch = _in_sources_phase(db)
    if change == "expired_lease":
        backdate(
            db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=collection.id
        )
    elif change == "tombstone":
        insert_deletion(db.engine, **of(collection))
    else:
        set_reconciliation(db, collection.id, phase="scan")
    assert not repository.finalize_coverage(claim, epoch, FINGERPRINT)
    assert status_row(db.engine, "articles")["status"] == "running"


def test_transition_to_sources_waits_for_every_work_row(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim)
    insert_work(db.engine, **of(collection), content_id="entry-000", change_epoch=epoch + 5)
    assert not repository.transition_to_sources(claim, epoch, FINGERPRINT, None)
    with db.engine.begin() as connection:
        connection.execute(schema.work.delete())
    assert not repository.transition_to_sources(claim, epoch, OTHER_FINGERPRINT, None)
    assert repository.transition_to_sources(claim, epoch, FINGERPRINT, "content:z")
    row = reconciliation_row(db.engine, collection.id)
    assert (row["phase"], row["source_upper_key"], row["source_cursor"]) == (
        "sources",
        "content:z",
        None,
    )
    assert not repository.transition_to_sources(claim, epoch, FINGERPRINT, None)


def test_delete_one_obsolete_removes_one_trusted_coordinator_in_any_state(db):
    articles = make_collection(db.engine, "articles")
    pages = make_collection(db.engine, "pages")
    set_activation(db.engine)
    repository = ReconciliationRepository(db.engine)
    assert repository.seed_next_candidate() and repository.seed_next_candidate()
    assert repository.delete_one_obsolete() is False

    run_token = reconciliation_row(db.engine, pages.id)["run_token"]
    assert repository.claim(pages.id, run_token, 60) is not None
    set_status(db.engine, "pages", status="complete", reconciliation_required=0)
    assert repository.delete_one_obsolete() is True
    assert identities(db) == [(articles.id, "articles")]
    assert repository.delete_one_obsolete() is False


# --- additions beyond the seed ---------------------------------------------------------------


def test_renew_lease_extends_only_a_live_lease_held_by_the_token(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)

    renewed = repository.renew_lease(claim, 600)
    assert renewed is not None and renewed > claim.lease_expires_at
    assert reconciliation_row(db.engine, collection.id)["lease_expires_at"] == renewed
    assert repository.renew_lease(replace(claim, lease_token="stale-owner"), 600) is None

    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=collection.id)
    expired = reconciliation_row(db.engine, collection.id)
    assert repository.renew_lease(claim, 600) is None
    assert reconciliation_row(db.engine, collection.id) == expired


def test_stuck_failure_heals_automatically_once_the_status_epoch_moves(db):
    repository, collection, claim = terminal_failure_without_target(db)
    assert repository.find_failed(4) == []
    [stuck] = repository.find_stuck_failed(4)
    assert (stuck.collection_id, stuck.target_epoch) == (collection.id, None)
    assert repository.reset_failed_for_new_epoch(stuck) is False
    assert repository.seed_next_candidate() is False

    assert repository.pin_stuck_failed_epoch(collection.id, claim.run_token) == 0
    assert repository.pin_stuck_failed_epoch(collection.id, claim.run_token) is None
    assert repository.find_stuck_failed(4) == []
    assert repository.find_failed(4) == []

    set_status(db.engine, "articles", change_epoch=1)  # a captured write
    [failed] = repository.find_failed(4)
    assert failed.target_epoch == 0
    assert repository.finish_failed_coverage(collection.id, claim.run_token) is False
    assert repository.reset_failed_for_new_epoch(failed) is True
    row = reconciliation_row(db.engine, collection.id)
    assert (row["state"], row["target_epoch"], row["attempt_count"]) == ("pending", None, 0)
    assert repository.claim(collection.id, claim.run_token, 60) is not None


def test_stuck_failure_is_not_pinned_while_someone_owns_coverage(db):
    repository, collection, claim = terminal_failure_without_target(db)
    set_status(db.engine, "articles", status="running", cursor="manual-repair-token")
    assert repository.find_stuck_failed(4) == []
    assert repository.pin_stuck_failed_epoch(collection.id, claim.run_token) is None
    assert repository.reset_stuck_failed(collection.id) is False
    assert reconciliation_row(db.engine, collection.id)["state"] == "failed"


def test_reset_stuck_failed_reopens_only_a_targetless_failure(db):
    repository, collection, claim = terminal_failure_without_target(db)
    assert repository.reset_stuck_failed("unknown-collection") is False
    assert repository.reset_stuck_failed(collection.id) is True
    row = reconciliation_row(db.engine, collection.id)
    assert (row["state"], row["phase"], row["attempt_count"], row["last_error_code"]) == (
        "pending",
        "scan",
        0,
        None,
    )
    assert row["run_token"] == claim.run_token

    set_reconciliation(db, collection.id, state="failed", target_epoch=0)
    assert repository.reset_stuck_failed(collection.id) is False


def test_operator_retry_reopens_failed_retrying_and_expired_rows(db):
    repository, collection, claim = terminal_failure_without_target(db)
    result = repository.retry_failed_by_operator(collection.id)
    assert result.outcome is OperatorRetryOutcome.PENDING and result.changed
    assert result.record.state is LeaseState.PENDING
    assert result.record.phase is ReconciliationPhase.SCAN
    assert (result.record.target_epoch, result.record.attempt_count) == (None, 0)
    assert result.record.last_error_code is None

    assert repository.retry_failed_by_operator(collection.id).outcome is (
        OperatorRetryOutcome.CONFLICT
    )

    fresh = repository.claim(collection.id, claim.run_token, 60)
    before = reconciliation_row(db.engine, collection.id)
    live = repository.retry_failed_by_operator(collection.id)
    assert live.outcome is OperatorRetryOutcome.LEASE_ACTIVE
    assert live.lease_expires_at == fresh.lease_expires_at
    assert reconciliation_row(db.engine, collection.id) == before

    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=collection.id)
    assert repository.retry_failed_by_operator(collection.id).outcome is (
        OperatorRetryOutcome.PENDING
    )
    set_reconciliation(db, collection.id, **backing_off(until=FUTURE))
    assert repository.retry_failed_by_operator(collection.id).outcome is (
        OperatorRetryOutcome.PENDING
    )
    assert repository.retry_failed_by_operator("missing").outcome is OperatorRetryOutcome.NOT_FOUND


# --- finding due rows ---------------------------------------------------------------------------


def test_find_due_orders_lease_expired_then_retry_then_pending(db):
    slugs = ["leased", "retrying", "waiting", "future", "live", "failing"]
    collections = {slug: make_collection(db.engine, slug) for slug in slugs}
    set_activation(db.engine)
    repository = ReconciliationRepository(db.engine)
    for _ in slugs:
        assert repository.seed_next_candidate()
    ids = {slug: collection.id for slug, collection in collections.items()}
    for slug in ("leased", "live"):
        run_token = reconciliation_row(db.engine, ids[slug])["run_token"]
        assert repository.claim(ids[slug], run_token, 60)
    set_reconciliation(db, ids["retrying"], state="retry")
    set_reconciliation(db, ids["future"], next_attempt_at="2999-01-01T00:00:00.000Z")
    set_reconciliation(db, ids["failing"], state="failed")
    backdate(db.engine, schema.reconciliations, "lease_expires_at", 30, collection_id=ids["leased"])
    backdate(
        db.engine, schema.reconciliations, "next_attempt_at", 20, collection_id=ids["retrying"]
    )
    backdate(db.engine, schema.reconciliations, "next_attempt_at", 10, collection_id=ids["waiting"])

    due = repository.find_due(4)
    assert [record.collection_slug for record in due] == ["leased", "retrying", "waiting"]
    assert [record.collection_slug for record in repository.find_due(1)] == ["leased"]


@pytest.mark.parametrize(
    "build",
    [
        lambda: find_due_statement(4),
        # the sensors' probe: the same branches over undeleted, registered collections only
        lambda: due_candidates_statement(claimable_reconciliations(), 4),
    ],
    ids=["repository", "sensor-probe"],
)
def test_find_due_walks_the_due_and_lease_indexes(db, build):
    if db.is_postgres:
        pytest.skip("EXPLAIN QUERY PLAN is SQLite's")
    statement = build()
    sql = str(statement.compile(dialect=db.engine.dialect, compile_kwargs={"literal_binds": True}))
    with db.engine.connect() as connection:
        plan = " ".join(
            str(row[-1]) for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")
        )
    assert "idx__emdash_media_usage_reconciliations_due" in plan
    assert "idx__emdash_media_usage_reconciliations_lease" in plan


def test_an_unknown_lifecycle_in_a_row_is_refused(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    set_reconciliation(db, collection.id, phase="drain")
    with pytest.raises(ValueError, match=LIFECYCLE_MESSAGE):
        repository.find_by_identity(collection.id, claim.run_token)
    set_reconciliation(db, collection.id, phase="scan", state="paused")
    with pytest.raises(ValueError, match=LIFECYCLE_MESSAGE):
        repository.find_by_identity(collection.id, claim.run_token)


# --- bad input ----------------------------------------------------------------------------------


def _bad_calls(repository: ReconciliationRepository, claim):
    cid, run, lease = claim.collection_id, claim.run_token, claim.lease_token
    injected = replace(claim, collection_slug="x; drop table ec_articles")
    return [
        (lambda: repository.find_due(0), "candidate limit"),
        (lambda: repository.find_due(101), "candidate limit"),
        (lambda: repository.find_failed(True), "candidate limit"),
        (lambda: repository.find_stuck_failed(101), "candidate limit"),
        (lambda: repository.find_scan_page(claim, 0), "scan page limit"),
        (lambda: repository.find_scan_page(claim, 51), "scan page limit"),
        (lambda: repository.find_source_page(claim, 51), "source page limit"),
        (lambda: repository.find_by_identity("", run), "exact collection and run token"),
        (lambda: repository.find_by_identity(cid, ""), "exact collection and run token"),
        (lambda: repository.claim(cid, run, 0), "lease duration"),
        (lambda: repository.claim(cid, run, 31_536_001), "lease duration"),
        (lambda: repository.claim(cid, run, 1.5), "lease duration"),
        (lambda: repository.claim("", run, 60), "exact collection and run token"),
        (lambda: repository.release(cid, run, "", 0), "lease token"),
        (lambda: repository.release(cid, run, lease, -1), "release delay"),
        (lambda: repository.record_failure(cid, run, lease, "boom: at x.py:3", 0, True), "stable"),
        (lambda: repository.record_failure(cid, run, lease, "lower_case", 0, True), "stable"),
        (lambda: repository.record_failure(cid, run, lease, FAILED_CODE, -1, True), "retry delay"),
        (lambda: repository.record_failure(cid, run, lease, FAILED_CODE, 0, "yes"), "terminal"),
        (lambda: repository.renew_lease(claim, 0), "lease duration"),
        (lambda: repository.renew_lease(replace(claim, lease_token=None), 60), "lease token"),
        (lambda: repository.begin_run(replace(claim, lease_token="")), "lease token"),
        (lambda: repository.initialize_scan(claim, -1, FINGERPRINT, None), "epoch"),
        (lambda: repository.initialize_scan(claim, "01", FINGERPRINT, None), "epoch"),
        (lambda: repository.initialize_scan(claim, 1, "", None), "fingerprint"),
        (lambda: repository.checkpoint_scan(claim, 1, None, ""), "next cursor"),
        (lambda: repository.finalize_coverage(claim, 1, FINGERPRINT, 0), "schema version"),
        (lambda: repository.find_work_barrier(""), "collection ID"),
        (lambda: repository.finish_failed_coverage(cid, ""), "exact collection and run token"),
        (lambda: repository.retry_failed_by_operator(""), "collection ID"),
        (lambda: repository.reset_stuck_failed(""), "collection ID"),
        (lambda: repository.pin_stuck_failed_epoch(cid, ""), "exact collection and run token"),
        (lambda: repository.find_missing_content_ids("articles", ["a", ""]), "content identity"),
        (lambda: repository.find_missing_content_ids("articles", "entry-1"), "content identity"),
        (
            lambda: repository.find_missing_content_ids("articles", [f"e{n}" for n in range(51)]),
            "content identity",
        ),
        (lambda: repository.find_missing_content_ids("x; drop table ec_articles", ["a"]), "slug"),
        (lambda: repository.find_missing_content_ids("Articles", ["a"]), "slug"),
        (lambda: repository.find_scan_upper_id(injected), "slug"),
        (lambda: repository.find_scan_page(replace(claim, collection_slug="Articles"), 10), "slug"),
    ]


def test_bad_input_raises_before_any_sql_and_changes_nothing(db):
    _collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    before = snapshot(db.engine)
    for call, message in _bad_calls(repository, claim):
        with recorded_statements(db.engine) as sent, pytest.raises(ValueError, match=message):
            call()
        assert sent == [], message
    assert snapshot(db.engine) == before
    assert count(db.engine, schema.reconciliations, state="leased") == 1
