"""The project beside EmDash's own scheduled lane, on one PostgreSQL database.

At the same time: EmDash's lane (`run_scheduled_lane`, one class per call) loops in a process of
its own; the project's sensors request real Dagster runs (work, reconciliation, deletion,
projection GC) executed in two threads, as the daemon would launch them; a CMS writer edits two
collections continuously; a third collection is deleted mid-run through EmDash's request path
(`SchemaRegistry.deleteCollection`: tombstone and front phases), its back phases left to whoever
claims the tombstone. Before all that, a work run process is SIGKILLed holding the leases of
its first batch; nobody may take them until they expire (moved by backdating). Once the writer
stops, time is let pass without waiting: backoffs, deferrals and leases left behind by their
holders are backdated, never a lease its holder still renews.

What interleaves varies from run to run; the end state does not. Once the writer stops and
both lanes have drained: the index equals the content (`verify`, fingerprints included), no
work, coordinator or tombstone row is left, no lease is held, the deleted collection is gone
to its last row, and EmDash's lane took its turns strictly in rotation.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest
from sqlalchemy import func, select, update

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import (
    MEDIA_FIELDS,
    draft_revision_data,
    sample_entries,
    sample_entry,
)
from media_usage_orchestration.local import in_process_lane
from media_usage_orchestration.processing.activation.capture import ActivationOutcome, activate
from media_usage_orchestration.processing.deletion.processor import (
    RequestOutcome,
    request_collection_deletion,
)
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.reconciliation.driver import run_to_completion
from media_usage_orchestration.processing.reconciliation.model import ReconciliationOutcome
from media_usage_orchestration.sensors.deletion import media_usage_collection_deletion_sensor
from media_usage_orchestration.sensors.projection_gc import media_usage_projection_gc_sensor
from media_usage_orchestration.sensors.reconciliation import media_usage_reconciliation_sensor
from media_usage_orchestration.sensors.work import media_usage_work_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.clock import now
from media_usage_orchestration.store.core.engine import create_database_engine
from media_usage_orchestration.values.errors import DeletionConflictError
from tests.support.deletion_runs import leftovers, source_keys_of
from tests.support.emdash_lane_loop import lane_loop, read_ledger
from tests.support.factories import ago, from_now
from tests.support.reconciliation_runs import assert_coverage_complete
from tests.support.sensor_loop import resources_for
from tests.support.states import all_rows, count, one

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres_only(
        "SQLite has one writer; two lanes, Dagster runs and a CMS writer at once is PostgreSQL's"
    ),
]

REPO_ROOT = Path(__file__).resolve().parents[3]
KEPT = ("articles", "pages")
DOOMED = "doomed"
ENTRIES = 20
KILLED_BATCH = 5
QUIET = "notes"
# A work run drains while work keeps coming: it gets a thread of its own.
WORK_SENSORS = (media_usage_work_sensor,)
OTHER_SENSORS = (
    media_usage_collection_deletion_sensor,
    media_usage_reconciliation_sensor,
    media_usage_projection_gc_sensor,
)
# How much must have happened before the deletion, and before the writer stops.
BEFORE_DELETION = {"writes": 6, "runs": 2, "lane_events": 0}
IN_ALL = {"writes": 16, "runs": 4, "lane_events": 30}
# The dead run's leases outlive every phase below (however loaded the machine), so that
# "nobody took them" holds until the test lets them expire.
DEAD_LEASE_SECONDS = 900
POLL_SECONDS = 0.1
STALE_LEASE_SECONDS = 5  # steps renew their leases between pages, far more often
LEASED_TABLES = (schema.work, schema.reconciliations, schema.collection_deletions)
PHASE_SECONDS = 120  # a bound for a loaded machine; a phase takes seconds on an idle one
JOIN_SECONDS = 60


# --- the participants ---------------------------------------------------------------------------


class Participant(threading.Thread):
    """A thread that runs `loop` until stopped; an error ends it and is kept for the test."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True, name=type(self).__name__)
        self.url = url
        self.stop_requested = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.loop()
        except BaseException as error:  # surfaced by the test, with the thread's traceback
            self.error = error

    def stop(self) -> None:
        self.stop_requested.set()
        if self.ident is None:  # never started
            return
        self.join(JOIN_SECONDS)
        assert not self.is_alive(), f"{self.name} did not stop"

    def check(self) -> None:
        if self.error is not None:
            raise self.error


class Writer(Participant):
    """CMS edits of the kept collections, one transaction each, in a fixed cycle: a new hero
    image on an original entry, a new entry, a draft revision of an original entry, then a
    trash or permanent delete of the entry inserted two steps before."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.writes = 0

    def loop(self) -> None:
        engine = create_database_engine(self.url)
        try:
            writer = CmsWriter(engine)
            while not self.stop_requested.is_set():
                edit(writer, self.writes)
                self.writes += 1
                self.stop_requested.wait(0.005)
        finally:
            engine.dispose()


def edit(writer: CmsWriter, step: int) -> None:
    slug = KEPT[step % len(KEPT)]
    prefix, n = slug[:3], step // len(KEPT)
    original = sample_entry(prefix, n % ENTRIES)
    kind = n % 4
    if kind == 0:
        image = {"id": f"{slug}-edit-{n}", "provider": "local", "mimeType": "image/png"}
        writer.update_entry(slug, original["id"], {"hero": image})
    elif kind == 1:
        writer.insert_entry(slug, sample_entry(prefix, ENTRIES + n))
    elif kind == 2:
        writer.save_draft(slug, original["id"], draft_revision_data(original))
    else:
        inserted = sample_entry(prefix, ENTRIES + n - 2)["id"]
        (writer.trash_entry if n % 8 == 3 else writer.delete_entry)(slug, inserted)


class DagsterRuns(Participant):
    """The daemon's part for some sensors, in one thread: tick them, execute each run they
    request (a real run of the project's job, with the request's config, partition, tags and
    run key). The daemon runs the runs of different jobs side by side: one thread per group."""

    def __init__(self, url: str, sensors: tuple[dg.SensorDefinition, ...]) -> None:
        super().__init__(url)
        self.sensors = sensors
        self.runs: list[in_process_lane.LaneRun] = []

    def loop(self) -> None:
        resources = resources_for(self.url)
        with dg.DagsterInstance.ephemeral() as instance:
            while not self.stop_requested.is_set():
                if not self.round(instance, resources):
                    self.stop_requested.wait(POLL_SECONDS)

    def round(self, instance: dg.DagsterInstance, resources) -> bool:
        requested = False
        for sensor in self.sensors:
            data = in_process_lane.evaluate_sensor(sensor, instance, resources)
            in_process_lane.add_requested_partitions(instance, data)
            for request in data.run_requests or []:
                run = in_process_lane.execute_request(instance, resources, sensor.job_name, request)
                self.runs.append(run)
                requested = True
        return requested


class EmDashLane:
    """EmDash's lane in its own process (tests/support/emdash_lane_loop.py)."""

    def __init__(self, url: str, ledger: Path) -> None:
        context = multiprocessing.get_context("spawn")
        self.ledger = ledger
        self.stop_requested = context.Event()
        self.calls = context.Value("i", 0)
        self.process = context.Process(
            target=lane_loop,
            args=(url, self.stop_requested, self.calls, str(ledger)),
            name="emdash-lane",
        )

    def start(self) -> None:
        self.process.start()

    def stop(self) -> None:
        self.stop_requested.set()
        self.process.join(JOIN_SECONDS)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(JOIN_SECONDS)

    def entries(self) -> list[dict]:
        return read_ledger(self.ledger)

    def check(self) -> None:
        assert [entry["error"] for entry in self.entries() if "error" in entry] == []
        assert self.process.exitcode in (None, 0)


def kill_after_first_claim(url: str, log_path: Path) -> list[str]:
    """A work run in its own process, SIGKILLed once its first batch claim has committed; the
    lease tokens of the batch it died holding."""
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.work_worker", url, str(KILLED_BATCH)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=log,  # Dagster logs a lot; a full pipe would stall the worker
            text=True,
        )
        timer = threading.Timer(JOIN_SECONDS, process.kill)
        timer.start()
        try:
            line = process.stdout.readline()
            if line.startswith("claimed "):
                os.kill(process.pid, signal.SIGKILL)
        finally:
            timer.cancel()
            returncode = process.wait(JOIN_SECONDS)
            process.stdout.close()
    assert line.startswith("claimed "), (line, log_path.read_text()[-3000:])
    assert returncode == -signal.SIGKILL
    return line.split()[1:]


# --- waiting on the database (reads, polled) ---------------------------------------------------


def wait_until(progress, goal: dict[str, int], participants) -> None:
    """Poll until every count `progress()` reports has reached its `goal`; a participant that
    failed meanwhile fails the test at once."""
    deadline = time.monotonic() + PHASE_SECONDS
    while _short_of(reached := progress(), goal):
        for participant in participants:
            participant.check()
        assert time.monotonic() < deadline, f"only {reached} of {goal}"
        time.sleep(POLL_SECONDS)


def _short_of(reached: dict[str, int], goal: dict[str, int]) -> bool:
    return any(done < goal[name] for name, done in reached.items())


def make_waiting_rows_due(engine) -> None:
    """Time passing, without waiting: every unleased work, coordinator and tombstone row that
    waits (a backoff, a deferral) becomes due. Leased rows are never touched: a live lease is
    its owner's."""
    with engine.begin() as connection:
        for table in (schema.work, schema.reconciliations, schema.collection_deletions):
            connection.execute(
                update(table)
                .where(table.c.state.in_(("pending", "retry")), table.c.next_attempt_at > now())
                .values(next_attempt_at=ago(1))
            )


def backlog(engine) -> dict[str, object]:
    """What is still to do; empty once both lanes have nothing left."""
    left = {
        "work": count(engine, schema.work),
        "reconciliations": count(engine, schema.reconciliations),
        "tombstones": count(engine, schema.collection_deletions),
        "incomplete": [
            slug
            for slug in (*KEPT, QUIET)
            if one(engine, schema.index_status, scope_key=slug)["status"] != "complete"
        ],
    }
    return {name: value for name, value in left.items() if value}


class LeaseClock:
    """Leases expiring, without waiting: once the writer has stopped, a lease nobody has renewed
    for STALE_LEASE_SECONDS of polling is taken as expired. Its holder has ended without
    handing it back, as EmDash's own steps do when a checkpoint lost to a write (`deferred`:
    the lease is left to expire in 60 s). The UPDATE re-asserts the token and the expiry it
    saw, so a renewal meanwhile wins, and a holder still at work merely loses its claim."""

    def __init__(self) -> None:
        self.first_seen: dict[tuple[str, str, str], float] = {}

    def expire_stale(self, engine) -> None:
        now_seconds, seen = time.monotonic(), {}
        for table in LEASED_TABLES:
            for lease in self.held(engine, table):
                seen[lease] = self.first_seen.get(lease, now_seconds)
                if now_seconds - seen[lease] >= STALE_LEASE_SECONDS:
                    self.expire(engine, table, *lease[1:])
        self.first_seen = seen

    @staticmethod
    def held(engine, table) -> list[tuple[str, str, str]]:
        statement = select(table.c.lease_token, table.c.lease_expires_at).where(
            table.c.lease_token.is_not(None)
        )
        with engine.connect() as connection:
            return [(table.name, *row) for row in connection.execute(statement)]

    @staticmethod
    def expire(engine, table, token: str, expires_at: str) -> None:
        with engine.begin() as connection:
            connection.execute(
                update(table)
                .where(table.c.lease_token == token, table.c.lease_expires_at == expires_at)
                .values(lease_expires_at=ago(1))
            )


def drain(engine, participants) -> None:
    """Poll until nothing is left to do, letting time pass for what waits: backoffs and
    deferrals (`make_waiting_rows_due`) and leases their holders left behind (`LeaseClock`)."""
    deadline, clock = time.monotonic() + PHASE_SECONDS, LeaseClock()
    while left := backlog(engine):
        for participant in participants:
            participant.check()
        assert time.monotonic() < deadline, f"the lanes did not drain: {left}"
        make_waiting_rows_due(engine)
        clock.expire_stale(engine)
        time.sleep(POLL_SECONDS)


def held_leases(engine) -> dict[str, int]:
    """Lease rows still held anywhere, table by table."""
    held = {}
    with engine.connect() as connection:
        for table in (
            schema.work,
            schema.reconciliations,
            schema.collection_deletions,
            schema.activation,
            schema.cleanup,
        ):
            statement = select(func.count()).where(table.c.lease_token.is_not(None))
            held[table.name] = connection.execute(statement.select_from(table)).scalar_one()
    held[schema.generation_writes.name] = count(engine, schema.generation_writes)
    return {name: found for name, found in held.items() if found}


def lane_progress(lane: EmDashLane) -> dict[str, int]:
    """How often EmDash's lane projected an entry and advanced a reconciliation itself."""
    projected = advanced = 0
    for entry in lane.entries():
        tick = entry.get("tick") or {}
        if entry.get("task_class") == "entry_work":
            projected += tick.get("completed", 0)
        elif entry.get("task_class") == "reconciliation":
            advanced += tick["outcome"] == "advanced"
    return {"projected": projected, "advanced": advanced}


# --- the test ------------------------------------------------------------------------------------


def test_the_project_runs_beside_emdashs_lane_and_the_index_ends_true(db, tmp_path):
    engine = db.engine
    cms = CmsWriter(engine)
    collections = {slug: cms.create_collection(slug, MEDIA_FIELDS) for slug in (*KEPT, DOOMED)}
    for slug in collections:
        cms.insert_entries(slug, sample_entries(slug[:3], ENTRIES))
    assert activate(engine)[-1].outcome is ActivationOutcome.ACTIVE
    # A collection whose coverage is trusted (reconciled while empty), then captured entries
    # nobody edits or scans: the work a run dies holding stays held until its leases expire.
    quiet = collections[QUIET] = cms.create_collection(QUIET, MEDIA_FIELDS)
    assert run_to_completion(engine, quiet.id) is ReconciliationOutcome.COMPLETED
    cms.insert_entries(QUIET, sample_entries(QUIET[:3], 2 * KILLED_BATCH))
    dead_tokens = kill_after_first_claim(db.url, tmp_path / "killed_work_run.log")
    assert len(dead_tokens) == KILLED_BATCH
    dead = schema.work.c.lease_token.in_(dead_tokens)
    with engine.begin() as connection:
        leased = update(schema.work).where(dead, schema.work.c.state == "leased")
        assert (
            connection.execute(
                leased.values(lease_expires_at=from_now(DEAD_LEASE_SECONDS))
            ).rowcount
            == KILLED_BATCH
        )

    lane = EmDashLane(db.url, tmp_path / "emdash_lane.jsonl")
    work_runs, other_runs = DagsterRuns(db.url, WORK_SENSORS), DagsterRuns(db.url, OTHER_SENSORS)
    writer = Writer(db.url)
    participants = (lane, work_runs, other_runs, writer)
    lane.start()
    try:
        # EmDash's lane alone first: it projects an entry and steps a reconciliation itself.
        wait_until(lambda: lane_progress(lane), {"projected": 1, "advanced": 1}, participants)
        for participant in (work_runs, other_runs, writer):
            participant.start()

        def progress() -> dict[str, int]:
            runs = len(work_runs.runs) + len(other_runs.runs)
            return {"writes": writer.writes, "runs": runs, "lane_events": lane.calls.value}

        wait_until(progress, BEFORE_DELETION, participants)
        doomed = collections[DOOMED]
        doomed_keys = source_keys_of(engine, doomed.id)
        try:  # EmDash's request path; the lane may claim the fresh tombstone first (CONFLICT)
            requested = request_collection_deletion(engine, DOOMED, force=True)
            assert requested.outcome in (RequestOutcome.DETACHED, RequestOutcome.ACCEPTED)
        except DeletionConflictError:
            pass
        wait_until(progress, IN_ALL, participants)
        writer.stop()
        writer.check()

        # The dead run's leases are still live: nobody took them. Now they expire.
        held = [row["lease_token"] for row in all_rows(engine, schema.work, state="leased")]
        assert sorted(token for token in held if token in dead_tokens) == sorted(dead_tokens)
        with engine.begin() as connection:
            connection.execute(update(schema.work).where(dead).values(lease_expires_at=ago(1)))
        drain(engine, participants)
    finally:
        for participant in participants:
            participant.stop()
    for participant in participants:
        participant.check()

    # EmDash's lane: one class per event, strictly in rotation from the stored default.
    ledger = lane.entries()
    assert [entry["outcome"] for entry in ledger] == ["processed"] * len(ledger)
    assert [entry["turn"] for entry in ledger] == [i % 3 for i in range(len(ledger))]
    assert one(engine, schema.activation)["media_usage_maintenance_turn"] == (len(ledger) - 1) % 3
    # The project's runs: every one succeeded (a lost guard is an outcome, not a failure).
    assert [run for run in (*work_runs.runs, *other_runs.runs) if not run.success] == []

    # The end state.
    captured = [collections[slug] for slug in (*KEPT, QUIET)]
    assert_coverage_complete(engine, captured)  # status complete, no work, verify: no differences
    report = verify_index(engine)  # every captured collection, fingerprints included
    assert (report.differences, report.pending_work_count) == ((), 0)
    assert sorted(summary.collection_slug for summary in report.collections) == sorted(
        (*KEPT, QUIET)
    )
    assert count(engine, schema.work) == 0  # nothing pending, leased or failed
    assert held_leases(engine) == {}
    assert one(engine, schema.activation)["state"] == "active"
    assert leftovers(engine, doomed.id, DOOMED, doomed_keys) == {}
