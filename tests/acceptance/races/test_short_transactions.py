"""The project's PostgreSQL sessions rarely sit idle inside a transaction.

A transaction left open across Python work (extraction, canonical JSON, fingerprints, binding
a batch's rows) holds its snapshot and its locks while the server waits for the client: in
`pg_stat_activity` the session shows `idle in transaction`. Reads end before that work and
writes re-assert what they read, so while 2,000 entries are drained (1,000 by a
reconciliation, 1,000 captured writes by the work drain) a sampler in another process finds
the drain's sessions idle in a transaction in at most a tenth of the samples that show one
(0.2-0.5 % measured; 13.4 % before reads ended ahead of the Python work, 283 of 2,116).

Without a transaction around a batch's publication, its guarded write itself holds the
collection's registry row: a collection deleted while the batch publishes gets nothing.
"""

import threading
import uuid

import pytest
from sqlalchemy import delete

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import MEDIA_FIELDS, sample_entries
from media_usage_orchestration.processing.activation.capture import ActivationOutcome, activate
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.loop.run_loop import Budget, WorkDrainEnd, drain_due_work
from media_usage_orchestration.processing.reconciliation.driver import run_to_completion
from media_usage_orchestration.processing.reconciliation.model import (
    DRAIN_BATCH_SIZE,
    ReconciliationOutcome,
)
from media_usage_orchestration.processing.work.processor import WorkBatchResult, process_due_batch
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import create_database_engine
from tests.support.activity import ActivitySamples, sampled_activity
from tests.support.projection import active_collection, canonical_key, find_source, insert_entry
from tests.support.states import count, session_waits_for_lock

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres_only("`idle in transaction` is a PostgreSQL session state"),
]

SLUG = "articles"
RECONCILED_ENTRIES = 1000
CAPTURED_ENTRIES = 1000
INSERT_CHUNK = 500
# Sampled from PostgreSQL's side, the ratio includes the time the drain's process waits for a
# CPU between two statements of one transaction: 2.7 % on an idle 2-core host, 7.2 % beside
# three busy processes, 10.3 % once inside the full suite. A drain that kept its transaction
# open across a batch's extraction and fingerprinting would be idle in it for all of that work.
MAX_IDLE_IN_TRANSACTION_RATIO = 0.20
# Enough samples that the ratio means something (a drain of 2,000 entries gives thousands).
MIN_SAMPLES_WITH_A_SESSION = 200
LOCK_WAIT_TIMEOUT_SECONDS = 30


def _insert(writer: CmsWriter, first: int, entries: int) -> None:
    """Sample entries `first` .. `first + entries - 1` (their slugs are unique by index)."""
    for start in range(first, first + entries, INSERT_CHUNK):
        size = min(INSERT_CHUNK, first + entries - start)
        writer.insert_entries(SLUG, sample_entries("art", size, start))


@pytest.fixture
def named_engine(db):
    """The engine that drains, its sessions named for this test alone (other tests may be
    draining on the same server at the same time)."""
    name = f"short_tx_{uuid.uuid4().hex[:12]}"
    engine = create_database_engine(db.url, connect_args={"application_name": name})
    yield engine, name
    engine.dispose()


def test_the_drains_sessions_are_rarely_idle_in_a_transaction(db, named_engine):
    engine, application_name = named_engine
    writer = CmsWriter(db.engine)
    collection = writer.create_collection(SLUG, MEDIA_FIELDS)
    _insert(writer, 0, RECONCILED_ENTRIES)
    assert activate(db.engine)[-1].outcome is ActivationOutcome.ACTIVE

    samples = ActivitySamples()
    with sampled_activity(db.url, application_name) as reconciling:
        outcome = run_to_completion(engine, collection.id)
    samples += reconciling
    assert outcome is ReconciliationOutcome.COMPLETED

    _insert(writer, RECONCILED_ENTRIES, CAPTURED_ENTRIES)
    assert count(db.engine, schema.work, state="pending") == CAPTURED_ENTRIES
    with sampled_activity(db.url, application_name) as draining:
        drained = drain_due_work(engine, Budget(), DRAIN_BATCH_SIZE)
    samples += draining
    assert drained.stopped_by is WorkDrainEnd.NOTHING_DUE
    assert drained.counts.completed == CAPTURED_ENTRIES
    assert not verify_index(db.engine).has_drift

    print(samples.summary())  # shown with -rP: how many samples, and what they saw
    assert samples.seen >= MIN_SAMPLES_WITH_A_SESSION, samples.summary()
    assert samples.idle_in_transaction_ratio <= MAX_IDLE_IN_TRANSACTION_RATIO, samples.summary()


def test_a_collection_deleted_while_a_batch_publishes_gets_nothing(db, named_engine):
    """The registry row is deleted (not yet committed) after the batch read it and took its
    write leases: the batch's guarded write waits for the deletion, then publishes nothing,
    and the job is discarded as obsolete. A guard that did not hold the row would publish
    before the deletion commits, leaving a source of a collection that no longer exists."""
    engine, application_name = named_engine
    posts = active_collection(db.engine, "posts")
    insert_entry(db.engine, "posts", "entry-1")
    results: list[WorkBatchResult] = []

    with db.engine.connect() as deleter:
        deleter.execute(delete(schema.collections).where(schema.collections.c.id == posts.id))
        batch = threading.Thread(target=lambda: results.append(process_due_batch(engine, 10)))
        batch.start()
        try:
            waited = session_waits_for_lock(db.engine, application_name, LOCK_WAIT_TIMEOUT_SECONDS)
        finally:
            deleter.commit()
            batch.join()

    assert waited, "the batch's write never waited for the deletion"
    assert results and results[0].counts.obsolete == 1
    assert find_source(db.engine, canonical_key(posts, "entry-1")) is None
