"""Each live collection's work queue (`store/reads/queue.py`): counts in the lease vocabulary's one
classification (the status verb's pending, failed and stuck work, the claim's due rows), the age
of the first due item in database time, the newest failures, counts that stop at their limit,
and a plan that reads index ranges only."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from media_usage_orchestration.store.deletion.repository import DeletionRepository
from media_usage_orchestration.store.reads.coverage import (
    health_status,
    read_collection_coverage,
    read_coverage_state,
)
from media_usage_orchestration.store.reads.queue import (
    COUNT_LIMIT,
    FAILED_ITEMS_SHOWN,
    _queue_statement,
    read_work_queues,
)
from media_usage_orchestration.store.work.repository import WorkRepository
from tests.support.factories import (
    ago,
    backing_off,
    expired,
    failed,
    from_now,
    insert_works,
    leased,
    of,
)
from tests.support.states import make_collection

CODE = "MEDIA_USAGE_PROCESSING_FAILED"


@pytest.fixture
def collections(db):
    return {slug: make_collection(db.engine, slug) for slug in ("alpha", "beta", "gamma")}


def _queues(db) -> dict:
    return {queue.collection_slug: queue for queue in read_work_queues(db.engine).queues}


def _every_state(collection) -> list[dict]:
    return [
        {"content_id": "due-1", "next_attempt_at": ago(30), "updated_at": ago(30)},
        {"content_id": "due-2", "next_attempt_at": ago(10), "updated_at": ago(10)},
        {"content_id": "ahead", "next_attempt_at": from_now(600)},
        {"content_id": "retry-due", "state": "retry", "next_attempt_at": ago(5)},
        {"content_id": "retry-ahead", **backing_off(seconds=120)},
        {"content_id": "held", **leased()},
        {"content_id": "stuck", **expired(seconds_ago=20)},
        {"content_id": "failed-1", **failed(CODE, attempts=5)},
        {"content_id": "failed-2", **failed("MEDIA_USAGE_RESOURCE_LIMIT", attempts=1)},
    ]


def test_every_work_row_is_counted_in_exactly_one_state_of_its_collection(db, collections):
    insert_works(db.engine, _every_state(collections["alpha"]), **of(collections["alpha"]))
    insert_works(db.engine, [{"content_id": "other", **leased()}], **of(collections["beta"]))

    queues = _queues(db)

    alpha = queues["alpha"]
    assert alpha.counts() == {"due": 4, "backing_off": 2, "leased": 1, "stuck": 1, "failed": 2}
    assert (alpha.healthy, alpha.inexact) == (False, ())
    assert queues["beta"].counts() == {
        "due": 0,
        "backing_off": 0,
        "leased": 1,
        "stuck": 0,
        "failed": 0,
    }
    assert queues["beta"].healthy
    assert queues["gamma"].counts() == dict.fromkeys(queues["gamma"].counts(), 0)


def test_the_counts_are_the_status_verbs_and_the_claims(db, collections):
    alpha = collections["alpha"]
    insert_works(db.engine, _every_state(alpha), **of(alpha))

    queue = _queues(db)["alpha"]
    coverage = read_collection_coverage(db.engine, alpha.id)
    claimable = WorkRepository(db.engine).find_due_work(100)

    assert queue.failed == coverage.failed_work
    assert queue.stuck == coverage.stuck_work
    assert queue.due + queue.backing_off + queue.leased == coverage.pending_work
    assert queue.due == len(claimable)


def test_the_coverage_state_a_work_run_records_on_is_the_coverage_rows(db, collections):
    """`read_coverage_state`: the status row's status as health sees it and whether work failed
    for good, as the full coverage read reports them; None for a collection the registry no
    longer has."""
    alpha, beta = collections["alpha"], collections["beta"]
    insert_works(db.engine, _every_state(alpha), **of(alpha))
    insert_works(
        db.engine,
        [{"content_id": "held", **leased()}, {"content_id": "later", **backing_off()}],
        **of(beta),
    )

    for collection in (alpha, beta):
        coverage = read_collection_coverage(db.engine, collection.id)
        status = health_status(coverage.status, coverage.reconciliation_required)
        expected = (status, coverage.failed_work > 0)
        assert read_coverage_state(db.engine, collection.id) == expected
    assert read_coverage_state(db.engine, alpha.id)[1] is True
    assert read_coverage_state(db.engine, beta.id)[1] is False
    assert read_coverage_state(db.engine, "no-such-collection") is None


def test_a_status_stale_only_for_queued_edits_reads_as_complete(db, collections):
    """An edit's capture turns `complete` into `stale` until its work is projected: health
    reads that as complete; a stale status that needs a reconciliation stays stale."""
    from sqlalchemy import update

    from media_usage_orchestration.store.core import schema

    alpha = collections["alpha"]
    row = schema.index_status.c.collection_id == alpha.id
    for required, expected in ((0, "complete"), (1, "stale")):
        with db.engine.begin() as connection:
            connection.execute(
                update(schema.index_status)
                .where(row)
                .values(status="stale", reconciliation_required=required)
            )
        assert read_coverage_state(db.engine, alpha.id) == (expected, False)
    assert health_status("complete", False) == "complete"
    assert health_status("partial", False) == "partial"
    assert health_status(None, None) is None


def test_the_lag_is_the_age_of_the_first_due_item_in_database_time(db, collections):
    alpha, beta = collections["alpha"], collections["beta"]
    insert_works(
        db.engine,
        [
            {"content_id": "old", "next_attempt_at": ago(120), "updated_at": ago(120)},
            {"content_id": "new", "next_attempt_at": ago(10), "updated_at": ago(10)},
        ],
        **of(alpha),
    )
    # A lease that lapsed 900 s ago is due since then: the next claim takes it first.
    insert_works(
        db.engine,
        [
            {"content_id": "waiting", "next_attempt_at": ago(60), "updated_at": ago(60)},
            {"content_id": "stuck", **expired(seconds_ago=900)},
        ],
        **of(beta),
    )

    reading = read_work_queues(db.engine)
    queues = {queue.collection_slug: queue for queue in reading.queues}

    # Database time moved on only by the statements since the rows were written.
    assert 120 <= queues["alpha"].lag_seconds < 180
    assert 900 <= queues["beta"].lag_seconds < 960
    assert queues["alpha"].first_due_at < reading.read_at
    assert (queues["gamma"].first_due_at, queues["gamma"].lag_seconds) == (None, 0.0)


def test_work_backing_off_or_held_is_not_due_and_has_no_lag(db, collections):
    insert_works(
        db.engine,
        [{"content_id": "retry", **backing_off()}, {"content_id": "held", **leased()}],
        **of(collections["alpha"]),
    )

    queue = _queues(db)["alpha"]

    assert (queue.due, queue.backing_off, queue.leased) == (0, 1, 1)
    assert (queue.first_due_at, queue.lag_seconds) == (None, 0.0)


def test_the_newest_failures_are_listed_as_work_list_lists_them(db, collections):
    alpha = collections["alpha"]
    rows = [
        {"content_id": f"entry-{index:02d}", "updated_at": ago(100 - index), **failed(CODE)}
        for index in range(FAILED_ITEMS_SHOWN + 2)
    ]
    insert_works(db.engine, rows, **of(alpha))

    queue = _queues(db)["alpha"]
    listed = WorkRepository(db.engine).find_operator_page(
        "alpha", state="failed", limit=FAILED_ITEMS_SHOWN
    )

    assert queue.failed == FAILED_ITEMS_SHOWN + 2
    assert queue.failed_items == listed.items
    assert [item.content_id for item in queue.failed_items][:2] == ["entry-21", "entry-20"]
    assert {item.last_error_code for item in queue.failed_items} == {CODE}


def test_deleted_and_tombstoned_collections_have_no_queue(db, collections):
    gamma = collections["gamma"]
    DeletionRepository(db.engine).create_tombstone(gamma.id, "gamma", True)
    insert_works(db.engine, [{"content_id": "x"}], **of(gamma))
    insert_works(db.engine, [{"content_id": "x"}], collection_id="gone", collection_slug="gone")

    assert sorted(_queues(db)) == ["alpha", "beta"]


def test_a_count_stops_at_its_limit_and_says_which_counts_are_not_exact(db, collections):
    alpha = collections["alpha"]
    rows = [{"content_id": f"entry-{index:05d}"} for index in range(COUNT_LIMIT + 5)]
    insert_works(db.engine, [*rows, {"content_id": "z-held", **leased()}], **of(alpha))

    queue = _queues(db)["alpha"]

    assert queue.due == COUNT_LIMIT + 1
    assert queue.inexact == ("due",)
    assert (queue.leased, queue.backing_off) == (1, 0)


def test_bad_limits_are_refused(db):
    for limit in (0, 101, True, "5"):
        with pytest.raises(ValueError, match="Queue collection limit"):
            read_work_queues(db.engine, limit)


@pytest.mark.sqlite_only("EXPLAIN QUERY PLAN is SQLite's")
def test_the_queue_is_read_through_index_ranges_only(db):
    compiled = _queue_statement(100).compile(db.engine, compile_kwargs={"literal_binds": True})
    with db.engine.connect() as connection:
        plan = [row[3] for row in connection.execute(text(f"EXPLAIN QUERY PLAN {compiled}"))]

    work_steps = [step for step in plan if "_emdash_media_usage_work " in f"{step} "]
    assert work_steps and all(step.startswith("SEARCH ") for step in work_steps), plan
    counts = [step for step in work_steps if "COVERING INDEX" in step]
    assert len(counts) == 7, plan  # every count reads its index alone
