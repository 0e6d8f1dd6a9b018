"""The background collection-deletion processor (upstream
`media-usage-collection-deletion-processor.test.ts`) and the per-phase steps an op graph calls:
one claimed tombstone per tick, one phase or one bounded batch, the tombstone deleted last,
bounded retries, and steps that keep their lease so a caller can loop and renew."""

from __future__ import annotations

from datetime import datetime

import pytest

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.processing.deletion import processor as deletion
from media_usage_orchestration.processing.deletion.processor import (
    DeletionTickOutcome,
    DeletionTickResult,
    PhaseStepOutcome,
    PhaseStepResult,
    claim_due_deletion,
    delete_sources_step,
    delete_status_step,
    delete_work_step,
    fence_step,
    finalize_step,
    process_due_deletions,
    record_phase_failure,
    registry_step,
    release_deletion_lease,
    renew_deletion_lease,
    run_front_phase,
    run_phase_step,
    table_step,
)
from media_usage_orchestration.processing.loop.retry_policy import DELETION_RETRY
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.deletion.records import DeletionLease, DeletionPhase
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from media_usage_orchestration.values.errors import DeletionCleanupIncomplete, DeletionLeaseLost
from tests.support import factories
from tests.support.deletions import expire_lease, ids, set_tombstone, table_exists
from tests.support.factories import PAST
from tests.support.states import IMAGE_ONLY, count, db_now, one, recorded_statements, set_activation
from tests.support.triggers import IGNORE, create_trigger

FAILED_CODE = "MEDIA_USAGE_COLLECTION_DELETION_FAILED"
PROGRESS = DeletionTickOutcome.PROGRESS


# --- helpers ----------------------------------------------------------------------------------


def run_tick(db) -> DeletionTickResult:
    return process_due_deletions(db.engine)


def insert_deletion(db, collection_id, slug, phase, **values):
    factories.insert_deletion(
        db.engine,
        collection_id=collection_id,
        collection_slug=slug,
        force_delete=1,
        phase=phase,
        **values,
    )


def insert_status(db, collection_id, slug, capture_state="deleting"):
    factories.insert_status(
        db.engine, scope_key=slug, collection_id=collection_id, capture_state=capture_state
    )


def insert_source(db, source_key, collection_id, slug, occurrence_count=0):
    """A source as EmDash's test writes it: identity_version left NULL."""
    generation = "generation-old"
    factories.insert_source(
        db.engine,
        source_key,
        collection_id=collection_id,
        collection_slug=slug,
        content_id="entry",
        current_generation=generation,
        identity_version=None,
    )
    factories.insert_occurrences(
        db.engine,
        [
            {
                "source_key": source_key,
                "index": index,
                "generation": generation,
                "field_path": f"hero[{index}]",
                "reference_type": "local",
            }
            for index in range(occurrence_count)
        ],
    )


def insert_work(db, collection_id, slug, content_ids):
    factories.insert_works(
        db.engine,
        [{"content_id": content_id} for content_id in content_ids],
        collection_id=collection_id,
        collection_slug=slug,
    )


def lose_updates(db, name, when):
    """Tombstone state changes matching `when` silently do not happen (a lost update)."""
    create_trigger(
        db.engine,
        name,
        table=schema.collection_deletions.name,
        event="BEFORE UPDATE OF state",
        when=when,
        action=IGNORE,
    )


def deletion_state(db, collection_id):
    return one(db.engine, schema.collection_deletions, collection_id=collection_id)


def work_count(db, collection_id):
    return count(db.engine, schema.work, collection_id=collection_id)


def usage_count(db, source_key):
    return count(db.engine, schema.occurrences, source_key=source_key)


def source_exists(db, source_key):
    return count(db.engine, schema.sources, source_key=source_key) == 1


def seconds_between(earlier: str, later: str) -> float:
    def parse(value):
        return datetime.fromisoformat(value.replace("Z", "+00:00"))

    return (parse(later) - parse(earlier)).total_seconds()


def captured_collection(db, slug, *, activated=False):
    """A real captured collection: activation `active`, exact capture triggers installed."""
    if not activated:
        activate(db.engine)
    return CmsWriter(db.engine).create_collection(slug, IMAGE_ONLY)


# --- bounded exact-ID cleanup -----------------------------------------------------------------


@pytest.mark.parametrize("source_vanishes", [False, True], ids=["kept", "vanished"])
def test_bounded_exact_id_cleanup_resumes_and_removes_the_tombstone_last(db, source_vanishes):
    insert_deletion(db, "old-id", "articles", "work")
    insert_status(db, "old-id", "articles")
    insert_work(db, "old-id", "articles", ids("entry", 55))
    insert_source(db, "old-source", "old-id", "articles", occurrence_count=55)
    insert_source(db, "legacy-source", None, "articles")
    insert_source(db, "replacement-source", "replacement-id", "articles")
    factories.insert_reconciliation(
        db.engine, collection_id="old-id", collection_slug="articles", run_token="run"
    )

    first = run_tick(db)
    assert (first.claimed_count, first.outcome) == (1, PROGRESS)
    assert work_count(db, "old-id") == 5
    state = deletion_state(db, "old-id")
    assert (state["phase"], state["work_cursor"], state["state"]) == (
        "work",
        "entry-049",
        "pending",
    )
    assert state["lease_token"] is None

    assert run_tick(db).outcome is PROGRESS
    assert work_count(db, "old-id") == 0
    assert deletion_state(db, "old-id")["phase"] == "sources"

    assert run_tick(db).outcome is PROGRESS
    assert usage_count(db, "old-source") == 5
    state = deletion_state(db, "old-id")
    assert (state["phase"], state["source_key"], state["occurrence_cursor"]) == (
        "sources",
        "old-source",
        "usage-049",
    )
    if source_vanishes:
        with db.engine.begin() as connection:
            connection.execute(
                schema.sources.delete().where(schema.sources.c.source_key == "old-source")
            )

    assert run_tick(db).outcome is PROGRESS
    assert usage_count(db, "old-source") == 0
    assert not source_exists(db, "old-source")
    state = deletion_state(db, "old-id")
    assert (state["phase"], state["source_key"], state["occurrence_cursor"]) == (
        "sources",
        None,
        None,
    )

    assert run_tick(db).outcome is PROGRESS
    assert deletion_state(db, "old-id")["phase"] == "status"

    assert run_tick(db).outcome is PROGRESS
    assert deletion_state(db, "old-id")["phase"] == "finalize"
    assert count(db.engine, schema.index_status, collection_id="old-id") == 0
    assert count(db.engine, schema.reconciliations, collection_id="old-id") == 0

    last = run_tick(db)
    assert (last.claimed_count, last.outcome) == (1, DeletionTickOutcome.FINALIZED)
    assert deletion_state(db, "old-id") is None
    assert source_exists(db, "legacy-source")
    assert source_exists(db, "replacement-source")
    assert run_tick(db) == DeletionTickResult(0, 0, DeletionTickOutcome.IDLE)


def test_the_tick_has_no_activation_check(db):
    insert_deletion(db, "old-id", "articles", "work")
    set_activation(db.engine, "expanded")

    assert run_tick(db).outcome is PROGRESS
    assert deletion_state(db, "old-id")["phase"] == "sources"


# --- front-phase recovery ---------------------------------------------------------------------


def test_recovers_exactly_one_interrupted_front_phase_per_tick(db):
    collection = captured_collection(db, "front")
    DeletionRepository(db.engine).create_tombstone(collection.id, collection.slug, True)

    assert run_tick(db).outcome is PROGRESS
    state = deletion_state(db, collection.id)
    assert (state["state"], state["phase"]) == ("pending", "registry")
    assert count(db.engine, schema.collections, slug="front") == 1
    assert one(db.engine, schema.index_status, collection_id=collection.id)["capture_state"] == (
        "deleting"
    )

    assert run_tick(db).outcome is PROGRESS
    state = deletion_state(db, collection.id)
    assert (state["state"], state["phase"]) == ("pending", "table")
    assert count(db.engine, schema.collections, slug="front") == 0
    assert count(db.engine, schema.fields, collection_id=collection.id) == 0
    assert table_exists(db.engine, "ec_front")

    assert run_tick(db).outcome is PROGRESS
    state = deletion_state(db, collection.id)
    assert (state["state"], state["phase"]) == ("pending", "work")
    assert not table_exists(db.engine, "ec_front")


def test_a_fence_that_finds_live_content_cancels_the_tombstone(db):
    collection = captured_collection(db, "occupied")
    CmsWriter(db.engine).insert_entry("occupied", {"title": "kept"})
    DeletionRepository(db.engine).create_tombstone(collection.id, collection.slug, False)

    result = run_tick(db)

    assert (result.claimed_count, result.outcome) == (1, PROGRESS)
    assert deletion_state(db, collection.id) is None
    assert one(db.engine, schema.index_status, collection_id=collection.id)["capture_state"] == (
        "active"
    )
    assert count(db.engine, schema.collections, slug="occupied") == 1


# --- failures ---------------------------------------------------------------------------------


def test_five_consecutive_phase_failures_become_visible(db):
    insert_deletion(db, "failed-id", "failed", "status")
    insert_work(db, "failed-id", "failed", ["still-present"])

    for attempt in range(1, 6):
        result = run_tick(db)
        assert result.outcome is (
            DeletionTickOutcome.FAILED if attempt == 5 else DeletionTickOutcome.RETRY
        )
        state = deletion_state(db, "failed-id")
        assert state["attempt_count"] == attempt
        assert state["lease_token"] is None and state["lease_expires_at"] is None
        if attempt < 5:
            assert state["state"] == "retry"
            delay = seconds_between(state["updated_at"], state["next_attempt_at"])
            assert delay == pytest.approx(DELETION_RETRY.delay_seconds(attempt - 1), abs=1)
            assert run_tick(db) == DeletionTickResult(0, 0, DeletionTickOutcome.IDLE)
            set_tombstone(db.engine, "failed-id", next_attempt_at=PAST)

    state = deletion_state(db, "failed-id")
    assert (state["state"], state["phase"], state["attempt_count"], state["last_error_code"]) == (
        "failed",
        "status",
        5,
        FAILED_CODE,
    )
    assert run_tick(db).outcome is DeletionTickOutcome.IDLE


def test_retry_delay_doubles_from_thirty_seconds_up_to_fifteen_minutes():
    assert [DELETION_RETRY.delay_seconds(n) for n in range(7)] == [30, 60, 120, 240, 480, 900, 900]
    assert DELETION_RETRY.delay_seconds(10_000) == 900
    with pytest.raises(ValueError):
        DELETION_RETRY.delay_seconds(-1)


def test_progress_resets_the_failure_count(db):
    insert_deletion(db, "reset-id", "reset", "work", state="retry", attempt_count=3)
    insert_work(db, "reset-id", "reset", ["entry-000"])

    assert run_tick(db).outcome is PROGRESS

    state = deletion_state(db, "reset-id")
    assert (state["phase"], state["attempt_count"], state["last_error_code"]) == (
        "sources",
        0,
        None,
    )


# --- candidate bounds -------------------------------------------------------------------------


def test_inspects_at_most_four_candidates_and_claims_at_most_one(db):
    for index in range(5):
        insert_deletion(db, f"collection-{index}", f"collection_{index}", "work")

    result = run_tick(db)

    assert (result.candidate_count, result.claimed_count) == (4, 1)
    assert count(db.engine, schema.collection_deletions, phase="sources") == 1


def test_tries_the_next_due_candidate_after_a_claim_race(db):
    insert_deletion(db, "first-id", "first", "work")
    insert_deletion(db, "second-id", "second", "work")
    lose_updates(
        db,
        "lose_first_collection_deletion_claim",
        "OLD.collection_id = 'first-id' AND NEW.state = 'leased'",
    )

    result = run_tick(db)

    assert result == DeletionTickResult(2, 1, PROGRESS)
    assert deletion_state(db, "first-id")["phase"] == "work"
    assert deletion_state(db, "second-id")["phase"] == "sources"


def test_every_lost_claim_is_claim_lost(db):
    insert_deletion(db, "first-id", "first", "work")
    lose_updates(db, "lose_every_claim", "NEW.state = 'leased'")

    assert run_tick(db) == DeletionTickResult(1, 0, DeletionTickOutcome.CLAIM_LOST)


def test_a_lost_handoff_is_claim_lost_and_uses_database_time(db):
    insert_deletion(db, "clock-id", "clock", "work")
    lose_updates(
        db,
        "interrupt_collection_deletion_release",
        "OLD.collection_id = 'clock-id' AND NEW.state = 'pending'",
    )
    database_now = db_now(db.engine)

    assert run_tick(db) == DeletionTickResult(1, 1, DeletionTickOutcome.CLAIM_LOST)
    state = deletion_state(db, "clock-id")
    assert (state["state"], state["phase"]) == ("leased", "sources")
    assert abs(seconds_between(database_now, state["updated_at"])) < 60


# --- statement budgets and indexes ------------------------------------------------------------


def test_find_due_is_one_statement(db):
    for state, due_column in (
        ("pending", "next_attempt_at"),
        ("retry", "next_attempt_at"),
        ("leased", "lease_expires_at"),
    ):
        for index in range(4):
            insert_deletion(
                db,
                f"{state}-{index}",
                f"{state}_{index}",
                "work",
                state=state,
                lease_token=f"lease-{index}" if state == "leased" else None,
                lease_expires_at=PAST if due_column == "lease_expires_at" else None,
            )

    with recorded_statements(db.engine) as sent:
        due = DeletionRepository(db.engine).find_due(deletion.CANDIDATES_PER_TICK)

    assert len(due) == 4
    reads = [
        statement
        for statement in sent
        if statement.lstrip().upper().startswith(("SELECT", "WITH"))
        and "_emdash_media_usage_collection_deletions" in statement
    ]
    assert len(reads) == 1


def test_the_completion_probe_is_one_query(db):
    insert_deletion(db, "status-id", "status_slug", "status")
    insert_status(db, "status-id", "status_slug")

    with recorded_statements(db.engine) as sent:
        result = run_tick(db)

    assert result.outcome is PROGRESS
    probes = [
        statement
        for statement in sent
        if statement.lstrip().upper().startswith("SELECT")
        and any(
            name in statement
            for name in (
                "_emdash_media_usage_work",
                "_emdash_media_usage_sources",
                "_emdash_media_usage_index_status",
            )
        )
    ]
    assert len(probes) == 1
    queries = [s for s in sent if s.strip().upper() not in ("BEGIN", "BEGIN IMMEDIATE", "COMMIT")]
    assert len(queries) <= deletion.MAX_QUERIES_PER_TICK


@pytest.mark.sqlite_only("EXPLAIN QUERY PLAN is SQLite's")
def test_uses_every_declared_deletion_selector_index(db):
    plans = {
        "idx__emdash_media_usage_collection_deletions_due": (
            "SELECT collection_id FROM _emdash_media_usage_collection_deletions "
            "WHERE state = 'pending' AND next_attempt_at <= '2026-01-01T00:00:00.000Z' "
            "ORDER BY next_attempt_at, updated_at, collection_id LIMIT 4"
        ),
        "idx__emdash_media_usage_collection_deletions_lease": (
            "SELECT collection_id FROM _emdash_media_usage_collection_deletions "
            "WHERE state = 'leased' AND lease_expires_at <= '2026-01-01T00:00:00.000Z' "
            "ORDER BY lease_expires_at, updated_at, collection_id LIMIT 4"
        ),
        "idx__emdash_media_usage_collection_deletions_operator": (
            "SELECT collection_id FROM _emdash_media_usage_collection_deletions "
            "WHERE state = 'failed' ORDER BY updated_at DESC, collection_id DESC LIMIT 50"
        ),
        "idx__emdash_media_usage_sources_collection_cursor": (
            "SELECT source_key FROM _emdash_media_usage_sources "
            "WHERE source_type = 'content' AND collection_id = 'old-id' "
            "ORDER BY source_key LIMIT 1"
        ),
        "idx__emdash_media_usage_source_cursor": (
            "SELECT id FROM _emdash_media_usage WHERE source_key = 'source' AND id > 'cursor' "
            "ORDER BY id LIMIT 51"
        ),
    }
    with db.engine.connect() as connection:
        for index_name, query in plans.items():
            plan = " ".join(
                str(row[-1]) for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {query}")
            )
            assert index_name in plan, (index_name, plan)


# --- per-phase steps (the op layer's API) -----------------------------------------------------


def test_steps_walk_every_phase_under_one_renewed_lease(db):
    collection = captured_collection(db, "walked")
    CmsWriter(db.engine).insert_entries("walked", [{"title": f"t{i}"} for i in range(3)])
    DeletionRepository(db.engine).create_tombstone(collection.id, collection.slug, True)
    claim = claim_due_deletion(db.engine, collection.id)
    assert claim is not None and claim.phase is DeletionPhase.FENCE
    lease = DeletionLease(claim.collection_id, claim.lease_token)

    results: list[PhaseStepResult] = []
    while True:
        result = run_phase_step(db.engine, lease)
        results.append(result)
        if result.outcome is PhaseStepOutcome.FINALIZED:
            break
        assert renew_deletion_lease(db.engine, lease) is not None

    assert [(r.outcome.value, r.phase and r.phase.value) for r in results] == [
        ("advanced", "registry"),
        ("advanced", "table"),
        ("advanced", "work"),
        ("advanced", "sources"),
        ("advanced", "status"),
        ("advanced", "finalize"),
        ("finalized", None),
    ]
    assert results[3].deleted == 3
    assert deletion_state(db, collection.id) is None
    assert count(db.engine, schema.index_status, collection_id=collection.id) == 0
    assert not table_exists(db.engine, "ec_walked")


def test_batch_steps_repeat_while_rows_remain_and_keep_the_lease(db):
    insert_deletion(db, "batch-id", "batch", "work")
    insert_work(db, "batch-id", "batch", ids("entry", 120))
    insert_source(db, "batch-source", "batch-id", "batch", occurrence_count=60)
    claim = claim_due_deletion(db.engine, "batch-id")

    work = [delete_work_step(db.engine, claim) for _ in range(3)]
    assert [(r.outcome, r.deleted) for r in work] == [
        (PhaseStepOutcome.REPEAT, 50),
        (PhaseStepOutcome.REPEAT, 50),
        (PhaseStepOutcome.ADVANCED, 20),
    ]
    assert deletion_state(db, "batch-id")["state"] == "leased"

    sources = [delete_sources_step(db.engine, claim) for _ in range(3)]
    assert [(r.outcome, r.phase, r.deleted) for r in sources] == [
        (PhaseStepOutcome.REPEAT, DeletionPhase.SOURCES, 50),
        (PhaseStepOutcome.REPEAT, DeletionPhase.SOURCES, 10),
        (PhaseStepOutcome.ADVANCED, DeletionPhase.STATUS, 0),
    ]
    assert not source_exists(db, "batch-source")
    assert delete_status_step(db.engine, claim) == PhaseStepResult(
        PhaseStepOutcome.ADVANCED, DeletionPhase.FINALIZE
    )
    assert finalize_step(db.engine, claim) == PhaseStepResult(PhaseStepOutcome.FINALIZED, None)
    assert deletion_state(db, "batch-id") is None


def test_a_step_for_another_phase_is_skipped_and_changes_nothing(db):
    insert_deletion(db, "skip-id", "skip", "sources")
    claim = claim_due_deletion(db.engine, "skip-id")
    before = deletion_state(db, "skip-id")

    for step in (fence_step, registry_step, table_step, delete_work_step, delete_status_step):
        assert step(db.engine, claim) == PhaseStepResult(
            PhaseStepOutcome.SKIPPED, DeletionPhase.SOURCES
        )
    assert run_front_phase(db.engine, claim).outcome is PhaseStepOutcome.SKIPPED
    assert finalize_step(db.engine, claim).outcome is PhaseStepOutcome.SKIPPED
    assert deletion_state(db, "skip-id") == before


def test_front_steps_keep_the_lease_and_report_has_content(db):
    collection = captured_collection(db, "kept")
    CmsWriter(db.engine).insert_entry("kept", {"title": "live"})
    DeletionRepository(db.engine).create_tombstone(collection.id, collection.slug, False)
    claim = claim_due_deletion(db.engine, collection.id)

    assert fence_step(db.engine, claim) == PhaseStepResult(PhaseStepOutcome.HAS_CONTENT, None)
    assert deletion_state(db, collection.id) is None
    assert count(db.engine, schema.collections, id=collection.id) == 1


def test_a_front_step_advances_one_phase_and_stays_leased(db):
    collection = captured_collection(db, "stepped")
    DeletionRepository(db.engine).create_tombstone(collection.id, collection.slug, True)
    claim = claim_due_deletion(db.engine, collection.id)

    assert run_front_phase(db.engine, claim) == PhaseStepResult(
        PhaseStepOutcome.ADVANCED, DeletionPhase.REGISTRY
    )
    state = deletion_state(db, collection.id)
    assert (state["state"], state["phase"], state["lease_token"]) == (
        "leased",
        "registry",
        claim.lease_token,
    )
    assert release_deletion_lease(db.engine, claim)
    assert deletion_state(db, collection.id)["state"] == "pending"


def test_steps_with_a_lost_lease_raise_and_change_nothing(db):
    insert_deletion(db, "lost-id", "lost", "work")
    insert_work(db, "lost-id", "lost", ["entry-000"])
    claim = claim_due_deletion(db.engine, "lost-id")
    expire_lease(db.engine, "lost-id")
    taken_over = claim_due_deletion(db.engine, "lost-id")
    assert taken_over is not None

    with pytest.raises(DeletionLeaseLost):
        delete_work_step(db.engine, claim)
    with pytest.raises(DeletionLeaseLost):
        run_phase_step(db.engine, DeletionLease("lost-id", "not-the-token"))
    assert work_count(db, "lost-id") == 1
    assert renew_deletion_lease(db.engine, claim) is None
    assert not release_deletion_lease(db.engine, claim)
    assert record_phase_failure(db.engine, claim) is DeletionTickOutcome.CLAIM_LOST
    assert deletion_state(db, "lost-id")["lease_token"] == taken_over.lease_token


def test_an_expired_lease_is_not_a_live_one_even_with_the_right_token(db):
    insert_deletion(db, "late-id", "late", "work")
    insert_work(db, "late-id", "late", ["entry-000"])
    claim = claim_due_deletion(db.engine, "late-id")
    expire_lease(db.engine, "late-id")

    with pytest.raises(DeletionLeaseLost):
        delete_work_step(db.engine, claim)
    assert work_count(db, "late-id") == 1
    assert record_phase_failure(db.engine, claim) is DeletionTickOutcome.CLAIM_LOST


def test_record_phase_failure_retries_then_fails_and_an_operator_retry_reopens(db):
    insert_deletion(db, "op-id", "op", "status", attempt_count=3)
    insert_work(db, "op-id", "op", ["still-present"])

    claim = claim_due_deletion(db.engine, "op-id")
    with pytest.raises(DeletionCleanupIncomplete) as error:
        delete_status_step(db.engine, claim)
    assert record_phase_failure(db.engine, claim, error.value) is DeletionTickOutcome.RETRY
    assert claim_due_deletion(db.engine, "op-id") is None  # not due for 240 s

    set_tombstone(db.engine, "op-id", next_attempt_at=PAST)
    claim = claim_due_deletion(db.engine, "op-id")
    assert record_phase_failure(db.engine, claim) is DeletionTickOutcome.FAILED
    state = deletion_state(db, "op-id")
    assert (state["state"], state["attempt_count"], state["last_error_code"]) == (
        "failed",
        5,
        FAILED_CODE,
    )
    assert claim_due_deletion(db.engine, "op-id") is None

    assert DeletionRepository(db.engine).retry_operator_deletion("op-id").changed
    reclaimed = claim_due_deletion(db.engine, "op-id")
    assert reclaimed is not None and reclaimed.phase is DeletionPhase.STATUS
    assert reclaimed.attempt_count == 0
    with db.engine.begin() as connection:
        connection.execute(schema.work.delete().where(schema.work.c.collection_id == "op-id"))
    assert delete_status_step(db.engine, reclaimed).phase is DeletionPhase.FINALIZE


def test_claim_due_deletion_needs_a_due_tombstone(db):
    assert claim_due_deletion(db.engine, "missing") is None
    insert_deletion(db, "held-id", "held", "work")
    first = claim_due_deletion(db.engine, "held-id")
    assert first is not None and first.phase is DeletionPhase.WORK
    assert claim_due_deletion(db.engine, "held-id") is None
    expire_lease(db.engine, "held-id")
    assert claim_due_deletion(db.engine, "held-id") is not None


def test_steps_refuse_something_that_is_not_a_lease(db):
    with pytest.raises(TypeError):
        run_phase_step(db.engine, ("collection", "token"))  # type: ignore[arg-type]


def test_work_rows_of_other_collections_are_kept(db):
    insert_deletion(db, "gone-id", "gone", "work")
    insert_work(db, "gone-id", "gone", ids("entry", 3))
    insert_work(db, "other-id", "gone", ids("entry", 3))

    assert run_tick(db).outcome is PROGRESS
    assert work_count(db, "gone-id") == 0
    assert work_count(db, "other-id") == 3
