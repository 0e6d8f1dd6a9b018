"""Real concurrency: threads, each on its own pooled connection, race for the same work."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.leases import LeaseState
from media_usage_orchestration.store.work.records import WorkRecord
from media_usage_orchestration.store.work.repository import WorkRepository
from tests.support.factories import insert_work, insert_works
from tests.support.states import count
from tests.support.work import read_work

pytestmark = pytest.mark.slow

RACE_TIMEOUT_SECONDS = 120


def race(threads: int, attempt) -> list:
    """Run `attempt()` on `threads` threads released together by a barrier."""
    barrier = threading.Barrier(threads, timeout=RACE_TIMEOUT_SECONDS)

    def contend(_):
        barrier.wait()
        return attempt()

    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(contend, index) for index in range(threads)]
        return [future.result(timeout=RACE_TIMEOUT_SECONDS) for future in futures]


def test_eight_concurrent_claimers_of_one_due_row_have_one_winner(db):
    insert_work(db.engine)
    repo = WorkRepository(db.engine)

    results = race(8, lambda: repo.claim_work("collection-1", "entry-1", 1, 60))

    winners = [result for result in results if result is not None]
    assert len(winners) == 1 and results.count(None) == 7
    row = read_work(db.engine)
    assert row["state"] == LeaseState.LEASED and row["lease_token"] == winners[0].lease_token
    assert repo.complete_work(winners[0].lease) is True


def test_concurrent_batch_claimers_take_disjoint_rows_and_leave_none_behind(db):
    insert_works(
        db.engine,
        [
            {
                "content_id": f"entry-{index:03d}",
                "next_attempt_at": f"2000-01-01T00:{index // 60:02d}:{index % 60:02d}.000Z",
            }
            for index in range(200)
        ],
    )
    repo = WorkRepository(db.engine)

    def drain() -> list[WorkRecord]:
        claimed: list[WorkRecord] = []
        while batch := repo.claim_due_batch(7, 60):
            claimed.extend(batch)
            # Stands in for processing the batch; lets the other claimers at the write lock.
            time.sleep(0.005)
        return claimed

    per_thread = race(4, drain)

    keys = [work.content_id for claimed in per_thread for work in claimed]
    assert len(keys) == len(set(keys)) == 200
    assert sum(1 for claimed in per_thread if claimed) >= 2, "the claimers never overlapped"
    tokens = {work.lease_token for claimed in per_thread for work in claimed}
    assert len(tokens) == 200
    assert count(db.engine, schema.work, state="leased") == 200
    for claimed in per_thread:
        for work in claimed:
            assert (
                read_work(db.engine, content_id=work.content_id)["lease_token"] == work.lease_token
            )
