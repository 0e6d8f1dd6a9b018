"""Faults during a collection deletion: a deletion run killed with SIGKILL in the middle of
`delete_sources` is resumed by a later run once its lease has expired (moved by backdating,
never by sleeping), and content writes racing the fence either commit before it (and refuse a
non-forced deletion with nothing changed) or are rejected by the capture trigger after it. In
every case nothing of the deleted collection is left behind."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dagster as dg
import pytest
from sqlalchemy import event, exc, insert, select
from sqlalchemy.engine import Engine

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.ops.deletion import fence
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.sensors.deletion import media_usage_collection_deletion_sensor
from media_usage_orchestration.sensors.run_health import media_usage_run_health_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.capture_triggers import CAPTURE_INACTIVE_MESSAGE
from media_usage_orchestration.store.core.engine import read_transaction
from media_usage_orchestration.store.deletion.records import DeletionPhase
from tests.support.deletion_runs import (
    COLLECTION_ID_TAG,
    deletion_run_config,
    execute_requested,
    failure_of,
    leftovers,
    run_deletion_job,
    run_request_job,
    seconds_between,
    source_keys_of,
    step_outcomes,
    tick,
)
from tests.support.deletions import add_source, claimed, expire_lease, ids
from tests.support.ops import invoke
from tests.support.sensor_loop import drain, evaluate, resources
from tests.support.states import (
    IMAGE_ONLY,
    all_rows,
    backdate,
    count,
    db_now,
    one,
    snapshot,
    status_row,
    waiter_on_table_lock,
)

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[3]
WAIT_SECONDS = 30
SOURCES = 4
OCCURRENCES_PER_SOURCE = 120  # 3 batches per source: 50, 50, then 20 and the source itself
HOLD_BATCH = 3  # the third batch: the last one of the first source


@pytest.fixture
def instance():
    # Jobs here run in worker threads. Compute-log capture redirects the process's stdout and
    # stderr through a `tail` subprocess, which is neither thread-safe nor needed here: under
    # load its clean-up alone exceeded the tests' waits.
    no_compute_logs = {
        "compute_logs": {
            "module": "dagster._core.storage.noop_compute_log_manager",
            "class": "NoOpComputeLogManager",
        }
    }
    with dg.instance_for_test(overrides=no_compute_logs) as instance:
        yield instance


def content_row(entry_id, title="racing"):
    return {"id": entry_id, "slug": entry_id, "locale": "en", "title": title}


CONTENT = schema.content_table("posts", [schema.ContentField(s.slug, "TEXT") for s in IMAGE_ONLY])


# --- SIGKILL in the middle of delete_sources ----------------------------------------------------


class Worker:
    """The victim process and its stdout lines."""

    def __init__(self, url: str, collection_id: str, log_path: Path) -> None:
        self.log_path = log_path
        self.log = log_path.open("w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.deletion_worker",
                url,
                collection_id,
                str(HOLD_BATCH),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=self.log,  # Dagster logs a lot; a full pipe would stall the worker
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put("<eof>")

    def wait_for(self, expected: str) -> None:
        while True:
            try:
                line = self.lines.get(timeout=WAIT_SECONDS)
            except queue.Empty:
                raise AssertionError(f"the worker never printed {expected!r}") from None
            if line == expected:
                return
            if line == "<eof>":
                raise AssertionError(f"the worker exited early:\n{self.log_path.read_text()}")

    def kill(self) -> int:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        try:
            return self.process.wait(timeout=WAIT_SECONDS)
        finally:
            self.log.close()


def wait_for_committed_progress(db, collection_id: str, cursor: str) -> dict:
    """Poll (reads only) until the tombstone shows the committed checkpoint `cursor`."""
    tombstones = schema.collection_deletions
    statement = select(tombstones).where(tombstones.c.collection_id == collection_id)
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        # A read transaction: on SQLite it must not queue behind the worker's write lock.
        with read_transaction(db.engine) as connection:
            row = connection.execute(statement).mappings().first()
        if row and row["phase"] == "sources" and row["occurrence_cursor"] == cursor:
            return dict(row)
        time.sleep(0.05)
    raise AssertionError(f"no committed progress to {cursor!r}: {row}")


def test_a_run_killed_mid_delete_sources_is_resumed_after_its_lease_expires(
    activated, instance, tmp_path
):
    db = activated
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    cms.insert_entries("posts", [content_row(f"post-{i}") for i in range(3)])
    for index in range(SOURCES):
        add_source(
            db.engine,
            f"posts-source-{index}",
            collection_id=posts.id,
            collection_slug="posts",
            occurrence_ids=ids(f"usage-{index}", OCCURRENCES_PER_SOURCE),
        )
    keys = source_keys_of(db.engine, posts.id)
    assert run_request_job(db, instance, "posts", force=True).success
    total = SOURCES * OCCURRENCES_PER_SOURCE

    worker = Worker(db.url, posts.id, tmp_path / "worker.log")
    try:
        worker.wait_for("started")
        # two batches of source 0 committed; the third deleted its 20 rows but did not commit
        wait_for_committed_progress(db, posts.id, "usage-0-099")
        worker.wait_for(f"holding {HOLD_BATCH}")
    finally:
        returncode = worker.kill()
    assert returncode == -signal.SIGKILL

    row = one(db.engine, schema.collection_deletions, collection_id=posts.id)
    assert (row["state"], row["phase"]) == ("leased", "sources")
    assert (row["source_key"], row["occurrence_cursor"]) == ("posts-source-0", "usage-0-099")
    assert seconds_between(db_now(db.engine), row["lease_expires_at"]) > 200  # still live
    assert count(db.engine, schema.occurrences, source_key="posts-source-0") == 20  # rolled back
    assert sum(count(db.engine, schema.occurrences, source_key=k) for k in keys) == total - 100
    assert count(db.engine, schema.work, collection_id=posts.id) == 0

    # While the dead run's lease is live nobody takes over: a run started anyway finds the
    # tombstone not due and changes nothing.
    before = snapshot(db.engine)
    idle = run_deletion_job(db, instance, deletion_run_config(posts.id))
    assert step_outcomes(idle) == {"claim_deletion": "not_due"}
    assert snapshot(db.engine) == before
    assert tick(db, instance).run_requests == []

    expire_lease(db.engine, posts.id)
    # The killed run is still STARTED in Dagster's run storage: it holds the collection back
    # (one run per collection and workflow) until the run-health sensor finds its run lease
    # expired (here backdated) and fails it; then the sensor asks for its successor.
    [killed] = instance.get_runs(
        filters=dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.STARTED], tags={COLLECTION_ID_TAG: posts.id}
        )
    )
    assert tick(db, instance).run_requests == []
    assert backdate(db.engine, schema.run_leases, "lease_expires_at", 1, run_id=killed.run_id)
    evaluate(media_usage_run_health_sensor, instance, resources(db))
    assert instance.get_run_by_id(killed.run_id).status is dg.DagsterRunStatus.FAILURE
    [request] = tick(db, instance).run_requests
    resumed = execute_requested(db, instance, request)

    assert resumed.success
    assert step_outcomes(resumed) == {
        "claim_deletion": "claimed",
        "fence": "already_past",
        "remove_registry": "already_past",
        "drop_table": "already_past",
        "delete_work": "already_past",
        "delete_sources": "advanced",
        "delete_status": "advanced",
        "finalize_deletion": "finalized",
    }
    assert leftovers(db.engine, posts.id, "posts", keys) == {}
    assert tick(db, instance).run_requests == []


# --- content writes racing the fence ------------------------------------------------------------


def _drain(db, instance):
    sensor = media_usage_collection_deletion_sensor
    return drain(instance, resources(db), [sensor], max_rounds=5).of(sensor)


def test_after_the_fence_commits_a_content_write_is_rejected_by_the_capture_trigger(
    activated, instance
):
    db = activated
    cms = CmsWriter(db.engine)
    posts = cms.create_collection("posts", IMAGE_ONLY)
    lease = claimed(db.engine, posts, DeletionPhase.FENCE).lease
    assert invoke(fence, db, lease).outcome == "advanced"
    status_before = status_row(db.engine, "posts")
    before = snapshot(db.engine, [*schema.EMDASH_TABLES, CONTENT])

    with pytest.raises(exc.DBAPIError, match=CAPTURE_INACTIVE_MESSAGE):
        cms.insert_entry("posts", content_row("late-entry"))

    assert snapshot(db.engine, [*schema.EMDASH_TABLES, CONTENT]) == before
    assert status_row(db.engine, "posts") == status_before
    # the fence holds the lease it renewed; once it lapses the background takes over
    expire_lease(db.engine, posts.id)
    assert len(_drain(db, instance)) == 1
    assert leftovers(db.engine, posts.id, "posts") == {}
    assert count(db.engine, schema.work, content_id="late-entry") == 0
    assert verify_index(db.engine).differences == ()


@pytest.mark.postgres_only("two writers interleave only on PostgreSQL; SQLite serializes them")
def test_an_insert_committed_while_the_fence_waits_refuses_a_non_forced_deletion(
    activated, instance
):
    db = activated
    posts = CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)
    before = snapshot(db.engine, [*schema.EMDASH_TABLES, CONTENT])

    with ThreadPoolExecutor(1) as pool, db.engine.connect() as writer:
        writer.execute(insert(CONTENT).values(**content_row("racing-entry")))
        # The request's own has-content check cannot see the uncommitted row; the fence's
        # table lock waits for the writer and then sees it.
        requesting = pool.submit(run_request_job, db, instance, "posts")
        assert waiter_on_table_lock(db.engine, "ec_posts", WAIT_SECONDS), (
            "the fence did not wait for the open insert"
        )
        assert not requesting.done()
        writer.commit()
        result = requesting.result(timeout=WAIT_SECONDS)

    assert not result.success
    refusal = failure_of(result, "request_deletion")
    assert "'posts' still has entries; nothing was changed" in refusal.description
    assert refusal.metadata["outcome"].value == "has_content"
    after = snapshot(db.engine, [*schema.EMDASH_TABLES, CONTENT])
    changed = {name for name in after if after[name] != before[name]}
    # only the writer's own effects: its row, its work item, the epoch bump
    assert changed == {CONTENT.name, schema.work.name, schema.index_status.name}
    assert [row["id"] for row in all_rows(db.engine, CONTENT)] == ["racing-entry"]
    assert [row["content_id"] for row in all_rows(db.engine, schema.work)] == ["racing-entry"]
    status_before = dict(
        zip(schema.index_status.c.keys(), before[schema.index_status.name][0], strict=True)
    )
    status_after = status_row(db.engine, "posts")
    assert status_after["capture_state"] == "active"
    assert status_after["change_epoch"] == status_before["change_epoch"] + 1
    assert count(db.engine, schema.collection_deletions) == 0
    assert count(db.engine, schema.collections, id=posts.id) == 1


@pytest.mark.postgres_only("two writers interleave only on PostgreSQL; SQLite serializes them")
def test_an_insert_waiting_on_the_fence_is_rejected_once_it_commits(activated, instance):
    db = activated
    posts = CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)
    locked, proceed = threading.Event(), threading.Event()

    def hold_after_lock(_conn, _cursor, statement, *_args):
        if statement.startswith("LOCK TABLE"):
            locked.set()
            proceed.wait(WAIT_SECONDS)

    def insert_entry():
        try:
            with db.engine.begin() as connection:
                connection.execute(insert(CONTENT).values(**content_row("racing-entry")))
        except exc.DBAPIError as error:
            return error
        return None

    event.listen(Engine, "after_cursor_execute", hold_after_lock)
    try:
        with ThreadPoolExecutor(2) as pool:
            requesting = pool.submit(run_request_job, db, instance, "posts")
            assert locked.wait(WAIT_SECONDS), "the fence never locked the content table"
            inserting = pool.submit(insert_entry)
            assert waiter_on_table_lock(db.engine, "ec_posts", WAIT_SECONDS), (
                "the insert did not wait for the fence"
            )
            assert not inserting.done()
            proceed.set()
            rejection = inserting.result(timeout=WAIT_SECONDS)
            result = requesting.result(timeout=WAIT_SECONDS)
    finally:
        proceed.set()
        event.remove(Engine, "after_cursor_execute", hold_after_lock)

    assert rejection is not None and CAPTURE_INACTIVE_MESSAGE in str(rejection)
    assert result.success
    tombstone = one(db.engine, schema.collection_deletions, collection_id=posts.id)
    assert (tombstone["phase"], tombstone["state"]) == ("work", "pending")
    assert count(db.engine, schema.work, content_id="racing-entry") == 0

    runs = _drain(db, instance)

    assert [step_outcomes(run)["finalize_deletion"] for run in runs] == ["finalized"]
    assert leftovers(db.engine, posts.id, "posts") == {}
    assert verify_index(db.engine).differences == ()
