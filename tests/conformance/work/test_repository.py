"""WorkRepository: claims, leases, transitions, due order, enqueue, renewal and batch claims.

Ports upstream `media-usage-work-repository.test.ts` and adds the enqueue, renewal, batch
and bad-input scenarios. Every test runs on SQLite and PostgreSQL.

Operator listing and retry of media usage work (upstream `media-usage-work-operator.test.ts`).

The upstream races (newer work, removal, collection deletion between the coverage bump and
the reopen) are staged with a trigger on the status epoch bump, on both dialects.

A batch claim's cost does not grow with the backlog: each due state is read by walking its
index in due order, never by sorting every due row.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import event, select, text, update
from sqlalchemy.engine import make_url

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import create_database_engine
from media_usage_orchestration.store.core.leases import LeaseState
from media_usage_orchestration.store.work.records import (
    OperatorPage,
    OperatorWorkItem,
    WorkLease,
    WorkRecord,
)
from media_usage_orchestration.store.work.repository import WorkRepository
from media_usage_orchestration.store.work.statements import (
    due_indexes_walked_in_order as _due_indexes_walked_in_order,
)
from media_usage_orchestration.store.work.statements import due_rows_statement
from media_usage_orchestration.values.errors import InvalidCursorError
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome, OperatorRetryResult
from tests.support.factories import (
    FUTURE,
    PAST,
    expired,
    insert_deletion,
    insert_reconciliation,
    insert_work,
    insert_works,
    leased,
    of,
)
from tests.support.states import (
    all_rows,
    backdate,
    count,
    db_now,
    make_collection,
    set_activation,
    set_status,
    snapshot,
    status_row,
)
from tests.support.work import ULID_PATTERN, after_epoch_bump, lease, read_work, update_work

RUN_TOKEN = "01J0RUNTOKEN0000000000000A"
RECONCILIATION_LEASE = "01J0RECONCILIATIONLEASE00A"
TARGET_EPOCH = 4


@pytest.fixture
def repo(db) -> WorkRepository:
    return WorkRepository(db.engine)


def claim(repo: WorkRepository, work_version: int = 1, content_id: str = "entry-1"):
    return repo.claim_work("collection-1", content_id, work_version, 60)


# --- claims and transitions (upstream scenarios) ----------------------------------------------


def test_only_one_concurrent_claimer_wins_an_exact_due_version(db, repo):
    insert_work(db.engine)
    barrier = threading.Barrier(2)

    def contend(_):
        barrier.wait()
        return claim(repo)

    with ThreadPoolExecutor(2) as pool:
        claims = list(pool.map(contend, range(2)))

    winners = [result for result in claims if result is not None]
    assert len(winners) == 1
    winner = winners[0]
    assert (winner.collection_id, winner.content_id, winner.work_version) == (
        "collection-1",
        "entry-1",
        1,
    )
    assert winner.state is LeaseState.LEASED
    assert re.fullmatch(ULID_PATTERN, winner.lease_token)
    assert winner.last_attempted_at and winner.lease_expires_at > winner.last_attempted_at
    assert read_work(db.engine)["lease_token"] == winner.lease_token


def test_does_not_claim_future_failed_or_stale_version_work(db, repo):
    insert_work(db.engine, next_attempt_at=FUTURE)
    assert claim(repo) is None

    update_work(db.engine, {"state": "failed", "next_attempt_at": PAST})
    assert claim(repo) is None

    update_work(db.engine, {"state": "pending", "work_version": 2})
    assert claim(repo, 1) is None
    claimed = claim(repo, 2)
    assert claimed is not None and claimed.work_version == 2


def test_expired_lease_is_taken_over_and_the_old_owner_is_fenced(db, repo):
    insert_work(
        db.engine,
        state="leased",
        lease_token="old-owner",
        lease_expires_at="2000-01-01T00:01:00.000Z",
    )

    replacement = claim(repo)
    assert replacement is not None
    assert replacement.lease_token and replacement.lease_token != "old-owner"
    old = lease("old-owner")
    assert repo.complete_work(old) is False
    assert repo.retry_work(old, 1, "TRANSIENT_DATABASE_FAILURE") is False
    assert repo.fail_work(old, "INVARIANT_FAILURE") is False
    assert read_work(db.engine)["lease_token"] == replacement.lease_token

    assert repo.complete_work(replacement.lease) is True
    assert read_work(db.engine) is None


def test_newer_work_created_during_a_lease_cannot_be_acknowledged_or_rewritten(db, repo):
    insert_work(db.engine)
    stale = claim(repo)
    assert stale is not None
    update_work(
        db.engine,
        {
            "work_version": 2,
            "change_epoch": 2,
            "state": "pending",
            "attempt_count": 0,
            "next_attempt_at": PAST,
            "lease_token": None,
            "lease_expires_at": None,
            "last_error_code": None,
        },
    )
    newer = read_work(db.engine)

    assert repo.complete_work(stale.lease) is False
    assert repo.retry_work(stale.lease, 1, "TRANSIENT_DATABASE_FAILURE") is False
    assert repo.fail_work(stale.lease, "INVARIANT_FAILURE") is False
    assert repo.renew_lease(stale.lease, 60) is None
    assert read_work(db.engine) == newer
    assert (newer["work_version"], newer["change_epoch"], newer["state"]) == (2, 2, "pending")


def test_retry_then_fail_only_a_live_lease(db, repo):
    insert_work(db.engine)
    retry_claim = claim(repo)
    assert repo.retry_work(retry_claim.lease, 60, "SNAPSHOT_FAILURE") is True
    retried = read_work(db.engine)
    assert retried["state"] == "retry"
    assert retried["attempt_count"] == 1
    assert retried["lease_token"] is None and retried["lease_expires_at"] is None
    assert retried["last_error_code"] == "SNAPSHOT_FAILURE"
    assert retried["next_attempt_at"] > retried["updated_at"]
    assert claim(repo) is None

    update_work(db.engine, {"next_attempt_at": PAST})
    failure_claim = claim(repo)
    assert failure_claim is not None
    assert repo.fail_work(failure_claim.lease, "RESOURCE_LIMIT") is True
    failed = read_work(db.engine)
    assert failed["state"] == "failed"
    assert failed["attempt_count"] == 2
    assert failed["lease_token"] is None and failed["lease_expires_at"] is None
    assert failed["last_error_code"] == "RESOURCE_LIMIT"
    assert failed["next_attempt_at"] == PAST
    assert claim(repo) is None


def test_every_stale_transition_is_rejected_after_lease_expiry(db, repo):
    insert_work(db.engine)
    expired = claim(repo)
    assert backdate(db.engine, schema.work, "lease_expires_at", 1, content_id="entry-1") == 1
    before = read_work(db.engine)

    assert repo.complete_work(expired.lease) is False
    assert repo.retry_work(expired.lease, 1, "TRANSIENT_DATABASE_FAILURE") is False
    assert repo.fail_work(expired.lease, "INVARIANT_FAILURE") is False
    assert repo.renew_lease(expired.lease, 60) is None
    assert read_work(db.engine) == before
    assert before["state"] == "leased" and before["lease_token"] == expired.lease_token

    takeover = claim(repo)
    assert takeover is not None and takeover.lease_token != expired.lease_token


@pytest.mark.parametrize("lease_seconds", [0, -1, 365 * 24 * 60 * 60 + 1, 1.5, True, "60"])
def test_non_portable_lease_durations_change_nothing(db, repo, lease_seconds):
    insert_work(db.engine)
    before = snapshot(db.engine)
    with pytest.raises(ValueError, match=r"whole number of seconds"):
        repo.claim_work("collection-1", "entry-1", 1, lease_seconds)
    assert snapshot(db.engine) == before
    assert read_work(db.engine)["state"] == "pending"


def test_decimal_string_versions_are_accepted_like_bigint_text(db, repo):
    insert_work(db.engine, work_version=7)
    claimed = repo.claim_work("collection-1", "entry-1", "7", 60)
    assert claimed is not None and claimed.work_version == 7
    assert repo.complete_work(WorkLease("collection-1", "entry-1", "7", claimed.lease_token))


@pytest.mark.parametrize(
    "error_code",
    ["database connection failed for customer data", "snapshot_failure", "A" * 65, "", "1ABC"],
)
def test_raw_error_text_is_rejected_without_releasing_the_lease(db, repo, error_code):
    insert_work(db.engine)
    held = claim(repo)
    before = snapshot(db.engine)

    with pytest.raises(ValueError, match=r"stable SCREAMING_SNAKE_CASE"):
        repo.retry_work(held.lease, 1, error_code)
    with pytest.raises(ValueError, match=r"stable SCREAMING_SNAKE_CASE"):
        repo.fail_work(held.lease, error_code)

    assert snapshot(db.engine) == before
    row = read_work(db.engine)
    assert row["state"] == "leased" and row["lease_token"] == held.lease_token
    assert row["attempt_count"] == 0 and row["last_error_code"] is None


# --- lookups ----------------------------------------------------------------------------------


def test_post_write_lookup_finds_only_the_current_collection_instance(db, repo):
    insert_work(
        db.engine, collection_id="obsolete-collection", updated_at="2099-01-01T00:00:00.000Z"
    )
    make_collection(db.engine, "posts", collection_id="current-collection")
    insert_work(db.engine, collection_id="current-collection", updated_at=PAST)

    found = repo.find_work_for_content("posts", "entry-1")

    assert isinstance(found, WorkRecord)
    assert found.collection_id == "current-collection"
    assert repo.find_work_for_content("posts", "entry-2") is None
    assert repo.find_work_for_content("other", "entry-1") is None


def test_a_row_with_an_unknown_state_is_a_clear_error(db, repo):
    make_collection(db.engine, "posts", collection_id="collection-1")
    insert_work(db.engine, state="archived")
    with pytest.raises(ValueError, match=r"Invalid media usage work state: 'archived'"):
        repo.find_work_for_content("posts", "entry-1")


def insert_due_mix(engine) -> None:
    insert_works(
        engine,
        [
            {"content_id": "pending-due", "next_attempt_at": "2001-01-01T00:00:00.000Z"},
            {"content_id": "retry-due", "state": "retry", "next_attempt_at": PAST},
            {
                "content_id": "lease-expired",
                "next_attempt_at": FUTURE,
                **expired("expired-owner", expired_at="1999-01-01T00:00:00.000Z"),
            },
            {"content_id": "pending-future", "next_attempt_at": FUTURE},
            {
                "content_id": "failed",
                "state": "failed",
                "next_attempt_at": "1998-01-01T00:00:00.000Z",
            },
            {
                "content_id": "lease-live",
                "next_attempt_at": PAST,
                **leased("live-owner", expires_at=FUTURE),
            },
        ],
    )


def test_due_work_is_selected_in_eligibility_order(db, repo):
    insert_due_mix(db.engine)

    due = repo.find_due_work(10)

    assert [work.content_id for work in due] == ["lease-expired", "retry-due", "pending-due"]
    assert repo.find_due_work(2) == due[:2]


def test_due_ties_break_on_updated_at_then_identity(db, repo):
    stamp = "2001-01-01T00:00:00.000Z"
    insert_works(
        db.engine,
        [
            {"content_id": "b", "next_attempt_at": stamp, "updated_at": "2001-01-02T00:00:00.000Z"},
            {"content_id": "c", "next_attempt_at": stamp, "updated_at": "2001-01-01T00:00:00.000Z"},
            {"content_id": "a", "next_attempt_at": stamp, "updated_at": "2001-01-02T00:00:00.000Z"},
            {
                "collection_id": "collection-0",
                "content_id": "z",
                "next_attempt_at": stamp,
                "updated_at": "2001-01-02T00:00:00.000Z",
            },
        ],
    )
    assert [(w.collection_id, w.content_id) for w in repo.find_due_work(10)] == [
        ("collection-1", "c"),
        ("collection-0", "z"),
        ("collection-1", "a"),
        ("collection-1", "b"),
    ]


@pytest.mark.parametrize(
    ("state", "index"),
    [
        ("pending", "idx__emdash_media_usage_work_due"),
        ("retry", "idx__emdash_media_usage_work_due"),
        ("leased", "idx__emdash_media_usage_work_lease"),
    ],
)
@pytest.mark.sqlite_only("EXPLAIN QUERY PLAN is SQLite's")
def test_due_queries_use_their_declared_index(db, state, index):
    insert_due_mix(db.engine)
    compiled = due_rows_statement(state, 10).compile(dialect=db.engine.dialect)
    parameters = tuple(compiled.params[name] for name in compiled.positiontup)
    with db.engine.connect() as connection:
        plan = " | ".join(
            row[-1]
            for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", parameters)
        )
    assert f"USING INDEX {index}" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


def test_delete_work_through_epoch_keeps_newer_and_other_collections(db, repo):
    insert_works(
        db.engine,
        [
            {"content_id": "epoch-1", "change_epoch": 1},
            {"content_id": "epoch-3", "change_epoch": 3, "state": "failed"},
            {"content_id": "epoch-4", "change_epoch": 4},
            {"collection_id": "collection-2", "content_id": "other", "change_epoch": 1},
        ],
    )
    assert repo.delete_work_through_epoch("collection-1", 3) == 2
    remaining = {
        (row["collection_id"], row["content_id"]) for row in all_rows(db.engine, schema.work)
    }
    assert remaining == {("collection-1", "epoch-4"), ("collection-2", "other")}
    assert repo.delete_work_through_epoch("collection-1", "3") == 0


# --- reconciliation enqueue -------------------------------------------------------------------


@pytest.fixture
def owned_run(db):
    """An active collection whose reconciliation lease owns the scan of run RUN_TOKEN."""
    set_activation(db.engine)
    collection = make_collection(
        db.engine, "posts", status="running", cursor=RUN_TOKEN, change_epoch=TARGET_EPOCH
    )
    insert_reconciliation(
        db.engine,
        **of(collection),
        run_token=RUN_TOKEN,
        target_epoch=TARGET_EPOCH,
        phase="scan",
        next_attempt_at=PAST,
        **leased(RECONCILIATION_LEASE, seconds=60),
    )
    return collection


def enqueue(repo: WorkRepository, collection, content_ids, **overrides):
    arguments = {
        "collection_id": collection.id,
        "collection_slug": "posts",
        "run_token": RUN_TOKEN,
        "lease_token": RECONCILIATION_LEASE,
        "change_epoch": TARGET_EPOCH,
        "phase": "scan",
        "content_ids": content_ids,
    }
    arguments.update(overrides)
    return repo.enqueue_reconciliation_page(**arguments)


def test_enqueue_inserts_pending_work_for_each_distinct_id(db, repo, owned_run):
    assert enqueue(repo, owned_run, ["entry-1", "entry-2", "entry-1"]) == 2

    rows = sorted(all_rows(db.engine, schema.work), key=lambda row: row["content_id"])
    assert [row["content_id"] for row in rows] == ["entry-1", "entry-2"]
    for row in rows:
        assert row["collection_id"] == owned_run.id and row["collection_slug"] == "posts"
        assert (row["change_epoch"], row["work_version"], row["state"]) == (4, 1, "pending")
        assert row["attempt_count"] == 0 and row["lease_token"] is None
        assert row["next_attempt_at"] <= db_now(db.engine)
    assert sorted(work.content_id for work in repo.find_due_work(10)) == ["entry-1", "entry-2"]


def test_enqueue_reopens_older_work_and_leaves_current_or_newer_work_alone(db, repo, owned_run):
    insert_works(
        db.engine,
        [
            {
                "collection_id": owned_run.id,
                "content_id": "older-failed",
                "change_epoch": 0,
                "work_version": 3,
                "state": "failed",
                "attempt_count": 5,
                "last_error_code": "MEDIA_USAGE_PROCESSING_FAILED",
                "last_attempted_at": PAST,
            },
            {
                "collection_id": owned_run.id,
                "content_id": "older-leased",
                "change_epoch": 3,
                **leased("previous-owner", expires_at=FUTURE),
            },
            {
                "collection_id": owned_run.id,
                "content_id": "same-epoch",
                "change_epoch": 4,
                "state": "failed",
            },
            {
                "collection_id": owned_run.id,
                "content_id": "newer",
                "change_epoch": 99,
                "state": "failed",
            },
        ],
    )
    untouched = {name: read_work(db.engine, owned_run.id, name) for name in ("same-epoch", "newer")}

    written = enqueue(repo, owned_run, ["older-failed", "older-leased", "same-epoch", "newer"])

    assert written == 2
    for name, version in (("older-failed", 4), ("older-leased", 2)):
        row = read_work(db.engine, owned_run.id, name)
        assert (row["state"], row["change_epoch"], row["work_version"]) == ("pending", 4, version)
        assert row["attempt_count"] == 0 and row["last_error_code"] is None
        assert row["lease_token"] is None and row["lease_expires_at"] is None
        assert row["last_attempted_at"] is None
    for name, row in untouched.items():
        assert read_work(db.engine, owned_run.id, name) == row


def _expire_reconciliation_lease(db, collection):
    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=collection.id)


def _reconciliation(**values):
    def apply(db, collection):
        with db.engine.begin() as connection:
            connection.execute(
                update(schema.reconciliations)
                .where(schema.reconciliations.c.collection_id == collection.id)
                .values(**values)
            )

    return apply


def _status(**values):
    return lambda db, collection: set_status(db.engine, "posts", **values)


def _tombstone(db, collection):
    insert_deletion(db.engine, **of(collection), force_delete=0, next_attempt_at=PAST)


def _rename_registry(db, collection):
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.collections)
            .where(schema.collections.c.id == collection.id)
            .values(slug="articles")
        )


def _no_change(db, collection):
    return None


@pytest.mark.parametrize(
    ("mutate", "overrides"),
    [
        pytest.param(_expire_reconciliation_lease, {}, id="reconciliation-lease-expired"),
        pytest.param(_reconciliation(state="pending"), {}, id="reconciliation-not-leased"),
        pytest.param(_reconciliation(phase="sources"), {}, id="other-phase"),
        pytest.param(_reconciliation(target_epoch=3), {}, id="other-target-epoch"),
        pytest.param(_no_change, {"lease_token": "another-lease"}, id="other-lease-token"),
        pytest.param(_no_change, {"run_token": "another-run"}, id="other-run-token"),
        pytest.param(_no_change, {"phase": "sources"}, id="caller-in-other-phase"),
        pytest.param(_no_change, {"change_epoch": 3}, id="caller-at-older-epoch"),
        pytest.param(_no_change, {"collection_slug": "articles"}, id="other-slug"),
        pytest.param(_status(change_epoch=5), {}, id="status-epoch-advanced"),
        pytest.param(_status(status="stale"), {}, id="status-not-running"),
        pytest.param(_status(cursor="manual-repair"), {}, id="status-owned-by-another-run"),
        pytest.param(_status(reconciliation_required=0), {}, id="coverage-trusted"),
        pytest.param(_status(capture_state="deleting"), {}, id="capture-not-active"),
        pytest.param(lambda db, c: set_activation(db.engine, "expanded"), {}, id="inactive"),
        pytest.param(_tombstone, {}, id="deletion-tombstone"),
        pytest.param(_rename_registry, {}, id="registry-identity-changed"),
    ],
)
def test_enqueue_writes_nothing_without_page_ownership(db, repo, owned_run, mutate, overrides):
    insert_work(
        db.engine,
        collection_id=owned_run.id,
        content_id="older-failed",
        change_epoch=0,
        state="failed",
    )
    mutate(db, owned_run)
    before = snapshot(db.engine)

    assert enqueue(repo, owned_run, ["entry-1", "older-failed"], **overrides) == 0

    assert snapshot(db.engine) == before
    assert count(db.engine, schema.work) == 1


# --- lease renewal ----------------------------------------------------------------------------


def test_renewal_extends_only_the_live_lease_of_its_owner(db, repo):
    insert_work(db.engine)
    held = claim(repo)

    renewed = repo.renew_lease(held.lease, 600)

    assert renewed is not None and renewed > held.lease_expires_at
    assert renewed > db_now(db.engine, 500)
    row = read_work(db.engine)
    assert row["lease_expires_at"] == renewed and row["lease_token"] == held.lease_token
    assert row["updated_at"] >= held.updated_at
    assert repo.renew_lease(WorkLease("collection-1", "entry-1", 1, "not-the-owner"), 600) is None
    assert repo.renew_lease(WorkLease("collection-1", "entry-1", 2, held.lease_token), 600) is None
    assert read_work(db.engine) == row
    assert repo.complete_work(held.lease) is True
    assert repo.renew_lease(held.lease, 600) is None


def test_renewal_is_refused_after_expiry_so_a_takeover_stays_possible(db, repo):
    insert_work(db.engine)
    held = claim(repo)
    backdate(db.engine, schema.work, "lease_expires_at", 1, content_id="entry-1")
    expired = read_work(db.engine)

    assert repo.renew_lease(held.lease, 600) is None

    assert read_work(db.engine) == expired
    assert claim(repo) is not None


# --- batch claims -----------------------------------------------------------------------------


def test_batch_claim_takes_due_rows_in_due_order_each_under_its_own_lease(db, repo):
    insert_due_mix(db.engine)
    insert_works(
        db.engine,
        [
            {"content_id": f"pending-{n}", "next_attempt_at": f"200{n}-06-01T00:00:00.000Z"}
            for n in (2, 3)
        ],
    )
    expected = [work.content_id for work in repo.find_due_work(10)]
    assert expected == ["lease-expired", "retry-due", "pending-due", "pending-2", "pending-3"]

    first = repo.claim_due_batch(3, 60)
    second = repo.claim_due_batch(3, 60)

    assert [work.content_id for work in first + second] == expected
    assert repo.claim_due_batch(3, 60) == []
    claimed = first + second
    tokens = [work.lease_token for work in claimed]
    assert len(set(tokens)) == len(tokens) and "expired-owner" not in tokens
    assert all(re.fullmatch(ULID_PATTERN, token) for token in tokens)
    for work in claimed:
        assert work.state is LeaseState.LEASED
        assert work.lease_expires_at > work.last_attempted_at
        assert read_work(db.engine, content_id=work.content_id)["lease_token"] == work.lease_token
    assert read_work(db.engine, content_id="lease-live")["lease_token"] == "live-owner"
    assert read_work(db.engine, content_id="failed")["state"] == "failed"

    for work in claimed:
        assert repo.complete_work(work.lease) is True
    assert {row["content_id"] for row in all_rows(db.engine, schema.work)} == {
        "pending-future",
        "failed",
        "lease-live",
    }


def test_batch_leases_are_fenced_by_their_own_version(db, repo):
    insert_works(db.engine, [{"content_id": "entry-1"}, {"content_id": "entry-2"}])
    one_row, other_row = repo.claim_due_batch(10, 60)
    # A capture write re-enqueues entry-1 while the batch holds it.
    update_work(
        db.engine,
        {"work_version": 2, "state": "pending", "lease_token": None, "lease_expires_at": None},
        content_id=one_row.content_id,
    )

    assert repo.complete_work(one_row.lease) is False
    assert (
        repo.complete_work(WorkLease("collection-1", other_row.content_id, 1, one_row.lease_token))
        is False
    )
    assert repo.complete_work(other_row.lease) is True
    assert read_work(db.engine, content_id=one_row.content_id)["work_version"] == 2

    reclaimed = repo.claim_due_batch(10, 60)
    assert [(w.content_id, w.work_version) for w in reclaimed] == [(one_row.content_id, 2)]


@pytest.mark.postgres_only("SQLite has one writer: a concurrent change cannot be in flight")
def test_batch_claim_skips_a_row_another_writer_is_changing(db, repo):
    insert_works(db.engine, [{"content_id": f"entry-{n}"} for n in range(1, 4)])
    # A claimer that waited for the row lock instead of skipping it fails here, not hangs.
    url = make_url(db.url)
    impatient = create_database_engine(
        url.update_query_dict({"options": f"{url.query['options']} -clock_timeout=5s"})
    )
    try:
        with db.engine.connect() as other:
            transaction = other.begin()
            other.execute(
                update(schema.work)
                .where(schema.work.c.content_id == "entry-2")
                .values(work_version=2, next_attempt_at=FUTURE)
            )
            claimed = WorkRepository(impatient).claim_due_batch(10, 60)
            transaction.commit()
    finally:
        impatient.dispose()

    assert [work.content_id for work in claimed] == ["entry-1", "entry-3"]
    row = read_work(db.engine, content_id="entry-2")
    assert (row["state"], row["work_version"], row["lease_token"]) == ("pending", 2, None)
    assert repo.claim_due_batch(10, 60) == []


def test_exactly_fifty_ids_after_deduplication_are_accepted(db, repo, owned_run):
    page = [f"entry-{n:03d}" for n in range(50)]
    assert enqueue(repo, owned_run, page + page[:10]) == 50
    assert count(db.engine, schema.work) == 50


# ==================================================================================================
# The operator's work page and retry (findOperatorPage, retryOperatorWork)
# ==================================================================================================


STATES = ("pending", "retry", "leased", "failed")
STAMP = "2026-08-06T12:00:00.000Z"


@pytest.fixture
def post(db):
    """The current, active `post` collection with trusted (complete) coverage."""
    collection = make_collection(db.engine, "post", status="complete", reconciliation_required=0)
    set_status(db.engine, "post", completed_at="2026-08-01T00:00:00.000Z")
    return collection


def post_work(post, content_id: str, state: str, **overrides) -> dict:
    row = {
        "collection_id": post.id,
        "collection_slug": "post",
        "content_id": content_id,
        "change_epoch": 0,
        "state": state,
        "created_at": STAMP,
        "updated_at": STAMP,
    }
    row.update(overrides)
    return row


def raw_work(db, post, content_id: str) -> dict | None:
    return read_work(db.engine, post.id, content_id)


# --- listing ----------------------------------------------------------------------------------


def test_cursor_pages_are_deterministic_bounded_and_redacted(db, repo, post):
    insert_works(
        db.engine,
        [
            post_work(
                post,
                f"entry-{index:03d}",
                STATES[index % 4],
                updated_at=f"2026-08-06T12:{index // 3:02d}:00.000Z",
                lease_token="secret-token" if STATES[index % 4] == "leased" else None,
                lease_expires_at="2100-01-01T00:00:00.000Z"
                if STATES[index % 4] == "leased"
                else None,
            )
            for index in range(27)
        ],
    )

    first = repo.find_operator_page("post", limit=10)
    second = repo.find_operator_page("post", limit=10, cursor=first.next_cursor)
    third = repo.find_operator_page("post", limit=10, cursor=second.next_cursor)

    assert isinstance(first, OperatorPage)
    assert len(first.items) == 10 and isinstance(first.next_cursor, str)
    assert first.items[0].collection_id == post.id
    assert first.items[0].collection_slug == "post"
    assert first.items[0].content_id == "entry-026"
    assert len(second.items) == 10 and second.next_cursor
    assert len(third.items) == 7 and third.next_cursor is None
    listed = [item.content_id for page in (first, second, third) for item in page.items]
    assert listed == [f"entry-{index:03d}" for index in range(26, -1, -1)]
    assert repo.find_operator_page("post", limit=10) == first
    exposed = {field.name for field in dataclasses.fields(OperatorWorkItem)}
    assert not exposed & {"lease_token", "work_version", "change_epoch"}
    assert "secret-token" not in repr(first) + repr(second) + repr(third)


def test_an_exact_full_page_is_distinguished_from_a_page_with_more(db, repo, post):
    insert_works(
        db.engine,
        [
            post_work(
                post,
                f"entry-boundary-{index:03d}",
                "pending",
                updated_at=f"2026-08-06T12:{index // 60:02d}:{index % 60:02d}.000Z",
            )
            for index in range(100)
        ],
    )
    exact = repo.find_operator_page("post", limit=100)
    assert len(exact.items) == 100 and exact.next_cursor is None

    insert_work(
        db.engine,
        **post_work(post, "entry-boundary-100", "pending", updated_at="2026-08-06T12:02:00.000Z"),
    )
    first = repo.find_operator_page("post", limit=100)
    assert len(first.items) == 100 and first.next_cursor
    second = repo.find_operator_page("post", limit=100, cursor=first.next_cursor)
    assert [item.content_id for item in second.items] == ["entry-boundary-000"]
    assert second.next_cursor is None


def test_the_default_page_holds_fifty(db, repo, post):
    insert_works(db.engine, [post_work(post, f"entry-{n:02d}", "failed") for n in range(51)])
    page = repo.find_operator_page("post")
    assert len(page.items) == 50 and page.next_cursor


@pytest.mark.parametrize("cursor", ["not-a-cursor", "e30=", "W10=", "x" * 2049])
def test_a_malformed_cursor_is_rejected_instead_of_restarting(db, repo, post, cursor):
    insert_work(db.engine, **post_work(post, "entry-1", "failed"))
    before = snapshot(db.engine)
    with pytest.raises(InvalidCursorError):
        repo.find_operator_page("post", cursor=cursor)
    assert snapshot(db.engine) == before


def test_state_filter_stays_within_one_collection_identity(db, repo, post):
    insert_works(
        db.engine,
        [
            post_work(post, "failed-current", "failed"),
            post_work(post, "pending-current", "pending"),
            post_work(post, "failed-old", "failed", collection_id="other-collection"),
        ],
    )

    page = repo.find_operator_page("post", state="failed", limit=50)

    assert [item.content_id for item in page.items] == ["failed-current"]
    assert page.items[0].state is LeaseState.FAILED
    assert page.next_cursor is None
    everything = repo.find_operator_page("post", limit=50)
    assert {item.content_id for item in everything.items} == {"failed-current", "pending-current"}


def test_a_missing_collection_gives_none(repo, post):
    assert repo.find_operator_page("missing") is None


# --- retry ------------------------------------------------------------------------------------


def test_pending_work_and_its_coverage_epoch_are_left_unchanged(db, repo, post):
    insert_work(db.engine, **post_work(post, "entry-pending", "pending", work_version=4))
    before = snapshot(db.engine)

    result = repo.retry_operator_work(post.id, "entry-pending")

    assert result.outcome is OperatorRetryOutcome.PENDING and result.changed is False
    assert result.row.content_id == "entry-pending" and result.row.state is LeaseState.PENDING
    assert snapshot(db.engine) == before
    assert raw_work(db, post, "entry-pending")["work_version"] == 4


@pytest.mark.parametrize("state", ["retry", "failed"])
def test_retry_and_failed_work_reopen_and_invalidate_complete_coverage(db, repo, post, state):
    insert_work(
        db.engine,
        **post_work(
            post,
            f"entry-{state}",
            state,
            work_version=7,
            attempt_count=3,
            last_error_code="MEDIA_USAGE_PROCESSING_FAILED",
            last_attempted_at=STAMP,
        ),
    )

    result = repo.retry_operator_work(post.id, f"entry-{state}")

    assert result.outcome is OperatorRetryOutcome.PENDING and result.changed is True
    assert result.row.state is LeaseState.PENDING
    assert result.row.attempt_count == 0 and result.row.last_error_code is None
    row = raw_work(db, post, f"entry-{state}")
    assert (row["work_version"], row["change_epoch"], row["state"]) == (8, 1, "pending")
    assert row["lease_token"] is None and row["lease_expires_at"] is None
    assert row["last_attempted_at"] is None
    status = status_row(db.engine, "post")
    assert (status["status"], status["completed_at"], status["change_epoch"]) == ("stale", None, 1)


def test_an_expired_lease_is_taken_over_without_keeping_its_owner(db, repo, post):
    insert_work(
        db.engine,
        **post_work(
            post,
            "entry-expired",
            "leased",
            work_version=2,
            lease_token="expired-owner",
            lease_expires_at="2000-01-01T00:00:00.000Z",
        ),
    )

    result = repo.retry_operator_work(post.id, "entry-expired")

    assert result.outcome is OperatorRetryOutcome.PENDING and result.changed is True
    row = raw_work(db, post, "entry-expired")
    assert (row["state"], row["work_version"]) == ("pending", 3)
    assert row["lease_token"] is None and row["lease_expires_at"] is None


def test_a_live_lease_is_not_stolen_and_its_token_not_exposed(db, repo, post):
    insert_work(
        db.engine,
        **post_work(
            post,
            "entry-live",
            "leased",
            work_version=3,
            lease_token="private-owner-token",
            lease_expires_at="2100-01-01T00:00:00.000Z",
        ),
    )
    before = snapshot(db.engine)

    result = repo.retry_operator_work(post.id, "entry-live")

    assert result == OperatorRetryResult(
        OperatorRetryOutcome.LEASE_ACTIVE, lease_expires_at="2100-01-01T00:00:00.000Z"
    )
    assert "private-owner-token" not in repr(result)
    assert snapshot(db.engine) == before


def test_work_is_created_for_an_absent_content_row(db, repo, post):
    result = repo.retry_operator_work(post.id, "already-deleted-entry")

    assert result.outcome is OperatorRetryOutcome.PENDING and result.changed is True
    assert (result.row.collection_id, result.row.collection_slug) == (post.id, "post")
    assert result.row.content_id == "already-deleted-entry"
    assert result.row.state is LeaseState.PENDING
    row = raw_work(db, post, "already-deleted-entry")
    assert (row["work_version"], row["change_epoch"], row["attempt_count"]) == (1, 1, 0)
    status = status_row(db.engine, "post")
    assert (status["status"], status["completed_at"], status["change_epoch"]) == ("stale", None, 1)


def test_newer_pending_work_created_mid_retry_is_not_overwritten(db, repo, post):
    insert_work(
        db.engine,
        **post_work(
            post,
            "entry-newer-work",
            "failed",
            work_version=7,
            attempt_count=5,
            last_error_code="MEDIA_USAGE_PROCESSING_FAILED",
        ),
    )
    after_epoch_bump(
        db,
        "retry_newer_work_wins",
        "UPDATE _emdash_media_usage_work SET state = 'pending', work_version = work_version + 1, "
        "attempt_count = 0, last_error_code = NULL WHERE collection_id = NEW.collection_id "
        "AND content_id = 'entry-newer-work'",
    )

    result = repo.retry_operator_work(post.id, "entry-newer-work")

    assert result.outcome is OperatorRetryOutcome.PENDING and result.changed is False
    assert result.row.state is LeaseState.PENDING and result.row.attempt_count == 0
    row = raw_work(db, post, "entry-newer-work")
    assert (row["work_version"], row["state"], row["change_epoch"]) == (8, "pending", 0)


def test_a_concurrent_removal_gives_conflict_and_keeps_coverage_stale(db, repo, post):
    insert_work(db.engine, **post_work(post, "entry-removed-race", "failed", work_version=4))
    after_epoch_bump(
        db,
        "retry_remove_work_race",
        "DELETE FROM _emdash_media_usage_work WHERE collection_id = NEW.collection_id "
        "AND content_id = 'entry-removed-race'",
    )

    result = repo.retry_operator_work(post.id, "entry-removed-race")

    assert result == OperatorRetryResult(OperatorRetryOutcome.CONFLICT)
    status = status_row(db.engine, "post")
    assert (status["status"], status["completed_at"], status["change_epoch"]) == ("stale", None, 1)
    assert raw_work(db, post, "entry-removed-race") is None


def test_a_newer_failed_version_mid_retry_is_not_reopened(db, repo, post):
    insert_work(db.engine, **post_work(post, "entry-refailed", "failed", work_version=2))
    after_epoch_bump(
        db,
        "retry_refailed_race",
        "UPDATE _emdash_media_usage_work SET work_version = work_version + 1 "
        "WHERE collection_id = NEW.collection_id AND content_id = 'entry-refailed'",
    )

    result = repo.retry_operator_work(post.id, "entry-refailed")

    assert result == OperatorRetryResult(OperatorRetryOutcome.CONFLICT)
    row = raw_work(db, post, "entry-refailed")
    assert (row["state"], row["work_version"], row["change_epoch"]) == ("failed", 3, 0)


@pytest.mark.parametrize("existing", [True, False], ids=["reopen", "create"])
def test_a_newer_coverage_epoch_mid_retry_wins(db, repo, post, existing):
    if existing:
        insert_work(db.engine, **post_work(post, "entry-epoch-race", "failed", work_version=2))
    # Another capture write lands right after the retry's own bump (epoch 1 -> 2).
    after_epoch_bump(
        db,
        "retry_epoch_race",
        "UPDATE _emdash_media_usage_index_status SET change_epoch = change_epoch + 1 "
        "WHERE collection_id = NEW.collection_id AND change_epoch = 1",
    )
    before = raw_work(db, post, "entry-epoch-race")

    result = repo.retry_operator_work(post.id, "entry-epoch-race")

    assert result == OperatorRetryResult(OperatorRetryOutcome.CONFLICT)
    assert raw_work(db, post, "entry-epoch-race") == before
    status = status_row(db.engine, "post")
    assert (status["status"], status["change_epoch"]) == ("stale", 2)


REMOVE_COLLECTION = "DELETE FROM _emdash_collections WHERE id = NEW.collection_id"


def test_nothing_is_reopened_after_the_collection_is_removed(db, repo, post):
    insert_work(db.engine, **post_work(post, "entry-obsolete", "failed", work_version=2))
    after_epoch_bump(db, "retry_collection_removed", REMOVE_COLLECTION)

    result = repo.retry_operator_work(post.id, "entry-obsolete")

    assert result == OperatorRetryResult(OperatorRetryOutcome.COLLECTION_NOT_FOUND)
    row = raw_work(db, post, "entry-obsolete")
    assert (row["state"], row["work_version"]) == ("failed", 2)


def test_nothing_is_created_after_the_collection_is_removed(db, repo, post):
    after_epoch_bump(db, "retry_collection_removed", REMOVE_COLLECTION)

    result = repo.retry_operator_work(post.id, "entry-missing-race")

    assert result == OperatorRetryResult(OperatorRetryOutcome.COLLECTION_NOT_FOUND)
    assert raw_work(db, post, "entry-missing-race") is None


def test_a_lease_taken_mid_retry_is_reported_as_active(db, repo, post):
    insert_work(db.engine, **post_work(post, "entry-claimed-race", "failed", work_version=2))
    after_epoch_bump(
        db,
        "retry_claimed_race",
        "UPDATE _emdash_media_usage_work SET state = 'leased', lease_token = 'racer', "
        "lease_expires_at = '2100-01-01T00:00:00.000Z' WHERE collection_id = NEW.collection_id "
        "AND content_id = 'entry-claimed-race'",
    )

    result = repo.retry_operator_work(post.id, "entry-claimed-race")

    assert result == OperatorRetryResult(
        OperatorRetryOutcome.LEASE_ACTIVE, lease_expires_at="2100-01-01T00:00:00.000Z"
    )
    assert raw_work(db, post, "entry-claimed-race")["lease_token"] == "racer"


def test_missing_and_inactive_identities_give_collection_not_found(db, repo, post):
    assert repo.retry_operator_work("missing-collection", "entry-1") == (
        OperatorRetryResult(OperatorRetryOutcome.COLLECTION_NOT_FOUND)
    )
    set_status(db.engine, "post", capture_state="installing")
    before = snapshot(db.engine)

    assert repo.retry_operator_work(post.id, "entry-1").outcome is (
        OperatorRetryOutcome.COLLECTION_NOT_FOUND
    )
    assert snapshot(db.engine) == before
    with db.engine.connect() as connection:
        assert connection.execute(select(schema.work.c.content_id)).all() == []


# ==================================================================================================
# The batch claim (claim_due_batch)
# ==================================================================================================


DUE_INDEX = "idx__emdash_media_usage_work_due"
LEASE_INDEX = "idx__emdash_media_usage_work_lease"
OPERATOR_INDEX = "idx__emdash_media_usage_work_operator"


def backlog(engine, size: int = 400) -> None:
    """Due work of two collections, with retries and expired leases among it."""
    rows = []
    for index in range(size):
        row = {
            "collection_id": f"collection-{index % 2}",
            "content_id": f"entry-{index:04d}",
            "next_attempt_at": f"2000-01-01T00:{index // 60 % 60:02d}:{index % 60:02d}.000Z",
        }
        if index % 10 == 1:
            row["state"] = "retry"
        elif index % 10 == 2:
            row.update(state="leased", lease_token="gone", lease_expires_at=row["next_attempt_at"])
        rows.append(row)
    insert_works(engine, rows)


def plan_lines(db, collection_id: str | None) -> list[str]:
    """The plan of the claim statement `claim_due_batch` sends (captured as sent)."""
    sent = []

    def capture(_connection, _cursor, statement, parameters, _context, _many):
        if statement.startswith("UPDATE _emdash_media_usage_work"):
            sent.append((statement, parameters))

    event.listen(db.engine, "before_cursor_execute", capture)
    try:
        WorkRepository(db.engine).claim_due_batch(50, 60, collection_id)
    finally:
        event.remove(db.engine, "before_cursor_execute", capture)
    ((statement, parameters),) = sent
    with db.engine.connect() as connection, _due_indexes_walked_in_order(connection):
        if db.is_postgres:
            rows = connection.exec_driver_sql("EXPLAIN " + statement, parameters)
            return [row[0] for row in rows]
        rows = connection.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)
        return [row[-1] for row in rows]


@pytest.mark.parametrize(
    ("collection_id", "pending_index"),
    [(None, DUE_INDEX), ("collection-1", OPERATOR_INDEX)],
    ids=["any", "one-collection"],
)
def test_each_due_state_is_walked_through_its_index(db, collection_id, pending_index):
    """One collection's pending rows come from the operator index (collection, state,
    updated_at), so other collections' backlogs are never walked; its few retrying and
    expired-lease rows from their due indexes."""
    backlog(db.engine)

    lines = plan_lines(db, collection_id)

    plan = "\n".join(lines)
    indexes = (("pending", pending_index), ("retry", DUE_INDEX), ("leased", LEASE_INDEX))
    for branch, index in indexes:
        reads = [line for line in lines if f"{branch}_work" in line]
        assert reads and all(index in line for line in reads), plan
    assert "Bitmap" not in plan, plan
    assert "Sort" not in "\n".join(line for line in lines if "pending_work" in line), plan


@pytest.mark.postgres_only("the planner setting is PostgreSQL's")
def test_a_claim_leaves_its_session_planner_setting_as_it_found_it(db):
    """The claim turns bitmap scans off for its own statement only (set, then reset, with no
    transaction block around it): the pooled connection's next statements plan as usual."""
    backlog(db.engine, size=20)

    assert len(WorkRepository(db.engine).claim_due_batch(10, 60)) == 10

    with db.engine.connect() as connection:
        assert connection.execute(text("SHOW enable_bitmapscan")).scalar_one() == "on"


def test_a_claim_takes_the_first_due_rows_of_its_collection_from_a_large_backlog(db):
    backlog(db.engine)
    repository = WorkRepository(db.engine)

    claimed = repository.claim_due_batch(50, 60, "collection-1")

    expected = sorted(
        (f"entry-{index:04d}" for index in range(400) if index % 2 == 1),
        key=lambda content_id: int(content_id[-4:]),
    )[:50]
    assert [record.content_id for record in claimed] == expected
    assert {record.collection_id for record in claimed} == {"collection-1"}


def test_a_claim_made_while_capture_is_active_claims_nothing_when_it_is_not(db, activated):
    """`db` has capture `expanded`; `activated` makes it active: the guarded claim reads the
    activation row in its own transaction."""
    backlog(db.engine, size=20)
    repository = WorkRepository(db.engine)
    with db.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE _emdash_media_usage_activation SET state = 'expanded'")

    assert repository.claim_due_batch(10, 60, while_capture_active=True) is None
    assert repository.find_due_work(100) and len(repository.find_due_work(100)) == 20

    with db.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE _emdash_media_usage_activation SET state = 'active'")
    claimed = repository.claim_due_batch(10, 60, while_capture_active=True)
    assert claimed is not None and len(claimed) == 10
