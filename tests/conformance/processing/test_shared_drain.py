"""A reconciliation's drain shares its collection's backlog with work runs.

Work runs may claim the collection's due items while it is under reconciliation (each batch
under its own leases); the drain processes what it can claim and, when the rest is leased by
another claimer, waits for the barrier instead of handing the run back for 30 s. Items that
nobody holds and that are not due (backing off) are left to the barrier, as before.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter

import pytest
from sqlalchemy import select

from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.loop import phases
from media_usage_orchestration.processing.loop.run_loop import Budget, PagingEnd, drain_due_work
from media_usage_orchestration.processing.reconciliation import walks
from media_usage_orchestration.processing.reconciliation.driver import run_to_completion
from media_usage_orchestration.processing.reconciliation.model import (
    ReconciliationOutcome,
    ScanOutcome,
)
from media_usage_orchestration.processing.reconciliation.steps import prepare_run, work_barrier
from media_usage_orchestration.processing.work.processor import WorkOutcome, process_claimed
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.reconciliation.records import WorkBarrierState
from media_usage_orchestration.store.work.repository import WorkRepository
from tests.support.reconciliation_steps import (
    claimed,
    coverage,
    entry_ids,
    untrusted_collection,
    work_rows,
)
from tests.support.states import backdate

BATCH = 5


def scanned(db, collection):
    """A run whose scan has enqueued every entry: the drain comes next."""
    prepared = prepare_run(db.engine, claimed(db.engine, collection))
    paging = walks.scan_pages(db.engine, prepared.claim, Budget(100))
    assert paging.last is ScanOutcome.EXHAUSTED
    return paging.lease


def held_by_another_run(db, collection, count: int):
    """A work run's batch: `count` of the collection's due items under its leases."""
    held = WorkRepository(db.engine).claim_due_batch(count, 60, collection.id)
    assert len(held) == count
    return held


def claimed_by_drain(paging) -> int:
    return sum(batch.counts.claimed for batch in paging.results)


def test_the_drain_waits_for_items_another_run_holds_and_never_takes_them(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(12))
    claim = scanned(db, collection)
    held = held_by_another_run(db, collection, 3)
    pauses = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 2:  # the other run finishes while the drain waits
            assert [process_claimed(db.engine, record) for record in held] == [
                WorkOutcome.COMPLETED
            ] * 3

    paging = walks.drain_collection_work(db.engine, claim, Budget(100), BATCH, pause=pause)

    assert paging.end is PagingEnd.DONE
    assert len(pauses) == 2 and all(0 < seconds < 1 for seconds in pauses)
    assert claimed_by_drain(paging) == 9
    assert work_rows(db.engine, collection) == {}
    assert work_barrier(db.engine, paging.lease).state is WorkBarrierState.EMPTY
    assert not verify_index(db.engine).has_drift


def test_the_drain_takes_over_leases_their_owner_let_lapse(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(7))
    claim = scanned(db, collection)
    held_by_another_run(db, collection, 2)
    backdate(db.engine, schema.work, "lease_expires_at", 1, collection_id=collection.id)

    paging = walks.drain_collection_work(db.engine, claim, Budget(100), BATCH, pause=refuse_to_wait)

    assert paging.end is PagingEnd.DONE
    assert claimed_by_drain(paging) == 7
    assert work_rows(db.engine, collection) == {}


def refuse_to_wait(seconds: float) -> None:
    raise AssertionError("nobody holds a live lease: the drain must not wait")


def test_work_backing_off_is_left_to_the_barrier_without_waiting(db):
    collection = untrusted_collection(db.engine, "articles", entry_ids(4))
    claim = scanned(db, collection)
    (record,) = held_by_another_run(db, collection, 1)
    assert WorkRepository(db.engine).retry_work(record.lease, 60, "MEDIA_USAGE_PROCESSING_FAILED")

    paging = walks.drain_collection_work(db.engine, claim, Budget(100), BATCH, pause=refuse_to_wait)

    assert paging.end is PagingEnd.DONE
    assert claimed_by_drain(paging) == 3
    assert list(work_rows(db.engine, collection)) == [record.content_id]
    assert work_barrier(db.engine, paging.lease).state is WorkBarrierState.PENDING


@pytest.mark.postgres_only(
    "row locks a claim skips exist only on PostgreSQL; SQLite serializes claims"
)
def test_the_drain_waits_for_a_claim_that_has_locked_due_items_and_not_committed(db):
    """On PostgreSQL a work run's claim locks its candidates (`FOR UPDATE SKIP LOCKED`)
    before its leases commit: meanwhile the drain's claim skips them and no live lease is
    visible, yet they are due. The drain waits rather than leave them to the barrier (which
    would hand the run back for 30 s)."""
    collection = untrusted_collection(db.engine, "articles", entry_ids(12))
    claim = scanned(db, collection)
    claimer = db.engine.connect()
    in_flight = claimer.begin()
    locked = claimer.execute(
        select(schema.work.c.content_id)
        .where(schema.work.c.collection_id == collection.id)
        .order_by(schema.work.c.content_id)
        .limit(3)
        .with_for_update()
    ).all()
    pauses = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        in_flight.rollback()  # the claim ends without taking them: they are due again

    try:
        paging = walks.drain_collection_work(db.engine, claim, Budget(100), BATCH, pause=pause)
    finally:
        claimer.close()

    assert len(locked) == 3 and len(pauses) == 1
    assert paging.end is PagingEnd.DONE
    assert claimed_by_drain(paging) == 12
    assert work_rows(db.engine, collection) == {}
    assert work_barrier(db.engine, paging.lease).state is WorkBarrierState.EMPTY


def test_a_work_run_and_the_reconciliation_drain_each_item_exactly_once(db, monkeypatch):
    """Real threads: the reconciliation (driver) and a work run drain one backlog at once.
    The work run takes its first batch the moment the drain begins, so both take part."""
    ids = entry_ids(40)
    collection = untrusted_collection(db.engine, "articles", ids)
    claims: list[tuple[str, str, str]] = []
    ledger_lock = threading.Lock()
    claim_due_batch = WorkRepository.claim_due_batch

    def recorded_claim(self, *args, **kwargs):
        records = claim_due_batch(self, *args, **kwargs)
        with ledger_lock:
            claims.extend(
                (threading.current_thread().name, record.content_id, record.lease_token)
                for record in records
            )
        return records

    monkeypatch.setattr(WorkRepository, "claim_due_batch", recorded_claim)
    first_batch: queue.Queue = queue.Queue()
    errors: list[BaseException] = []

    def work_run() -> None:
        try:
            for record in first_batch.get(timeout=60):
                process_claimed(db.engine, record)
            drain_due_work(db.engine, Budget(), BATCH)
        except BaseException as error:  # reported by the test thread
            errors.append(error)

    def drain_begins() -> None:
        """The work run's first claim, made as the drain begins (on its thread, before the
        drain's own first claim)."""
        if first_batch.empty():
            records = claim_due_batch(WorkRepository(db.engine), BATCH, 60, collection.id)
            with ledger_lock:
                claims.extend(("work-run", each.content_id, each.lease_token) for each in records)
            first_batch.put(records)

    runner = threading.Thread(target=work_run, name="work-run")
    runner.start()
    clock = phases.PhaseClock(on_enter={"drain": drain_begins})
    try:
        with phases.timing(clock):
            outcome = run_to_completion(db.engine, collection.id, work_batch_size=BATCH)
    finally:
        if first_batch.empty():
            first_batch.put([])
        runner.join(timeout=120)

    assert not errors
    assert outcome is ReconciliationOutcome.COMPLETED
    by_item = Counter(content_id for _, content_id, _ in claims)
    assert sorted(by_item) == ids and set(by_item.values()) == {1}
    assert len({token for _, _, token in claims}) == len(ids)
    by_claimer = Counter(name for name, _, _ in claims)
    assert by_claimer["work-run"] >= BATCH
    assert coverage(db.engine, collection)["status"] == "complete"
    report = verify_index(db.engine)
    assert not report.has_drift and report.pending_work_count == 0
