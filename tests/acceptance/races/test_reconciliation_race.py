"""Real concurrency on one coordinator row: the guarded statements alone pick one winner."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from tests.support.reconciliations import reconciliation_row
from tests.support.states import count, make_collection, set_activation

pytestmark = pytest.mark.slow

THREADS = 8


def race(action: Callable[[], object]) -> list[object]:
    """Run `action` on THREADS threads released together; re-raise the first error."""
    barrier = threading.Barrier(THREADS)
    results: list[object] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def contender() -> None:
        try:
            barrier.wait(timeout=30)
            outcome = action()
        except BaseException as error:  # surfaced below, with the thread's own traceback
            with lock:
                errors.append(error)
            return
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=contender) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if errors:
        raise errors[0]
    assert len(results) == THREADS
    return results


def test_exactly_one_thread_claims_a_due_reconciliation(db):
    collection = make_collection(db.engine, "articles")
    set_activation(db.engine)
    repository = ReconciliationRepository(db.engine)
    assert repository.seed_next_candidate()
    run_token = reconciliation_row(db.engine, collection.id)["run_token"]

    claims = race(lambda: repository.claim(collection.id, run_token, 60))

    winners = [claim for claim in claims if claim is not None]
    assert len(winners) == 1
    row = reconciliation_row(db.engine, collection.id)
    assert (row["state"], row["lease_token"]) == ("leased", winners[0].lease_token)


def test_exactly_one_thread_seeds_a_collection(db):
    make_collection(db.engine, "articles")
    set_activation(db.engine)
    repository = ReconciliationRepository(db.engine)

    seeded = race(repository.seed_next_candidate)

    assert seeded.count(True) == 1
    assert count(db.engine, schema.reconciliations) == 1
