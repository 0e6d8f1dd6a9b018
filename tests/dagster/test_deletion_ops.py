"""The collection-deletion ops, called directly with `build_op_context` on both dialects.

Every op of the background graph (claim_deletion, fence, remove_registry, drop_table,
delete_work, delete_sources, delete_status, finalize_deletion) and the operator's
request_deletion: what each does to the database, which outputs it yields (a `lease` output
only when it hands the claim on), how batch ops spend their budget while renewing the lease,
how a failure is charged to the tombstone as EmDash's tick charges it, and how an operator's
re-execution reopens a failed or backing-off tombstone."""

import contextlib
from collections.abc import Iterator

import dagster as dg
import pytest
from sqlalchemy import exc as sa_exc

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.ops.deletion import (
    claim_deletion,
    delete_sources,
    delete_status,
    delete_work,
    drop_table,
    fence,
    finalize_deletion,
    remove_registry,
    request_deletion,
)
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.processing.deletion import processor as processing
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.capture_triggers import (
    CaptureIdentity,
    remove_capture_triggers,
)
from media_usage_orchestration.store.deletion.records import DeletionLease, DeletionPhase
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from tests.support.deletion_runs import (
    FAILED_CODE,
    leftovers,
    seconds_between,
)
from tests.support.deletions import (
    LEASE_SECONDS,
    add_reconciliation,
    add_source,
    add_work,
    claimed,
    expire_lease,
    ids,
    set_tombstone,
    table_exists,
    tombstone,
    tombstone_row,
)
from tests.support.ops import OpResult, invoke
from tests.support.states import IMAGE_ONLY, all_rows, count, db_now, one, set_status, snapshot

FAR_FUTURE = "2999-01-01T00:00:00.000Z"
PHASE_OPS = {
    DeletionPhase.FENCE: fence,
    DeletionPhase.REGISTRY: remove_registry,
    DeletionPhase.TABLE: drop_table,
    DeletionPhase.WORK: delete_work,
    DeletionPhase.SOURCES: delete_sources,
    DeletionPhase.STATUS: delete_status,
    DeletionPhase.FINALIZE: finalize_deletion,
}
PHASES = tuple(DeletionPhase)
NOT_TOMBSTONES = tuple(t for t in schema.EMDASH_TABLES if t is not schema.collection_deletions)
INDEX = (schema.sources, schema.occurrences)


# --- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture
def cms(activated):
    return CmsWriter(activated.engine)


@pytest.fixture
def posts(cms):
    """A collection created after activation: captured, with its exact triggers."""
    return cms.create_collection("posts", IMAGE_ONLY)


@pytest.fixture
def pages(cms):
    """Another captured collection that every deletion must leave alone."""
    collection = cms.create_collection("pages", IMAGE_ONLY)
    cms.insert_entry("pages", {"id": "page-1", "title": "kept", "hero": None})
    add_source(
        cms.engine,
        "pages-source",
        collection_id=collection.id,
        collection_slug="pages",
        occurrence_ids=ids("pages-usage", 3),
    )
    return collection


def lease_of(db, collection, phase, *, force=True) -> DeletionLease:
    return claimed(db.engine, collection, phase, force=force).lease


def populate(db, collection, *, work=0, occurrences=(), reconciliation=False):
    """Rows of the collection's index: work rows, canonical sources with occurrences."""
    add_work(db.engine, collection, ids("entry", work))
    for index, total in enumerate(occurrences):
        add_source(
            db.engine,
            f"{collection.slug}-source-{index}",
            collection_id=collection.id,
            collection_slug=collection.slug,
            occurrence_ids=ids(f"{collection.slug}-usage-{index}", total),
        )
    if reconciliation:
        add_reconciliation(db.engine, collection)


@contextlib.contextmanager
def reexecution(tags=None) -> Iterator[dg.DagsterInstance]:
    """An instance in which the directly invoked op's run is a re-execution of another run
    (what an operator's "re-execute" creates; with `dagster/retry_number`, what the run-retry
    daemon creates)."""
    with dg.DagsterInstance.ephemeral() as instance:
        with dg.build_op_context(instance=instance) as context:
            run_id = context.run_id
        parent = instance.add_run(dg.DagsterRun(job_name="media_usage_collection_deletion"))
        instance.add_run(
            dg.DagsterRun(
                job_name="media_usage_collection_deletion",
                run_id=run_id,
                parent_run_id=parent.run_id,
                root_run_id=parent.run_id,
                tags=tags or {},
            )
        )
        yield instance


def without(tables: dict[str, list], marker: str) -> dict[str, list]:
    """A snapshot minus the rows that mention `marker` (a source key of the deleted collection)."""
    return {name: [row for row in rows if marker not in str(row)] for name, rows in tables.items()}


def assert_stopped(result: OpResult, outcome: str) -> None:
    assert result.outcome == outcome
    assert result.lease is None, "a stopped op must not hand the claim on"


# --- claim_deletion -----------------------------------------------------------------------------


def test_claim_deletion_claims_the_due_tombstone_in_its_phase(activated, posts):
    tombstone(activated.engine, posts, DeletionPhase.SOURCES, force=True)

    result = invoke(claim_deletion, activated, op_config={"collection_id": posts.id})

    row = tombstone_row(activated.engine, posts.id)
    assert result.outcome == "claimed"
    assert result.metadata["collection_id"] == posts.id
    assert result.lease == DeletionLease(posts.id, row["lease_token"])
    assert (row["state"], row["phase"]) == ("leased", "sources")
    assert 299 <= seconds_between(row["updated_at"], row["lease_expires_at"]) <= 301


@pytest.mark.parametrize("situation", ["missing", "live_lease", "backing_off", "failed"])
def test_claim_deletion_of_a_tombstone_that_is_not_due_stops_the_run(activated, posts, situation):
    if situation == "live_lease":
        claimed(activated.engine, posts, DeletionPhase.WORK)
    elif situation != "missing":
        tombstone(activated.engine, posts, DeletionPhase.WORK)
        state = "retry" if situation == "backing_off" else "failed"
        set_tombstone(
            activated.engine,
            posts.id,
            state=state,
            attempt_count=2,
            next_attempt_at=FAR_FUTURE,
            last_error_code=FAILED_CODE,
        )
    before = snapshot(activated.engine)

    result = invoke(claim_deletion, activated, op_config={"collection_id": posts.id})

    assert_stopped(result, "not_due")
    assert snapshot(activated.engine) == before


@pytest.mark.parametrize("state", ["failed", "retry"])
def test_claim_deletion_in_a_reexecution_reopens_a_failed_tombstone_in_its_phase(
    activated, posts, state
):
    tombstone(activated.engine, posts, DeletionPhase.SOURCES, force=True)
    set_tombstone(
        activated.engine,
        posts.id,
        state=state,
        attempt_count=5 if state == "failed" else 2,
        next_attempt_at=FAR_FUTURE,
        last_error_code=FAILED_CODE,
        source_key="posts-source-0",
        occurrence_cursor="usage-049",
    )

    with reexecution() as instance:
        result = invoke(
            claim_deletion, activated, op_config={"collection_id": posts.id}, instance=instance
        )

    row = tombstone_row(activated.engine, posts.id)
    assert result.outcome == "claimed"
    assert result.lease == DeletionLease(posts.id, row["lease_token"])
    assert row["state"] == "leased" and row["attempt_count"] == 0
    assert row["last_error_code"] is None
    assert (row["phase"], row["source_key"], row["occurrence_cursor"]) == (
        "sources",
        "posts-source-0",
        "usage-049",
    )


def test_a_reexecution_never_takes_a_live_lease(activated, posts):
    owner = claimed(activated.engine, posts, DeletionPhase.WORK)
    before = snapshot(activated.engine)

    with reexecution() as instance:
        result = invoke(
            claim_deletion, activated, op_config={"collection_id": posts.id}, instance=instance
        )

    assert_stopped(result, "not_due")
    assert snapshot(activated.engine) == before
    assert tombstone_row(activated.engine, posts.id)["lease_token"] == owner.lease_token


# --- every phase op, in order -------------------------------------------------------------------


def test_the_phase_ops_in_order_delete_everything_and_free_the_slug(activated, cms, posts, pages):
    cms.insert_entries("posts", [{"id": f"post-{i}", "title": "x", "hero": None} for i in range(3)])
    populate(activated, posts, work=60, occurrences=(55, 4), reconciliation=True)
    index_before = snapshot(activated.engine, INDEX)
    pages_work = all_rows(activated.engine, schema.work, collection_id=pages.id)
    tombstone(activated.engine, posts, force=True)

    claim = invoke(claim_deletion, activated, op_config={"collection_id": posts.id})
    assert claim.outcome == "claimed"
    token = claim.lease.lease_token

    fenced = invoke(fence, activated, claim.lease)
    assert (fenced.outcome, fenced.metadata["next_phase"]) == ("advanced", "registry")
    assert one(activated.engine, schema.index_status, collection_id=posts.id)["capture_state"] == (
        "deleting"
    )

    detached = invoke(remove_registry, activated, fenced.lease)
    assert (detached.outcome, detached.metadata["next_phase"]) == ("advanced", "table")
    assert count(activated.engine, schema.collections, id=posts.id) == 0
    assert count(activated.engine, schema.fields, collection_id=posts.id) == 0

    dropped = invoke(drop_table, activated, detached.lease)
    assert (dropped.outcome, dropped.metadata["next_phase"]) == ("advanced", "work")
    assert not table_exists(activated.engine, "ec_posts")

    drained = invoke(delete_work, activated, dropped.lease)
    assert drained.outcome == "advanced"
    assert drained.metadata == {
        "outcome": "advanced",
        "phase": "work",
        "batches": 2,
        # 60 seeded rows plus the 3 the capture trigger wrote for the inserted entries
        "rows_deleted": 63,
        "next_phase": "sources",
        # what a re-execution resumes from (dagster_kit/claim_io.py)
        "collection_id": posts.id,
    }
    assert count(activated.engine, schema.work, collection_id=posts.id) == 0

    emptied = invoke(delete_sources, activated, drained.lease)
    # source 0: 50 then 5 occurrences; source 1: 4; then the phase moves on
    assert emptied.metadata == {
        "outcome": "advanced",
        "phase": "sources",
        "batches": 4,
        "rows_deleted": 59,
        "next_phase": "status",
        "collection_id": posts.id,
    }

    cleared = invoke(delete_status, activated, emptied.lease)
    assert (cleared.outcome, cleared.metadata["next_phase"]) == ("advanced", "finalize")
    assert count(activated.engine, schema.reconciliations, collection_id=posts.id) == 0
    assert count(activated.engine, schema.index_status, collection_id=posts.id) == 0

    finalized = invoke(finalize_deletion, activated, cleared.lease)
    assert_stopped(finalized, "finalized")

    for result in (fenced, detached, dropped, drained, emptied, cleared):
        assert result.lease == DeletionLease(posts.id, token)
    assert (
        leftovers(activated.engine, posts.id, "posts", ["posts-source-0", "posts-source-1"]) == {}
    )
    assert snapshot(activated.engine, INDEX) == without(index_before, "posts-source")
    assert all_rows(activated.engine, schema.work, collection_id=pages.id) == pages_work
    assert cms.create_collection("posts", IMAGE_ONLY).id != posts.id


# --- an op whose phase is already past ----------------------------------------------------------


PAST = [
    (op_phase, tombstone_phase)
    for index, op_phase in enumerate(PHASES[:-1])
    for tombstone_phase in dict.fromkeys((PHASES[index + 1], DeletionPhase.FINALIZE))
]


@pytest.mark.parametrize(
    ("op_phase", "tombstone_phase"), PAST, ids=[f"{a}-at-{b}" for a, b in PAST]
)
def test_an_op_whose_phase_is_past_hands_the_claim_on_untouched(
    activated, posts, pages, op_phase, tombstone_phase
):
    populate(activated, posts, work=3, occurrences=(3,), reconciliation=True)
    lease = lease_of(activated, posts, tombstone_phase)
    tombstone_before = tombstone_row(activated.engine, posts.id)
    before = snapshot(activated.engine, NOT_TOMBSTONES)

    result = invoke(PHASE_OPS[op_phase], activated, lease, op_config=_budget(op_phase))

    assert result.outcome == "already_past"
    assert result.metadata["tombstone_phase"] == tombstone_phase.value
    assert result.lease == lease
    assert snapshot(activated.engine, NOT_TOMBSTONES) == before
    tombstone_after = tombstone_row(activated.engine, posts.id)
    moving = {"lease_expires_at", "updated_at"}  # the lease was renewed, nothing else
    assert {k: v for k, v in tombstone_after.items() if k not in moving} == {
        k: v for k, v in tombstone_before.items() if k not in moving
    }


def _budget(phase):
    if phase in (DeletionPhase.WORK, DeletionPhase.SOURCES):
        return {"max_batches": 10}
    return None


def test_an_op_ahead_of_the_tombstone_stops_without_touching_anything(activated, posts):
    populate(activated, posts, work=3, occurrences=(3,), reconciliation=True)
    lease = lease_of(activated, posts, DeletionPhase.WORK)
    before = snapshot(activated.engine, NOT_TOMBSTONES)

    result = invoke(delete_status, activated, lease)

    assert_stopped(result, "out_of_order")
    assert result.metadata["tombstone_phase"] == "work"
    assert snapshot(activated.engine, NOT_TOMBSTONES) == before
    assert tombstone_row(activated.engine, posts.id)["phase"] == "work"


# --- fence --------------------------------------------------------------------------------------


def test_fence_without_force_keeps_a_collection_with_content_and_cancels_the_tombstone(
    activated, cms, posts
):
    cms.insert_entry("posts", {"id": "post-1", "title": "live", "hero": None})
    before = snapshot(activated.engine)
    lease = lease_of(activated, posts, DeletionPhase.FENCE, force=False)

    result = invoke(fence, activated, lease)

    assert_stopped(result, "has_content")
    assert tombstone_row(activated.engine, posts.id) is None
    assert snapshot(activated.engine) == before
    assert table_exists(activated.engine, "ec_posts")


def test_fence_without_force_goes_ahead_when_every_entry_is_trashed(activated, cms, posts):
    cms.insert_entry("posts", {"id": "post-1", "title": "old", "hero": None})
    cms.trash_entry("posts", "post-1")
    lease = lease_of(activated, posts, DeletionPhase.FENCE, force=False)

    result = invoke(fence, activated, lease)

    assert (result.outcome, result.metadata["next_phase"], result.lease) == (
        "advanced",
        "registry",
        lease,
    )
    status = one(activated.engine, schema.index_status, collection_id=posts.id)
    assert status["capture_state"] == "deleting"
    assert tombstone_row(activated.engine, posts.id)["phase"] == "registry"


# --- batch ops: budgets and lease renewal -------------------------------------------------------


def test_delete_work_hands_back_when_its_batch_budget_is_spent(activated, posts, pages):
    populate(activated, posts, work=130)
    pages_work = all_rows(activated.engine, schema.work, collection_id=pages.id)
    lease = lease_of(activated, posts, DeletionPhase.WORK)

    result = invoke(delete_work, activated, lease, op_config={"max_batches": 2})

    assert_stopped(result, "budget_exhausted")
    assert (result.metadata["batches"], result.metadata["rows_deleted"]) == (2, 100)
    row = tombstone_row(activated.engine, posts.id)
    assert (row["state"], row["phase"], row["work_cursor"]) == ("pending", "work", "entry-099")
    assert row["lease_token"] is None and row["lease_expires_at"] is None
    assert row["next_attempt_at"] <= db_now(activated.engine)
    remaining = [
        r["content_id"] for r in all_rows(activated.engine, schema.work, collection_id=posts.id)
    ]
    assert sorted(remaining) == ids("entry", 130)[100:]
    assert all_rows(activated.engine, schema.work, collection_id=pages.id) == pages_work

    claim = invoke(claim_deletion, activated, op_config={"collection_id": posts.id})
    resumed = invoke(delete_work, activated, claim.lease, op_config={"max_batches": 2})

    assert (resumed.outcome, resumed.metadata["rows_deleted"]) == ("advanced", 30)
    assert resumed.metadata["batches"] == 1
    assert count(activated.engine, schema.work, collection_id=posts.id) == 0
    row = tombstone_row(activated.engine, posts.id)
    assert (row["phase"], row["work_cursor"]) == ("sources", None)


def test_delete_work_hands_back_when_its_time_budget_is_spent(activated, posts):
    populate(activated, posts, work=130)
    lease = lease_of(activated, posts, DeletionPhase.WORK)

    result = invoke(delete_work, activated, lease, op_config={"max_seconds": 1e-9})

    assert_stopped(result, "budget_exhausted")
    assert (result.metadata["batches"], result.metadata["rows_deleted"]) == (1, 50)
    row = tombstone_row(activated.engine, posts.id)
    assert (row["state"], row["work_cursor"]) == ("pending", "entry-049")


def test_a_batch_op_renews_its_lease_between_batches(activated, posts, monkeypatch):
    populate(activated, posts, work=130)
    lease = lease_of(activated, posts, DeletionPhase.WORK)
    # A lease about to run out: only renewal keeps it.
    set_tombstone(activated.engine, posts.id, lease_expires_at=db_now(activated.engine, 5))
    renewals = []
    renew = processing.renew_deletion_lease

    def spying_renew(engine, held):
        renewals.append(count(engine, schema.work, collection_id=posts.id))
        return renew(engine, held)

    monkeypatch.setattr(processing, "renew_deletion_lease", spying_renew)

    result = invoke(delete_work, activated, lease)

    assert (result.outcome, result.metadata["batches"], result.lease) == ("advanced", 3, lease)
    # once before the first batch (the op makes sure it still holds the lease), then between
    # batches, never after the last one
    assert renewals == [130, 80, 30]
    row = tombstone_row(activated.engine, posts.id)
    assert seconds_between(db_now(activated.engine), row["lease_expires_at"]) > 290


def test_a_batch_op_that_loses_its_lease_between_batches_stops(activated, posts, monkeypatch):
    populate(activated, posts, work=130)
    lease = lease_of(activated, posts, DeletionPhase.WORK)
    renew = processing.renew_deletion_lease
    thief = []

    def renew_after_a_takeover(engine, held):
        if count(engine, schema.work, collection_id=posts.id) < 130 and not thief:
            expire_lease(engine, posts.id)
            thief.append(DeletionRepository(engine).claim(posts.id, "work", LEASE_SECONDS))
        return renew(engine, held)

    monkeypatch.setattr(processing, "renew_deletion_lease", renew_after_a_takeover)

    result = invoke(delete_work, activated, lease)

    assert_stopped(result, "claim_lost")
    assert (result.metadata["batches"], result.metadata["rows_deleted"]) == (1, 50)
    assert count(activated.engine, schema.work, collection_id=posts.id) == 80
    row = tombstone_row(activated.engine, posts.id)
    assert row["state"] == "leased" and row["lease_token"] == thief[0].lease_token
    assert row["work_cursor"] == "entry-049"


def test_delete_sources_keeps_its_source_and_cursor_across_runs(activated, posts, pages):
    populate(activated, posts, occurrences=(120, 10))
    add_source(
        activated.engine,
        "legacy-posts",
        collection_id=None,
        collection_slug="posts",
        identity_version=None,
        occurrence_ids=ids("legacy-usage", 3),
    )
    kept = snapshot(activated.engine, INDEX)
    lease = lease_of(activated, posts, DeletionPhase.SOURCES)

    result = invoke(delete_sources, activated, lease, op_config={"max_batches": 2})

    assert_stopped(result, "budget_exhausted")
    assert (result.metadata["batches"], result.metadata["rows_deleted"]) == (2, 100)
    row = tombstone_row(activated.engine, posts.id)
    assert (row["state"], row["phase"]) == ("pending", "sources")
    assert (row["source_key"], row["occurrence_cursor"]) == ("posts-source-0", "posts-usage-0-099")
    assert count(activated.engine, schema.occurrences, source_key="posts-source-0") == 20

    claim = invoke(claim_deletion, activated, op_config={"collection_id": posts.id})
    resumed = invoke(delete_sources, activated, claim.lease)

    # the rest of source 0, all of source 1, then the move to `status`
    assert resumed.metadata == {
        "outcome": "advanced",
        "phase": "sources",
        "batches": 3,
        "rows_deleted": 30,
        "next_phase": "status",
        "collection_id": posts.id,
    }
    row = tombstone_row(activated.engine, posts.id)
    assert (row["phase"], row["source_key"], row["occurrence_cursor"]) == ("status", None, None)
    # only what later phases remove is left; legacy and other collections' sources are kept
    assert leftovers(activated.engine, posts.id, "posts", ["posts-source-0", "posts-source-1"]) == {
        "index_status": 1,
        "registry": 1,
        "fields": 2,
        "tombstones": 1,
        "content_table": 1,
    }
    assert snapshot(activated.engine, INDEX) == without(kept, "posts-source")


# --- failures -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempts_before", "state", "delay"),
    [(0, "retry", 30), (1, "retry", 60), (2, "retry", 120), (3, "retry", 240), (4, "failed", 480)],
)
def test_a_failed_step_is_charged_to_the_tombstone_like_emdash(
    activated, posts, attempts_before, state, delay
):
    populate(activated, posts, work=1)  # delete_status refuses while work remains
    lease = lease_of(activated, posts, DeletionPhase.STATUS)
    set_tombstone(activated.engine, posts.id, attempt_count=attempts_before)

    with pytest.raises(dg.Failure) as failure:
        invoke(delete_status, activated, lease)

    outcome = "failed" if state == "failed" else "retry"
    assert failure.value.metadata["outcome"].value == outcome
    assert f"({outcome})" in failure.value.description
    assert "DeletionCleanupIncomplete" in failure.value.description
    row = tombstone_row(activated.engine, posts.id)
    assert row["state"] == state
    assert row["attempt_count"] == attempts_before + 1
    assert row["last_error_code"] == FAILED_CODE
    assert row["phase"] == "status"
    assert row["lease_token"] is None and row["lease_expires_at"] is None
    # no jitter: exactly min(900, 30 * 2^attempts_before) after the failure was recorded
    # Two clock readings of one statement: on PostgreSQL either may come first (the seeds'
    # clock_timestamp() advances within the statement), so the gap is the delay give or take.
    assert abs(seconds_between(row["updated_at"], row["next_attempt_at"]) - delay) < 0.5
    assert count(activated.engine, schema.work, collection_id=posts.id) == 1


def test_a_fence_that_cannot_verify_capture_is_charged_and_changes_nothing(activated, posts):
    set_status(activated.engine, "posts", capture_state="deleting")
    with activated.engine.begin() as connection:
        remove_capture_triggers(connection, CaptureIdentity(posts.id, "posts"))
    set_status(activated.engine, "posts", capture_state="active")
    lease = lease_of(activated, posts, DeletionPhase.FENCE)
    before = snapshot(activated.engine, NOT_TOMBSTONES)

    with pytest.raises(dg.Failure, match="DeletionNotReady"):
        invoke(fence, activated, lease)

    row = tombstone_row(activated.engine, posts.id)
    assert (row["state"], row["attempt_count"], row["phase"]) == ("retry", 1, "fence")
    assert snapshot(activated.engine, NOT_TOMBSTONES) == before


def test_a_batch_op_failing_mid_loop_keeps_the_cursor_it_committed(activated, posts, monkeypatch):
    populate(activated, posts, work=130)
    lease = lease_of(activated, posts, DeletionPhase.WORK)
    real_batch = DeletionRepository.delete_work_batch
    calls = []

    def failing_second_batch(self, held, batch=50):
        calls.append(held)
        if len(calls) == 2:
            raise RuntimeError("disk on fire")
        return real_batch(self, held, batch)

    monkeypatch.setattr(DeletionRepository, "delete_work_batch", failing_second_batch)

    with pytest.raises(dg.Failure, match="disk on fire"):
        invoke(delete_work, activated, lease)

    row = tombstone_row(activated.engine, posts.id)
    assert (row["state"], row["attempt_count"]) == ("retry", 1)
    assert (row["phase"], row["work_cursor"]) == ("work", "entry-049")
    assert count(activated.engine, schema.work, collection_id=posts.id) == 80


def test_a_transient_database_error_retries_the_step_and_is_not_charged(
    activated, posts, monkeypatch
):
    lease = lease_of(activated, posts, DeletionPhase.STATUS)

    def locked(self, held):
        raise sa_exc.OperationalError("DELETE ...", {}, Exception("database is locked"))

    monkeypatch.setattr(DeletionRepository, "delete_status", locked)

    with pytest.raises(dg.RetryRequested) as retried:
        invoke(delete_status, activated, lease)
    assert isinstance(retried.value.__cause__, sa_exc.OperationalError)

    row = tombstone_row(activated.engine, posts.id)
    assert (row["state"], row["attempt_count"], row["lease_token"]) == (
        "leased",
        0,
        lease.lease_token,
    )
    assert row["last_error_code"] is None


# --- a lease that lapsed, was taken, or was released --------------------------------------------


def test_an_op_whose_lease_is_held_by_another_owner_yields_no_lease(activated, posts):
    populate(activated, posts, work=3)
    stale = lease_of(activated, posts, DeletionPhase.WORK)
    expire_lease(activated.engine, posts.id)
    owner = DeletionRepository(activated.engine).claim(posts.id, "work", LEASE_SECONDS)
    before = snapshot(activated.engine)

    result = invoke(delete_work, activated, stale)

    assert_stopped(result, "lease_active")
    assert snapshot(activated.engine) == before
    assert tombstone_row(activated.engine, posts.id)["lease_token"] == owner.lease_token


def test_an_op_whose_lease_expired_reclaims_the_due_tombstone_and_goes_on(activated, posts):
    populate(activated, posts, work=3)
    lapsed = lease_of(activated, posts, DeletionPhase.WORK)
    expire_lease(activated.engine, posts.id)

    result = invoke(delete_work, activated, lapsed)

    row = tombstone_row(activated.engine, posts.id)
    assert (result.outcome, result.metadata["next_phase"]) == ("advanced", "sources")
    assert result.lease == DeletionLease(posts.id, row["lease_token"])
    assert result.lease.lease_token != lapsed.lease_token
    assert count(activated.engine, schema.work, collection_id=posts.id) == 0


def test_an_op_finds_its_tombstone_gone(activated, posts):
    lease = lease_of(activated, posts, DeletionPhase.FINALIZE)
    with activated.engine.begin() as connection:
        connection.execute(schema.collection_deletions.delete())

    assert_stopped(invoke(finalize_deletion, activated, lease), "gone")


@pytest.mark.parametrize("state", ["retry", "failed"])
def test_after_a_recorded_failure_only_a_reexecution_reclaims(activated, posts, state):
    populate(activated, posts, work=3)
    lease = lease_of(activated, posts, DeletionPhase.WORK)
    set_tombstone(
        activated.engine,
        posts.id,
        state=state,
        attempt_count=5 if state == "failed" else 1,
        next_attempt_at=FAR_FUTURE,
        lease_token=None,
        lease_expires_at=None,
        last_error_code=FAILED_CODE,
    )
    before = snapshot(activated.engine)

    assert_stopped(invoke(delete_work, activated, lease), state if state == "failed" else "not_due")
    assert snapshot(activated.engine) == before

    with reexecution() as instance:
        result = invoke(delete_work, activated, lease, instance=instance)
        [run] = [run for run in instance.get_runs() if run.parent_run_id]

    row = tombstone_row(activated.engine, posts.id)
    assert (result.outcome, result.metadata["next_phase"]) == ("advanced", "sources")
    assert result.lease == DeletionLease(posts.id, row["lease_token"])
    assert (row["attempt_count"], row["last_error_code"]) == (0, None)
    assert count(activated.engine, schema.work, collection_id=posts.id) == 0
    assert run.tags["media_usage/outcome"] == "advanced"


@pytest.mark.parametrize("op_name", ["claim_deletion", "delete_work"])
def test_an_automatic_run_retry_does_not_reopen_a_failed_tombstone(activated, posts, op_name):
    """The run-retry daemon re-executes failed runs on its own (tag dagster/retry_number):
    reopening there would reset the attempt count and skip the backoff on every retry."""
    populate(activated, posts, work=3)
    lease = lease_of(activated, posts, DeletionPhase.WORK)
    set_tombstone(
        activated.engine,
        posts.id,
        state="failed",
        attempt_count=5,
        next_attempt_at=FAR_FUTURE,
        lease_token=None,
        lease_expires_at=None,
        last_error_code=FAILED_CODE,
    )
    before = snapshot(activated.engine)

    with reexecution(tags={"dagster/retry_number": "1"}) as instance:
        if op_name == "claim_deletion":
            result = invoke(
                claim_deletion, activated, op_config={"collection_id": posts.id}, instance=instance
            )
        else:
            result = invoke(delete_work, activated, lease, instance=instance)

    assert_stopped(result, "not_due" if op_name == "claim_deletion" else "failed")
    assert snapshot(activated.engine) == before


# --- request_deletion ---------------------------------------------------------------------------


def request(db, collection, force=False, instance=None) -> OpResult:
    return invoke(
        request_deletion,
        db,
        op_config={"collection": collection, "force": force},
        instance=instance,
    )


def test_request_detaches_an_activated_collection_and_leaves_the_rest_to_the_background(
    activated, cms, posts
):
    cms.insert_entry("posts", {"id": "post-1", "title": "x", "hero": None})

    result = request(activated, "posts", force=True)

    assert result.metadata["outcome"] == "deleted"
    assert result.metadata["collection"] == "posts"
    row = tombstone_row(activated.engine, posts.id)
    assert (row["state"], row["phase"], row["force_delete"]) == ("pending", "work", 1)
    assert not table_exists(activated.engine, "ec_posts")
    assert count(activated.engine, schema.collections, slug="posts") == 0
    assert count(activated.engine, schema.work, collection_id=posts.id) == 1


def test_request_reports_in_progress_while_another_owner_holds_the_tombstone(activated, posts):
    claimed(activated.engine, posts, DeletionPhase.FENCE, force=True)
    before = snapshot(activated.engine)

    result = request(activated, "posts", force=True)

    assert result.metadata["outcome"] == "in_progress"
    assert snapshot(activated.engine) == before


def test_request_deletes_synchronously_while_capture_is_not_activated(db):
    collection = CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)
    CmsWriter(db.engine).insert_entry("posts", {"id": "post-1", "title": "x", "hero": None})

    result = request(db, "posts", force=True)

    assert result.metadata["outcome"] == "inactive"
    assert leftovers(db.engine, collection.id, "posts") == {}
    assert count(db.engine, schema.collection_deletions) == 0


def test_request_refuses_a_collection_with_content_and_changes_nothing(activated, cms, posts):
    cms.insert_entry("posts", {"id": "post-1", "title": "x", "hero": None})
    before = snapshot(activated.engine)

    with pytest.raises(dg.Failure, match="still has entries") as failure:
        request(activated, "posts")

    assert failure.value.metadata["outcome"].value == "has_content"
    assert snapshot(activated.engine) == before


@pytest.mark.parametrize("activation", ["active", "expanded"])
def test_request_for_a_missing_collection_fails_with_not_found(db, activation):
    if activation == "active":
        activate(db.engine)
    before = snapshot(db.engine)

    with pytest.raises(dg.Failure, match="'ghost' does not exist") as failure:
        request(db, "ghost")

    assert failure.value.metadata["outcome"].value == "not_found"
    assert snapshot(db.engine) == before


def test_request_refuses_an_invalid_slug_before_touching_the_database(activated, posts):
    before = snapshot(activated.engine)

    with pytest.raises(dg.Failure, match="Invalid collection slug") as failure:
        request(activated, "Posts; DROP TABLE ec_posts")

    assert failure.value.allow_retries is False

    assert snapshot(activated.engine) == before


def test_phase_ops_pass_only_the_claim_identity():
    for op_def in PHASE_OPS.values():
        assert set(op_def.output_dict) == {"lease", "outcome"}
        assert op_def.output_dict["lease"].dagster_type.typing_type is DeletionLease
        assert not op_def.output_dict["lease"].is_required
    assert set(claim_deletion.output_dict) == {"lease", "outcome"}
