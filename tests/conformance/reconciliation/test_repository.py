"""EmDash's `media-usage-reconciliation-foundation` scenarios, the coverage outcomes of the
reconciliation repository, and the additions beyond the seed (lease renewal, healing of the
stuck failed state, operator retry).

The repository steps of EmDash's `media-usage-reconciliation-scan` scenario: a bounded,
checkpointed scan of `ec_<slug>` that enqueues entry work at the run's epoch, then a bounded
walk over the collection's canonical sources.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from sqlalchemy import inspect, select, update

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.leases import LeaseState, due_candidates_statement
from media_usage_orchestration.store.reads.probes import claimable_reconciliations
from media_usage_orchestration.store.reconciliation.records import (
    ENTRY_FAILED_CODE,
    LIFECYCLE_MESSAGE,
    ReconciliationPhase,
    SourceCandidate,
    WorkBarrier,
    WorkBarrierState,
)
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from media_usage_orchestration.store.reconciliation.statements import find_due_statement
from media_usage_orchestration.store.work.repository import WorkRepository
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome
from tests.support.factories import (
    FUTURE,
    PAST,
    backing_off,
    insert_deletion,
    insert_source,
    insert_work,
    of,
)
from tests.support.reconciliations import (
    FINGERPRINT,
    OTHER_FINGERPRINT,
    reconciliation_row,
    reload_claim,
    seed_and_claim,
    start_scan,
)
from tests.support.states import (
    NO_MEDIA,
    all_rows,
    assert_same_statement_time,
    backdate,
    count,
    make_collection,
    set_activation,
    set_status,
    status_row,
)
from tests.support.work import ULID_PATTERN

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
    assert result.row.state is LeaseState.PENDING
    assert result.row.phase is ReconciliationPhase.SCAN
    assert (result.row.target_epoch, result.row.attempt_count) == (None, 0)
    assert result.row.last_error_code is None

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
@pytest.mark.sqlite_only("EXPLAIN QUERY PLAN is SQLite's")
def test_find_due_walks_the_due_and_lease_indexes(db, build):
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


# ==================================================================================================
# The scan and sources phases' repository steps
# ==================================================================================================


ENTRY_IDS = [f"entry-{number:03d}" for number in range(51)]


def entries_collection(db, slug: str = "posts", fields=None):
    """51 entries with an image, written before activation (no captured epoch moves)."""
    kwargs = {} if fields is None else {"fields": fields}
    collection = make_collection(db.engine, slug, **kwargs)
    rows = [{"id": content_id, "title": content_id} for content_id in ENTRY_IDS]
    if fields is None:
        for row in rows:
            row["hero"] = {"id": f"media-{row['id']}", "provider": "local"}
    CmsWriter(db.engine).insert_entries(slug, rows)
    return collection


def claimed_scan(db, slug: str = "posts", fields=None):
    return seed_and_claim_existing(db, entries_collection(db, slug, fields))


def seed_and_claim_existing(db, collection):
    set_activation(db.engine)
    repository = ReconciliationRepository(db.engine)
    assert repository.seed_next_candidate()
    run_token = reconciliation_row(db.engine, collection.id)["run_token"]
    claim = repository.claim(collection.id, run_token, 60)
    assert claim is not None
    return collection, claim


def enqueue(db, claim, epoch, ids, phase="scan"):
    WorkRepository(db.engine).enqueue_reconciliation_page(
        collection_id=claim.collection_id,
        collection_slug=claim.collection_slug,
        run_token=claim.run_token,
        lease_token=claim.lease_token,
        change_epoch=epoch,
        phase=phase,
        content_ids=ids,
    )


def work_by_id(db, collection) -> dict[str, dict]:
    rows = all_rows(db.engine, schema.work, collection_id=collection.id)
    return {row["content_id"]: row for row in rows}


def test_scan_pages_enqueue_work_at_the_run_epoch_and_checkpoint(db):
    collection = entries_collection(db)
    insert_work(db.engine, **of(collection), content_id="entry-001", state="failed", change_epoch=0)
    insert_work(
        db.engine,
        **of(collection),
        content_id="entry-002",
        state="failed",
        change_epoch=99,
        last_error_code="KEEP",
    )
    _collection, claim = seed_and_claim_existing(db, collection)
    repository = ReconciliationRepository(db.engine)

    epoch = repository.begin_run(claim)
    assert epoch == 1
    upper = repository.find_scan_upper_id(claim)
    assert upper == "entry-050"
    assert repository.initialize_scan(claim, epoch, FINGERPRINT, upper)
    claim = reload_claim(db.engine, claim)
    assert (claim.target_epoch, claim.field_fingerprint, claim.scan_upper_id) == (
        1,
        FINGERPRINT,
        "entry-050",
    )

    page = repository.find_scan_page(claim, 50)
    assert page == ENTRY_IDS[:50]
    enqueue(db, claim, epoch, page)
    assert repository.checkpoint_scan(claim, epoch, None, page[-1])
    assert reconciliation_row(db.engine, collection.id)["scan_cursor"] == "entry-049"

    work = work_by_id(db, collection)
    assert sorted(work) == ENTRY_IDS[:50]
    reopened = work["entry-001"]
    assert (reopened["change_epoch"], reopened["work_version"], reopened["state"]) == (
        1,
        2,
        "pending",
    )
    untouched = work["entry-002"]
    assert (untouched["change_epoch"], untouched["state"], untouched["last_error_code"]) == (
        99,
        "failed",
        "KEEP",
    )
    assert {row["change_epoch"] for cid, row in work.items() if cid != "entry-002"} == {1}


def test_replaying_a_page_after_resetting_the_cursor_is_idempotent(db):
    collection, claim = claimed_scan(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim, "entry-050")
    page = repository.find_scan_page(claim, 50)
    enqueue(db, claim, epoch, page)
    assert repository.checkpoint_scan(claim, epoch, None, page[-1])
    first = work_by_id(db, collection)

    with db.engine.begin() as connection:
        connection.execute(
            schema.reconciliations.update()
            .where(schema.reconciliations.c.collection_id == collection.id)
            .values(scan_cursor=None)
        )
    claim = reload_claim(db.engine, claim)
    assert repository.find_scan_page(claim, 50) == page
    enqueue(db, claim, epoch, page)
    assert repository.checkpoint_scan(claim, epoch, None, page[-1])

    assert count(db.engine, schema.work, collection_id=collection.id) == 50
    assert work_by_id(db, collection) == first


def test_the_scan_continues_to_the_upper_id_then_is_exhausted(db):
    collection, claim = claimed_scan(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim, "entry-050")
    first_page = repository.find_scan_page(claim, 50)
    enqueue(db, claim, epoch, first_page)
    assert repository.checkpoint_scan(claim, epoch, None, "entry-049")
    CmsWriter(db.engine).insert_entry("posts", {"id": "entry-051", "title": "late"})
    claim = reload_claim(db.engine, claim)

    second_page = repository.find_scan_page(claim, 50)
    assert second_page == ["entry-050"]
    enqueue(db, claim, epoch, second_page)
    assert not repository.checkpoint_scan(claim, epoch, None, "entry-050")
    assert not repository.checkpoint_scan(claim, epoch, "entry-010", "entry-050")
    assert repository.checkpoint_scan(claim, epoch, "entry-049", "entry-050")
    assert not repository.checkpoint_scan(claim, epoch, "entry-049", "entry-050")

    claim = reload_claim(db.engine, claim)
    assert claim.scan_cursor == "entry-050"
    assert repository.find_scan_page(claim, 50) == []
    assert count(db.engine, schema.work, collection_id=collection.id) == 51


def test_scan_reads_and_checkpoints_need_the_live_claim_and_the_owned_epoch(db):
    collection, claim = claimed_scan(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim, "entry-050")
    assert repository.find_scan_page(replace(claim, lease_token="stale"), 50) == []
    assert repository.find_scan_page(replace(claim, target_epoch=None), 50) == []
    assert not repository.checkpoint_scan(claim, epoch + 1, None, "entry-049")
    assert not repository.checkpoint_scan(
        replace(claim, lease_token="stale"), epoch, None, "entry-049"
    )

    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=collection.id)
    assert repository.find_scan_upper_id(claim) is None
    assert repository.find_scan_page(claim, 50) == []
    assert not repository.checkpoint_scan(claim, epoch, None, "entry-049")


def test_a_collection_without_media_fields_scans_nothing(db):
    collection, claim = claimed_scan(db, "notes", NO_MEDIA)
    repository = ReconciliationRepository(db.engine)
    epoch = repository.begin_run(claim)
    assert repository.initialize_scan(claim, epoch, FINGERPRINT, None)
    claim = reload_claim(db.engine, claim)
    assert claim.scan_upper_id is None
    assert repository.find_scan_page(claim, 50) == []
    assert count(db.engine, schema.work, collection_id=collection.id) == 0


def test_an_empty_collection_has_no_upper_id(db):
    collection = make_collection(db.engine, "empty")
    _collection, claim = seed_and_claim_existing(db, collection)
    assert ReconciliationRepository(db.engine).find_scan_upper_id(claim) is None


def _sources_fixture(db):
    collection, claim = seed_and_claim(db.engine, "posts")
    other = make_collection(db.engine, "pages")
    for number in range(5):
        insert_source(db.engine, f"content:posts:entry-{number:03d}", **of(collection))
    insert_source(
        db.engine, "content:posts:entry-001:draft", **of(collection), source_variant="draft_overlay"
    )
    insert_source(db.engine, "content:posts:zz-legacy", **of(collection), identity_version=None)
    insert_source(db.engine, "content:posts:zzz-other-collection", **of(other))
    return collection, claim


def test_source_pages_walk_canonical_sources_only(db):
    collection, claim = _sources_fixture(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim)

    upper = repository.find_source_upper_key(claim, epoch)
    assert upper == "content:posts:entry-004"
    assert repository.find_source_upper_key(claim, epoch + 1) is None
    assert repository.transition_to_sources(claim, epoch, FINGERPRINT, upper)
    claim = reload_claim(db.engine, claim)
    assert claim.phase is ReconciliationPhase.SOURCES
    # Published mid-walk below the upper key: still visited, nothing beyond it is.
    insert_source(db.engine, "content:posts:entry-003x", **of(collection))
    insert_source(db.engine, "content:posts:entry-005", **of(collection))

    keys: list[str] = []
    previous = None
    while page := repository.find_source_page(claim, 2):
        keys.extend(candidate.source_key for candidate in page)
        assert repository.checkpoint_sources(claim, epoch, previous, page[-1].source_key)
        previous = page[-1].source_key
        claim = reload_claim(db.engine, claim)
    assert keys == [
        "content:posts:entry-000",
        "content:posts:entry-001",
        "content:posts:entry-001:draft",
        "content:posts:entry-002",
        "content:posts:entry-003",
        "content:posts:entry-003x",
        "content:posts:entry-004",
    ]
    assert claim.source_cursor == upper


def test_source_page_returns_identity_and_variant_and_respects_guards(db):
    collection, claim = _sources_fixture(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim)
    assert repository.transition_to_sources(claim, epoch, FINGERPRINT, "content:posts:entry-001")
    claim = reload_claim(db.engine, claim)

    assert repository.find_source_page(claim, 50) == [
        SourceCandidate("content:posts:entry-000", "entry-000", "columns"),
        SourceCandidate("content:posts:entry-001", "entry-001", "columns"),
    ]
    assert repository.find_source_page(replace(claim, source_upper_key=None), 50) == []
    assert repository.find_source_page(replace(claim, lease_token="stale"), 50) == []
    assert not repository.checkpoint_sources(claim, epoch, "content:x", "content:posts:entry-000")
    assert not repository.checkpoint_scan(claim, epoch, None, "content:posts:entry-000")

    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=collection.id)
    assert repository.find_source_page(claim, 50) == []
    assert not repository.checkpoint_sources(claim, epoch, None, "content:posts:entry-000")


def test_find_missing_content_ids_returns_absent_ids_once_in_order(db):
    entries_collection(db)
    repository = ReconciliationRepository(db.engine)
    ids = ["entry-003", "gone-2", "entry-000", "gone-1", "gone-2"]
    assert repository.find_missing_content_ids("posts", ids) == ["gone-2", "gone-1"]
    assert repository.find_missing_content_ids("posts", []) == []
    assert repository.find_missing_content_ids("posts", ENTRY_IDS[:50]) == []


def test_enqueue_is_refused_once_the_scan_lost_its_lease(db):
    collection, claim = claimed_scan(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim, "entry-050")
    page = repository.find_scan_page(claim, 50)
    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=collection.id)
    enqueue(db, claim, epoch, page)
    assert count(db.engine, schema.work, collection_id=collection.id) == 0
    assert reconciliation_row(db.engine, collection.id)["scan_cursor"] is None


def test_a_page_checkpoint_renews_the_lease_in_its_own_statement_only_past_half(db):
    collection, claim = claimed_scan(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim, "entry-050")

    def row():
        return reconciliation_row(db.engine, collection.id)

    def expire_in(seconds: int) -> dict:
        backdate(db.engine, schema.reconciliations, "lease_expires_at", -seconds, **owned)
        return row()

    owned = {"collection_id": collection.id}
    fresh = row()["lease_expires_at"]
    # Most of the minute is left: the checkpoint moves the cursor, the expiry stays.
    assert repository.checkpoint_scan(claim, epoch, None, "entry-009") == fresh
    assert (row()["scan_cursor"], row()["lease_expires_at"]) == ("entry-009", fresh)

    # Less than half is left (moved by backdating, not sleeping): the same write renews it.
    short = expire_in(20)["lease_expires_at"]
    renewed = repository.checkpoint_scan(claim, epoch, "entry-009", "entry-019")
    assert renewed is not None and renewed > short
    assert (row()["scan_cursor"], row()["lease_expires_at"]) == ("entry-019", renewed)

    # A stale lease token, run token or epoch changes nothing, not even a lease past half.
    unchanged = expire_in(20)
    for stale, stale_epoch in (
        (replace(claim, lease_token="stale-owner"), epoch),
        (replace(claim, run_token="another-run"), epoch),
        (claim, epoch + 1),
    ):
        assert repository.checkpoint_scan(stale, stale_epoch, "entry-019", "entry-029") is None
        assert row() == unchanged
    # Nor does the owner's once its lease expired.
    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, **owned)
    expired = row()
    assert repository.checkpoint_scan(claim, epoch, "entry-019", "entry-029") is None
    assert row() == expired


def test_renew_lease_extends_only_past_half_the_lease(db):
    collection, claim = seed_and_claim(db.engine)
    repository = ReconciliationRepository(db.engine)
    fresh = reconciliation_row(db.engine, collection.id)["lease_expires_at"]
    assert repository.renew_lease(claim, 60) == fresh

    owned = {"collection_id": collection.id}
    backdate(db.engine, schema.reconciliations, "lease_expires_at", -20, **owned)
    short = reconciliation_row(db.engine, collection.id)["lease_expires_at"]
    renewed = repository.renew_lease(claim, 60)
    assert renewed is not None and renewed > short
    assert reconciliation_row(db.engine, collection.id)["lease_expires_at"] == renewed


# --- pages written in one go ---------------------------------------------------------------------


def test_a_scan_page_is_enqueued_and_checkpointed_in_one_go(db):
    collection = entries_collection(db)
    insert_work(db.engine, **of(collection), content_id="entry-001", state="failed", change_epoch=0)
    insert_work(
        db.engine, **of(collection), content_id="entry-002", state="failed", change_epoch=99
    )
    _collection, claim = seed_and_claim_existing(db, collection)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim, "entry-050")

    written = repository.write_scan_page(claim, claim, 50, 60)
    assert written is not None and written.cursor == "entry-049"
    # Inserted or reopened, as the seed's enqueue counts them: not entry-002.
    assert written.enqueued == 49
    row = reconciliation_row(db.engine, collection.id)
    assert (row["scan_cursor"], row["lease_expires_at"]) == ("entry-049", written.lease_expires_at)
    work = work_by_id(db, collection)
    assert sorted(work) == ENTRY_IDS[:50]
    # The seed's upsert: an older epoch reopened, a newer one left alone.
    assert (work["entry-001"]["change_epoch"], work["entry-001"]["state"]) == (epoch, "pending")
    assert (work["entry-002"]["change_epoch"], work["entry-002"]["state"]) == (99, "failed")

    claim = reload_claim(db.engine, claim)
    second = repository.write_scan_page(claim, claim, 50, 60)
    assert (second.cursor, second.enqueued) == ("entry-050", 1)
    claim = reload_claim(db.engine, claim)
    before = reconciliation_row(db.engine, collection.id)
    # The scan's end: an empty page writes nothing.
    assert repository.write_scan_page(claim, claim, 50, 60) is None
    assert reconciliation_row(db.engine, collection.id) == before
    assert count(db.engine, schema.work, collection_id=collection.id) == 51


@pytest.mark.parametrize(
    "refusal", ["stale_lease_token", "expired_lease", "other_epoch", "cursor_moved", "tombstone"]
)
def test_a_refused_scan_page_enqueues_nothing(db, refusal):
    collection, claim = claimed_scan(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim, "entry-050")
    page_of = claim
    if refusal == "stale_lease_token":
        claim = replace(claim, lease_token="stale-owner")
    elif refusal == "expired_lease":
        owned = {"collection_id": collection.id}
        backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, **owned)
    elif refusal == "other_epoch":
        page_of = replace(claim, target_epoch=epoch + 1)
    elif refusal == "cursor_moved":
        page_of = replace(claim, scan_cursor="entry-010")
    else:
        insert_deletion(db.engine, **of(collection))
    before = reconciliation_row(db.engine, collection.id)

    assert repository.write_scan_page(claim, page_of, 50, 60) is None
    assert count(db.engine, schema.work, collection_id=collection.id) == 0
    assert reconciliation_row(db.engine, collection.id) == before


def _walking_sources(db, sources: dict[str, dict]):
    """Entries with content rows, the given canonical sources, and the claim in its source
    walk (upper key: the last source)."""
    collection, claim = claimed_scan(db)
    for key, overrides in sources.items():
        insert_source(db.engine, key, **of(collection), **overrides)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim, "entry-050")
    assert repository.transition_to_sources(claim, epoch, FINGERPRINT, max(sources))
    return collection, reload_claim(db.engine, claim)


VARIANTS = ("columns", "draft_overlay")


def test_a_clean_source_page_is_checkpointed_in_one_statement(db):
    sources = {f"content:posts:entry-{n:03d}": {"content_id": f"entry-{n:03d}"} for n in range(4)}
    sources["content:posts:entry-001:draft"] = {
        "content_id": "entry-001",
        "source_variant": "draft_overlay",
    }
    collection, claim = _walking_sources(db, sources)
    repository = ReconciliationRepository(db.engine)

    written = repository.checkpoint_clean_source_page(claim, claim, 3, VARIANTS, 60)
    assert written is not None and written.cursor == "content:posts:entry-001:draft"
    claim = reload_claim(db.engine, claim)
    assert claim.source_cursor == written.cursor
    assert repository.checkpoint_clean_source_page(claim, claim, 3, VARIANTS, 60).cursor == (
        "content:posts:entry-003"
    )
    claim = reload_claim(db.engine, claim)
    assert repository.checkpoint_clean_source_page(claim, claim, 3, VARIANTS, 60) is None
    assert count(db.engine, schema.work, collection_id=collection.id) == 0


@pytest.mark.parametrize("unclean", ["content_gone", "no_content_id", "unknown_variant"])
def test_a_source_page_that_needs_more_than_a_checkpoint_is_left_to_the_full_walk(db, unclean):
    sources = {f"content:posts:entry-{n:03d}": {"content_id": f"entry-{n:03d}"} for n in range(3)}
    odd = "content:posts:entry-001x"
    sources[odd] = {
        "content_gone": {"content_id": "gone"},
        "no_content_id": {"content_id": ""},
        "unknown_variant": {"content_id": "entry-001", "source_variant": "preview"},
    }[unclean]
    collection, claim = _walking_sources(db, sources)
    repository = ReconciliationRepository(db.engine)
    before = reconciliation_row(db.engine, collection.id)

    assert repository.checkpoint_clean_source_page(claim, claim, 50, VARIANTS, 60) is None
    assert reconciliation_row(db.engine, collection.id) == before
    # A page that ends before the odd source is still clean.
    assert repository.checkpoint_clean_source_page(claim, claim, 2, VARIANTS, 60) is not None


@pytest.mark.parametrize("refusal", ["stale_lease_token", "expired_lease", "cursor_moved"])
def test_a_refused_clean_source_page_moves_nothing(db, refusal):
    sources = {f"content:posts:entry-{n:03d}": {"content_id": f"entry-{n:03d}"} for n in range(3)}
    collection, claim = _walking_sources(db, sources)
    repository = ReconciliationRepository(db.engine)
    page_of = claim
    if refusal == "stale_lease_token":
        claim = replace(claim, lease_token="stale-owner")
    elif refusal == "expired_lease":
        owned = {"collection_id": collection.id}
        backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, **owned)
    else:
        page_of = replace(claim, source_cursor="content:posts:entry-000")
    before = reconciliation_row(db.engine, collection.id)

    assert repository.checkpoint_clean_source_page(claim, page_of, 50, VARIANTS, 60) is None
    assert reconciliation_row(db.engine, collection.id) == before
