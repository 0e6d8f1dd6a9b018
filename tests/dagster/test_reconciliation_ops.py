"""Every reconciliation and maintenance op, called directly with `build_op_context` on both
dialects: an op that advanced hands the claim on; one that must wait, or lost its lease,
hands nothing on (the rest of the run is skipped); a spent budget hands the row back due at
once; an unexpected exception is recorded on the row as EmDash's tick records it and fails
the step without retries; a lease that lapsed between two ops is regained by the next one."""

from dataclasses import replace

import dagster as dg
import pytest
from sqlalchemy import exc as sa_exc

from media_usage_orchestration.ops import reconciliation as reconciliation_ops
from media_usage_orchestration.ops.maintenance import (
    settle_and_seed_reconciliations,
    sync_collection_partitions,
)
from media_usage_orchestration.ops.reconciliation import (
    FORCE_TAG,
    claim_reconciliation,
    drain_collection_work,
    finalize_coverage,
    prepare_run,
    scan_pages,
    scan_sources,
)
from media_usage_orchestration.processing.reconciliation import steps, walks
from media_usage_orchestration.processing.reconciliation.driver import run_to_completion
from media_usage_orchestration.processing.reconciliation.model import ReconciliationOutcome
from media_usage_orchestration.processing.reconciliation.steps import claim_collection
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from tests.support.factories import insert_source, of
from tests.support.ops import OpResult, invoke
from tests.support.projection import canonical_key
from tests.support.reconciliation_runs import FAILED_CODE, PARTITIONS
from tests.support.reconciliation_steps import (
    coordinator,
    coverage,
    entry_ids,
    expire_lease,
    make_due,
    mark_failed,
    untrusted_collection,
    work_rows,
)
from tests.support.states import count, db_now, set_status, snapshot

GRAPH = (
    claim_reconciliation,
    prepare_run,
    scan_pages,
    drain_collection_work,
    scan_sources,
    finalize_coverage,
)
LEASED_OPS = GRAPH[1:]
ADVANCES = {
    prepare_run.name: "prepared",
    scan_pages.name: "exhausted",
    drain_collection_work.name: "drained",
    scan_sources.name: "exhausted",
    finalize_coverage.name: "completed",
}
# The step function each op drives, to make it raise.
STEP_OF = {
    prepare_run.name: (steps, "prepare_run"),
    scan_pages.name: (steps, "scan_page"),
    drain_collection_work.name: (walks, "process_due_batch"),
    scan_sources.name: (steps, "source_page"),
    finalize_coverage.name: (steps, "finalize"),
}
ENTRIES = entry_ids(120)
# The run's checkpoint, which a recorded failure keeps.
CHECKPOINT_COLUMNS = (
    "run_token",
    "target_epoch",
    "field_fingerprint",
    "scan_cursor",
    "scan_upper_id",
    "source_cursor",
)


@pytest.fixture(scope="module")
def instance():
    with dg.DagsterInstance.ephemeral() as instance:
        yield instance


@pytest.fixture
def articles(db):
    """120 entries with an image each, written before capture; coverage untrusted."""
    return untrusted_collection(db.engine, "articles", ENTRIES)


def lease_for(db, instance, op_def, slug: str = "articles"):
    """Run the ops before `op_def`, each handing the claim on; returns the claim `op_def`
    receives."""
    result = invoke(claim_reconciliation, db, instance=instance, partition_key=slug)
    assert result.outcome == "claimed", result.metadata
    for earlier in GRAPH[1 : GRAPH.index(op_def)]:
        result = invoke(earlier, db, result.lease, instance=instance)
        assert result.lease is not None, (earlier.name, result.metadata)
    return result.lease


def assert_stopped(result: OpResult, outcome: str) -> None:
    assert result.lease is None, result
    assert result.outcome == outcome, result.metadata


def assert_handed_back_due_now(db, collection) -> dict:
    row = coordinator(db.engine, collection)
    assert (row["state"], row["lease_token"], row["lease_expires_at"]) == ("pending", None, None)
    assert row["next_attempt_at"] <= db_now(db.engine)
    return row


def assert_waiting(db, collection) -> dict:
    """Released with the seed's 30 s delay (the margin absorbs a slow machine)."""
    row = coordinator(db.engine, collection)
    assert (row["state"], row["lease_token"]) == ("pending", None)
    assert db_now(db.engine, 20) <= row["next_attempt_at"] <= db_now(db.engine, 30)
    return row


def checkpoint(row: dict) -> dict:
    return {key: row[key] for key in CHECKPOINT_COLUMNS}


def database_state(db, collection) -> tuple:
    return (
        coordinator(db.engine, collection),
        work_rows(db.engine, collection),
        coverage(db.engine, collection),
        count(db.engine, schema.sources),
    )


def broken(*_args, **_kwargs):
    raise RuntimeError("injected")


# --- claim_reconciliation ---------------------------------------------------------------------


def test_claim_seeds_and_claims_only_the_partitions_collection(db, instance, articles):
    pages = untrusted_collection(db.engine, "pages", entry_ids(3))

    result = invoke(claim_reconciliation, db, instance=instance, partition_key="pages")

    assert result.outcome == "claimed"
    assert (result.metadata["collection"], result.metadata["collection_id"]) == ("pages", pages.id)
    claim = result.lease
    row = coordinator(db.engine, pages)
    assert (claim.collection_id, claim.collection_slug, claim.run_token) == (
        pages.id,
        "pages",
        row["run_token"],
    )
    assert (row["state"], row["lease_token"], row["target_epoch"]) == (
        "leased",
        claim.lease_token,
        None,
    )
    assert row["lease_expires_at"] >= db_now(db.engine, 45)
    assert coordinator(db.engine, articles) is None


def test_claim_of_an_unknown_collection_hands_nothing_on(db, instance, articles):
    assert_stopped(
        invoke(claim_reconciliation, db, instance=instance, partition_key="missing"), "not_found"
    )
    assert count(db.engine, schema.reconciliations) == 0


def test_claim_refuses_a_malformed_slug_without_retries_or_writes(db, instance, articles):
    with pytest.raises(dg.Failure, match="collection slug") as failure:
        invoke(claim_reconciliation, db, instance=instance, partition_key="Not-A-Slug")
    assert failure.value.allow_retries is False
    assert count(db.engine, schema.reconciliations) == 0


def test_claim_yields_no_lease_while_another_run_holds_it(db, instance, articles):
    first = invoke(claim_reconciliation, db, instance=instance, partition_key="articles")
    before = coordinator(db.engine, articles)

    second = invoke(claim_reconciliation, db, instance=instance, partition_key="articles")

    assert_stopped(second, "claim_lost")
    assert first.lease.lease_expires_at in second.metadata["reason"]
    assert coordinator(db.engine, articles) == before


def test_claim_of_a_waiting_coordinator_is_not_due(db, instance, articles):
    claim = invoke(claim_reconciliation, db, instance=instance, partition_key="articles").lease
    assert steps.release(db.engine, claim, 30)

    assert_stopped(
        invoke(claim_reconciliation, db, instance=instance, partition_key="articles"), "not_due"
    )
    make_due(db.engine, articles)
    assert (
        invoke(claim_reconciliation, db, instance=instance, partition_key="articles").lease
        is not None
    )


def _claim_articles(db, instance, **options) -> OpResult:
    return invoke(claim_reconciliation, db, instance=instance, partition_key="articles", **options)


def test_complete_coverage_is_claimed_only_when_forced(db, instance, articles):
    assert run_to_completion(db.engine, articles.id) is ReconciliationOutcome.COMPLETED

    idle = _claim_articles(db, instance)
    assert_stopped(idle, "already_complete")
    assert idle.metadata["forced"] is False
    assert_stopped(_claim_articles(db, instance, run_tags={FORCE_TAG: "false"}), "already_complete")
    forced = _claim_articles(db, instance, op_config={"force": True})

    assert forced.outcome == "claimed"
    assert forced.metadata["forced"] is True
    assert coverage(db.engine, articles)["reconciliation_required"] == 1
    assert coordinator(db.engine, articles)["lease_token"] == forced.lease.lease_token


def test_the_force_tag_is_config_force(db, instance, articles):
    assert run_to_completion(db.engine, articles.id) is ReconciliationOutcome.COMPLETED

    tagged = _claim_articles(db, instance, run_tags={FORCE_TAG: "true"})

    assert (tagged.outcome, tagged.metadata["forced"]) == ("claimed", True)
    assert coverage(db.engine, articles)["reconciliation_required"] == 1
    assert coordinator(db.engine, articles)["lease_token"] == tagged.lease.lease_token


@pytest.mark.parametrize(
    ("tags", "config", "problem"),
    [
        ({FORCE_TAG: "yes"}, None, "is not 'true' or 'false'"),
        ({FORCE_TAG: "True"}, None, "is not 'true' or 'false'"),
        ({FORCE_TAG: ""}, None, "is not 'true' or 'false'"),
        ({FORCE_TAG: "false"}, {"force": True}, "contradicts config force: true"),
    ],
)
def test_a_bad_force_tag_fails_the_claim_and_changes_nothing(
    db, instance, articles, tags, config, problem
):
    assert run_to_completion(db.engine, articles.id) is ReconciliationOutcome.COMPLETED
    before = snapshot(db.engine)

    with pytest.raises(dg.Failure, match=problem) as failure:
        _claim_articles(db, instance, op_config=config, run_tags=tags)

    assert failure.value.allow_retries is False
    assert "nothing was changed" in failure.value.description
    assert snapshot(db.engine) == before


def test_claim_fails_fast_on_a_bug_and_retries_the_step_on_a_transient_error(
    db, instance, articles, monkeypatch
):
    monkeypatch.setattr(steps, "claim_collection", broken)
    with pytest.raises(dg.Failure, match="RuntimeError: injected") as failure:
        invoke(claim_reconciliation, db, instance=instance, partition_key="articles")
    assert failure.value.allow_retries is False

    def locked(*_args, **_kwargs):
        raise sa_exc.OperationalError("UPDATE", {}, Exception("database is locked"))

    monkeypatch.setattr(steps, "claim_collection", locked)
    with pytest.raises(dg.RetryRequested) as retried:
        invoke(claim_reconciliation, db, instance=instance, partition_key="articles")
    assert isinstance(retried.value.__cause__, sa_exc.OperationalError)
    assert count(db.engine, schema.reconciliations) == 0


# --- prepare_run ------------------------------------------------------------------------------


def test_prepare_run_takes_coverage_and_pins_the_run(db, instance, articles):
    lease = lease_for(db, instance, prepare_run)

    result = invoke(prepare_run, db, lease, instance=instance)

    assert (result.outcome, result.metadata["restarted"]) == ("prepared", False)
    status = coverage(db.engine, articles)
    assert (status["status"], status["cursor"]) == ("running", lease.run_token)
    row = coordinator(db.engine, articles)
    assert result.lease.target_epoch == row["target_epoch"] == status["change_epoch"]
    assert (row["scan_cursor"], row["scan_upper_id"], row["phase"]) == (None, "entry-119", "scan")
    assert (row["state"], row["lease_token"]) == ("leased", lease.lease_token)


def test_prepare_run_waits_while_a_manual_repair_owns_coverage(db, instance, articles):
    lease = lease_for(db, instance, prepare_run)
    set_status(db.engine, "articles", status="running", cursor="manual-repair")

    assert_stopped(invoke(prepare_run, db, lease, instance=instance), "deferred")

    row = assert_waiting(db, articles)
    assert row["target_epoch"] is None
    assert coverage(db.engine, articles)["cursor"] == "manual-repair"


# --- scan_pages -------------------------------------------------------------------------------


def test_scan_pages_enqueues_every_page_under_one_renewed_lease(db, instance, articles):
    lease = lease_for(db, instance, scan_pages)

    result = invoke(scan_pages, db, lease, instance=instance)

    assert (result.outcome, result.metadata["pages"], result.metadata["restarts"]) == (
        "exhausted",
        3,
        0,
    )
    row = coordinator(db.engine, articles)
    assert (row["scan_cursor"], row["state"]) == ("entry-119", "leased")
    assert (result.lease.lease_token, result.lease.lease_expires_at) == (
        row["lease_token"],
        row["lease_expires_at"],
    )
    assert result.lease.lease_expires_at >= lease.lease_expires_at
    work = work_rows(db.engine, articles)
    assert sorted(work) == ENTRIES
    assert {(w["change_epoch"], w["work_version"], w["state"]) for w in work.values()} == {
        (lease.target_epoch, 1, "pending")
    }


def test_a_spent_page_budget_hands_the_row_back_and_the_next_run_resumes(db, instance, articles):
    lease = lease_for(db, instance, scan_pages)

    spent = invoke(scan_pages, db, lease, instance=instance, op_config={"max_pages": 1})

    assert_stopped(spent, "budget_exhausted")
    assert spent.metadata["pages"] == 1
    assert assert_handed_back_due_now(db, articles)["scan_cursor"] == "entry-049"
    assert sorted(work_rows(db.engine, articles)) == ENTRIES[:50]

    resumed = invoke(scan_pages, db, lease_for(db, instance, scan_pages), instance=instance)

    assert (resumed.outcome, resumed.metadata["pages"]) == ("exhausted", 2)
    assert coordinator(db.engine, articles)["scan_cursor"] == "entry-119"
    work = work_rows(db.engine, articles)
    assert sorted(work) == ENTRIES
    # The first page was not enqueued again.
    assert {row["work_version"] for row in work.values()} == {1}
    assert {row["change_epoch"] for row in work.values()} == {lease.target_epoch}


# --- drain_collection_work --------------------------------------------------------------------


def test_drain_processes_only_this_collections_work(db, instance, articles):
    pages = untrusted_collection(db.engine, "pages", entry_ids(5))
    invoke(scan_pages, db, lease_for(db, instance, scan_pages, "pages"), instance=instance)
    lease = lease_for(db, instance, drain_collection_work)

    result = invoke(drain_collection_work, db, lease, instance=instance)

    assert (result.outcome, result.metadata["completed"]) == ("drained", 120)
    assert result.metadata["batches"] == 2  # of 100, then 20
    assert work_rows(db.engine, articles) == {}
    assert count(db.engine, schema.sources, collection_id=articles.id) == 120
    assert len(work_rows(db.engine, pages)) == 5
    assert count(db.engine, schema.sources, collection_id=pages.id) == 0
    assert coordinator(db.engine, articles)["lease_token"] == result.lease.lease_token


def test_a_spent_drain_budget_hands_the_row_back_with_its_work(db, instance, articles):
    lease = lease_for(db, instance, drain_collection_work)

    spent = invoke(
        drain_collection_work, db, lease, instance=instance, op_config={"max_seconds": 1e-9}
    )

    assert_stopped(spent, "budget_exhausted")
    assert spent.metadata["batches"] == 0
    assert assert_handed_back_due_now(db, articles)["scan_cursor"] == "entry-119"
    assert len(work_rows(db.engine, articles)) == 120


# --- scan_sources -----------------------------------------------------------------------------


def test_scan_sources_enqueues_work_only_for_content_that_is_gone(db, instance, articles):
    lease = lease_for(db, instance, scan_sources)
    gone = canonical_key(articles, "gone")
    insert_source(db.engine, gone, **of(articles), content_id="gone")

    result = invoke(scan_sources, db, lease, instance=instance)

    assert (result.outcome, result.metadata["pages"]) == ("exhausted", 3)
    row = coordinator(db.engine, articles)
    assert (row["phase"], row["source_upper_key"], row["source_cursor"]) == ("sources", gone, gone)
    work = work_rows(db.engine, articles)
    assert list(work) == ["gone"]
    assert work["gone"]["change_epoch"] == lease.target_epoch
    assert row["lease_token"] == result.lease.lease_token


def test_scan_sources_waits_while_the_scans_work_is_pending(db, instance, articles):
    lease = lease_for(db, instance, drain_collection_work)

    assert_stopped(invoke(scan_sources, db, lease, instance=instance), "deferred")

    row = assert_waiting(db, articles)
    assert (row["phase"], row["scan_cursor"]) == ("scan", "entry-119")


def test_a_spent_source_budget_hands_the_row_back_at_its_source_cursor(db, instance, articles):
    lease = lease_for(db, instance, scan_sources)

    spent = invoke(scan_sources, db, lease, instance=instance, op_config={"max_pages": 1})

    assert_stopped(spent, "budget_exhausted")
    row = assert_handed_back_due_now(db, articles)
    assert (row["phase"], row["source_cursor"]) == ("sources", canonical_key(articles, ENTRIES[49]))

    resumed = invoke(scan_sources, db, lease_for(db, instance, scan_sources), instance=instance)
    assert (resumed.outcome, resumed.metadata["pages"]) == ("exhausted", 2)


# --- finalize_coverage ------------------------------------------------------------------------


def test_finalize_makes_coverage_complete_and_ends_the_graph(db, instance, articles):
    lease = lease_for(db, instance, finalize_coverage)

    assert_stopped(invoke(finalize_coverage, db, lease, instance=instance), "completed")

    status = coverage(db.engine, articles)
    assert (status["status"], status["reconciliation_required"], status["cursor"]) == (
        "complete",
        0,
        None,
    )
    assert status["change_epoch"] == lease.target_epoch
    assert coordinator(db.engine, articles) is None
    assert count(db.engine, schema.sources, collection_id=articles.id) == 120


def test_finalize_waits_for_the_work_of_the_source_walk(db, instance, articles):
    lease = lease_for(db, instance, scan_sources)
    insert_source(db.engine, canonical_key(articles, "gone"), **of(articles), content_id="gone")
    lease = invoke(scan_sources, db, lease, instance=instance).lease

    assert_stopped(invoke(finalize_coverage, db, lease, instance=instance), "deferred")

    assert assert_waiting(db, articles)["phase"] == "sources"
    assert coverage(db.engine, articles)["status"] == "running"
    assert list(work_rows(db.engine, articles)) == ["gone"]


# --- every leased op --------------------------------------------------------------------------


@pytest.mark.parametrize("op_def", LEASED_OPS, ids=lambda op_def: op_def.name)
def test_a_lapsed_lease_is_regained_by_the_next_op(db, instance, articles, op_def):
    lease = lease_for(db, instance, op_def)
    expire_lease(db.engine, articles)

    result = invoke(op_def, db, lease, instance=instance)

    assert result.outcome == ADVANCES[op_def.name], result.metadata
    if op_def is finalize_coverage:
        assert coordinator(db.engine, articles) is None
        assert coverage(db.engine, articles)["status"] == "complete"
        return
    row = coordinator(db.engine, articles)
    assert result.lease.lease_token == row["lease_token"] != lease.lease_token
    assert (result.lease.run_token, row["state"]) == (lease.run_token, "leased")
    assert row["lease_expires_at"] >= db_now(db.engine, 45)


@pytest.mark.parametrize("op_def", LEASED_OPS, ids=lambda op_def: op_def.name)
def test_a_lease_taken_over_by_another_run_stops_the_op_without_writes(
    db, instance, articles, op_def
):
    lease = lease_for(db, instance, op_def)
    expire_lease(db.engine, articles)
    successor = claim_collection(db.engine, articles.id)
    assert successor.outcome is ReconciliationOutcome.ADVANCED
    before = database_state(db, articles)

    result = invoke(op_def, db, lease, instance=instance)

    assert_stopped(result, "lease_active")
    assert database_state(db, articles) == before
    assert coordinator(db.engine, articles)["lease_token"] == successor.claim.lease_token


@pytest.mark.parametrize("op_def", LEASED_OPS, ids=lambda op_def: op_def.name)
def test_an_unexpected_exception_is_recorded_like_emdash_and_fails_without_retries(
    db, instance, articles, op_def, monkeypatch
):
    lease = lease_for(db, instance, op_def)
    before = coordinator(db.engine, articles)
    monkeypatch.setattr(*STEP_OF[op_def.name], broken)

    with pytest.raises(dg.Failure, match="RuntimeError: injected") as failure:
        invoke(op_def, db, lease, instance=instance)

    assert failure.value.allow_retries is False
    assert failure.value.metadata["outcome"].value == "retry"
    row = coordinator(db.engine, articles)
    assert (row["state"], row["attempt_count"], row["last_error_code"]) == (
        "retry",
        before["attempt_count"] + 1,
        FAILED_CODE,
    )
    assert (row["lease_token"], row["lease_expires_at"]) == (None, None)
    # The first retry waits 30 s plus at most 25 % jitter (the margin absorbs a slow machine).
    assert db_now(db.engine, 20) <= row["next_attempt_at"] <= db_now(db.engine, 38)
    assert checkpoint(row) == checkpoint(before)
    if op_def is scan_sources:
        # It entered the source walk before the first source page raised.
        assert (row["phase"], row["source_cursor"]) == ("sources", None)
    status = coverage(db.engine, articles)
    if op_def is not prepare_run:
        assert (status["status"], status["cursor"]) == ("running", lease.run_token)


def test_the_fifth_failure_is_terminal_and_published(db, instance, articles, monkeypatch):
    monkeypatch.setattr(steps, "scan_page", broken)
    for attempt in range(1, 6):
        with pytest.raises(dg.Failure) as failure:
            invoke(scan_pages, db, lease_for(db, instance, scan_pages), instance=instance)
        expected = "failed" if attempt == 5 else "retry"
        assert failure.value.metadata["outcome"].value == expected
        row = coordinator(db.engine, articles)
        assert (row["state"], row["attempt_count"]) == (expected, attempt)
        make_due(db.engine, articles)

    status = coverage(db.engine, articles)
    assert (status["status"], status["cursor"], status["reconciliation_required"]) == (
        "failed",
        None,
        1,
    )
    assert status["last_error_code"] == FAILED_CODE
    refused = invoke(claim_reconciliation, db, instance=instance, partition_key="articles")
    assert_stopped(refused, "failed")
    assert FAILED_CODE in refused.metadata["reason"]


def test_progress_within_a_run_resets_the_attempt_count_before_a_later_failure(
    db, instance, articles, monkeypatch
):
    """Four failed attempts, then a run that scans every page before the drain raises: the
    checkpoints reset the row's attempt count, so this failure is a first retry, as EmDash's
    tick (which claims afresh for every step) records it, not the terminal fifth."""
    with monkeypatch.context() as patch:
        patch.setattr(steps, "scan_page", broken)
        for _ in range(4):
            with pytest.raises(dg.Failure):
                invoke(scan_pages, db, lease_for(db, instance, scan_pages), instance=instance)
            make_due(db.engine, articles)
    assert coordinator(db.engine, articles)["attempt_count"] == 4
    lease = lease_for(db, instance, drain_collection_work)
    assert coordinator(db.engine, articles)["attempt_count"] == 0
    monkeypatch.setattr(walks, "process_due_batch", broken)

    with pytest.raises(dg.Failure) as failure:
        invoke(drain_collection_work, db, lease, instance=instance)

    assert failure.value.metadata["outcome"].value == "retry"
    row = coordinator(db.engine, articles)
    assert (row["state"], row["attempt_count"], row["scan_cursor"]) == ("retry", 1, "entry-119")
    assert coverage(db.engine, articles)["status"] == "running"


def test_the_graph_shaped_driver_judges_a_failure_after_progress_the_same_way(
    db, articles, monkeypatch
):
    with monkeypatch.context() as patch:
        patch.setattr(steps, "scan_page", broken)
        for _ in range(4):
            assert run_to_completion(db.engine, articles.id) is ReconciliationOutcome.RETRY
            make_due(db.engine, articles)
    monkeypatch.setattr(walks, "process_due_batch", broken)

    assert run_to_completion(db.engine, articles.id) is ReconciliationOutcome.RETRY

    row = coordinator(db.engine, articles)
    assert (row["state"], row["attempt_count"], row["scan_cursor"]) == ("retry", 1, "entry-119")


# --- regaining a run on re-execution ---------------------------------------------------------


def test_a_re_execution_resumes_a_retrying_run_at_its_checkpoint(db, instance, articles):
    """What an op re-executed from failure does with the failed run's claim (the steps
    before it do not run again): a retrying row is claimed now, checkpoints and attempt
    count kept."""
    lease = lease_for(db, instance, scan_sources)
    assert steps.record_step_failure(db.engine, lease) is ReconciliationOutcome.RETRY
    before = coordinator(db.engine, articles)
    assert before["next_attempt_at"] > db_now(db.engine, 20)

    regained = reconciliation_ops.WORKFLOW.reclaim(db.engine, lease, reopen=True)

    row = coordinator(db.engine, articles)
    assert regained.lease_token == row["lease_token"] != lease.lease_token
    assert (row["state"], row["attempt_count"]) == ("leased", 1)
    assert checkpoint(row) == checkpoint(before)
    assert row["scan_cursor"] == "entry-119"
    # Without an operator (a lapsed lease regained mid-run), the recorded backoff stands.
    assert steps.release(db.engine, regained, 0)
    claim = claim_collection(db.engine, articles.id).claim
    assert steps.record_step_failure(db.engine, claim) is ReconciliationOutcome.RETRY
    assert reconciliation_ops.WORKFLOW.reclaim(db.engine, claim, reopen=False) is None
    assert coordinator(db.engine, articles)["state"] == "retry"


def test_a_re_execution_reopens_a_failed_run_as_a_fresh_scan(db, instance, articles):
    lease = lease_for(db, instance, scan_sources)
    terminal = steps.reload(db.engine, lease)
    assert steps.record_step_failure(db.engine, replace(terminal, attempt_count=4)) is (
        ReconciliationOutcome.FAILED
    )

    regained = reconciliation_ops.WORKFLOW.reclaim(db.engine, lease, reopen=True)

    row = coordinator(db.engine, articles)
    assert (row["state"], row["lease_token"]) == ("leased", regained.lease_token)
    assert (row["attempt_count"], row["target_epoch"], row["scan_cursor"]) == (0, None, None)
    assert row["run_token"] == lease.run_token


def test_a_re_execution_never_takes_a_live_lease(db, instance, articles):
    lease = lease_for(db, instance, scan_sources)
    expire_lease(db.engine, articles)
    successor = claim_collection(db.engine, articles.id).claim

    assert reconciliation_ops.WORKFLOW.reclaim(db.engine, lease, reopen=True) is None

    assert coordinator(db.engine, articles)["lease_token"] == successor.lease_token


# --- maintenance ------------------------------------------------------------------------------


def test_settle_and_seed_settles_every_coordinator_and_seeds_every_candidate(db, instance):
    names = ("obsolete", "published", "reset", "fresh_a", "fresh_b")
    collections = {name: untrusted_collection(db.engine, name, ["entry-1"]) for name in names}
    repository = ReconciliationRepository(db.engine)
    for name in ("obsolete", "published", "reset"):
        assert repository.seed_collection(collections[name].id)
    set_status(db.engine, "obsolete", status="complete", reconciliation_required=0)
    published = steps.prepare_run(
        db.engine, claim_collection(db.engine, collections["published"].id).claim
    )
    mark_failed(db.engine, collections["published"], published.claim.target_epoch)
    mark_failed(db.engine, collections["reset"], target_epoch=0)
    set_status(db.engine, "reset", change_epoch=2)

    result = invoke(settle_and_seed_reconciliations, db, instance=instance)

    assert result.metadata == {
        "inactive": False,
        "obsolete_deleted": 1,
        "failed_published": 1,
        "failed_reset": 1,
        "stuck_pinned": 0,
        "seeded": 2,
    }
    assert result.lease is None
    assert coordinator(db.engine, collections["obsolete"]) is None
    assert coverage(db.engine, collections["published"])["status"] == "failed"
    assert coordinator(db.engine, collections["reset"])["state"] == "pending"
    for name in ("fresh_a", "fresh_b"):
        assert coordinator(db.engine, collections[name])["state"] == "pending"
    again = invoke(settle_and_seed_reconciliations, db, instance=instance)
    assert again.metadata["seeded"] == again.metadata["obsolete_deleted"] == 0


def test_settle_and_seed_is_inert_while_capture_is_inactive(db, instance):
    untrusted_collection(db.engine, "articles", ["entry-1"], activate_capture=False)

    result = invoke(settle_and_seed_reconciliations, db, instance=instance)

    assert result.metadata["inactive"] is True
    assert result.metadata["seeded"] == 0
    assert count(db.engine, schema.reconciliations) == 0


def test_settle_and_seed_fails_fast_on_a_bug(db, instance, monkeypatch):
    untrusted_collection(db.engine, "articles", ["entry-1"])
    monkeypatch.setattr("media_usage_orchestration.ops.maintenance.settle_reconciliations", broken)

    with pytest.raises(dg.Failure, match="RuntimeError: injected") as failure:
        invoke(settle_and_seed_reconciliations, db, instance=instance)

    assert failure.value.allow_retries is False
    assert count(db.engine, schema.reconciliations) == 0


def test_sync_partitions_makes_the_partitions_equal_the_registry(db):
    untrusted_collection(db.engine, "articles", ["entry-1"])
    untrusted_collection(db.engine, "pages", ["entry-1"])
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(PARTITIONS, ["pages", "deleted_one"])

        result = invoke(sync_collection_partitions, db, instance=instance)

        assert (result.metadata["added"], result.metadata["removed"]) == (
            "articles",
            "deleted_one",
        )
        assert result.metadata["collections"] == 2
        assert sorted(instance.get_dynamic_partitions(PARTITIONS)) == ["articles", "pages"]
        again = invoke(sync_collection_partitions, db, instance=instance)
        assert (again.metadata["added"], again.metadata["removed"]) == ("-", "-")
