"""Faults during a reconciliation run, on PostgreSQL.

(a) Content written through the CMS by another thread and connection while the job pages:
    every captured write moves the status epoch, so the run restarts its scan, and the index
    it finally trusts equals the content.
(b) A run process SIGKILLed in the middle of its scan, while the statement that enqueues and
    checkpoints a page is in flight: a later run takes the coordinator once its lease has
    expired (moved by backdating, never by waiting) and resumes from the checkpoint at the
    same epoch. No page is lost, none is enqueued again, every entry is processed exactly
    once.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import dagster as dg
import pytest
from sqlalchemy import select, text

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import (
    draft_revision_data,
    sample_entries,
)
from media_usage_orchestration.processing.reconciliation import model, steps
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV, create_database_engine
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from media_usage_orchestration.store.work.repository import WorkRepository
from tests.support.reconciliation_runs import (
    COMPLETE_RUN,
    PARTITIONS,
    PROJECT_ROOT,
    activate_with_job,
    assert_coverage_complete,
    outcome_of,
    run_partition,
    step_outcomes,
    write_collections,
)
from tests.support.states import all_rows, backdate, count, one, status_row

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres_only(
        "the concurrent writers and the killed run process are PostgreSQL's case"
    ),
]

ENTRIES = 500
PAGE = model.PAGE_SIZE
KILL_AFTER_PAGE = 4
READY_TIMEOUT_SECONDS = 120


@dataclass(frozen=True)
class Enqueued:
    phase: str
    content_ids: tuple[str, ...]
    change_epoch: int
    changed: int


def record_enqueued_pages(monkeypatch) -> list[Enqueued]:
    """Write down every reconciliation page enqueued in this process and what it changed: a
    scan page (enqueued and checkpointed in one go) once written, with the ids between its
    cursors; a source page's enqueue once run."""
    pages: list[Enqueued] = []
    enqueue = WorkRepository.enqueue_reconciliation_page
    write_scan_page = ReconciliationRepository.write_scan_page

    def recorded(self, **page):
        changed = enqueue(self, **page)
        epoch = int(page["change_epoch"])
        pages.append(Enqueued(page["phase"], tuple(page["content_ids"]), epoch, changed))
        return changed

    def recorded_scan(self, claim, reconciliation, *args, **kwargs):
        written = write_scan_page(self, claim, reconciliation, *args, **kwargs)
        if written is not None:
            ids = content_ids_between(
                self.engine, claim.collection_slug, reconciliation.scan_cursor, written.cursor
            )
            epoch = int(reconciliation.target_epoch)
            pages.append(Enqueued("scan", ids, epoch, written.enqueued))
        return written

    monkeypatch.setattr(WorkRepository, "enqueue_reconciliation_page", recorded)
    monkeypatch.setattr(ReconciliationRepository, "write_scan_page", recorded_scan)
    return pages


def content_ids_between(engine, slug: str, after: str | None, last: str) -> tuple[str, ...]:
    content = schema.content_table(slug)
    statement = select(content.c.id).where(content.c.id <= last).order_by(content.c.id)
    if after:
        statement = statement.where(content.c.id > after)
    with engine.connect() as connection:
        return tuple(connection.execute(statement).scalars())


# --- (a) content writes during a run ------------------------------------------------------------


class Writer(threading.Thread):
    """Captured CMS writes from a second connection: an edit with new media, new entries, a
    permanent delete, a trash and a draft revision."""

    def __init__(self, url: str, start_index: int) -> None:
        super().__init__(daemon=True)
        self.url, self.start_index = url, start_index
        self.error: BaseException | None = None

    def run(self) -> None:
        engine = create_database_engine(self.url)
        try:
            writer = CmsWriter(engine)
            first = self.start_index
            writer.update_entry(
                "articles",
                f"art-e{first:05d}",
                {"hero": {"id": f"edited-{first}", "provider": "local", "mimeType": "image/png"}},
            )
            writer.insert_entries("articles", sample_entries("art", 3, start=ENTRIES + first))
            writer.delete_entry("articles", f"art-e{first + 1:05d}")
            writer.trash_entry("articles", f"art-e{first + 2:05d}")
            entry = sample_entries("art", 1, start=first + 3)[0]
            writer.save_draft("articles", entry["id"], draft_revision_data(entry))
        except BaseException as error:
            self.error = error
        finally:
            engine.dispose()


def _due_again(db, collection) -> None:
    """What the sensor waits for before the next run, without waiting: a lease the ended run
    still holds expires, a release's delay passes."""
    row = one(db.engine, schema.reconciliations, collection_id=collection.id)
    if row is None:
        return
    column = "lease_expires_at" if row["state"] == "leased" else "next_attempt_at"
    backdate(db.engine, schema.reconciliations, column, 1, collection_id=collection.id)


def overlapping(step, writers: list[Writer], url: str, start_index: int, after_calls: int):
    """Wrap a step function: once it has returned `after_calls` times, a writer thread starts
    and writes while the next call runs; it has finished before that call returns."""
    calls = []

    def wrapped(engine, claim, *args, **kwargs):
        calls.append(claim.lease_token)
        writer = None
        if len(calls) == after_calls + 1:
            writer = Writer(url, start_index)
            writers.append(writer)
            writer.start()
        try:
            return step(engine, claim, *args, **kwargs)
        finally:
            if writer is not None:
                writer.join(60)

    return wrapped


def test_content_written_during_the_run_restarts_it_and_the_index_stays_true(db, monkeypatch):
    """Writes overlap the third scan page and the second page of the source walk. Each run
    is allowed to end where the moving epoch stopped it (EmDash's restart, deferral or lost
    claim); the next one starts once the sensor would start it."""
    articles = write_collections(db.engine, {"articles": ENTRIES})["articles"]
    writers: list[Writer] = []
    pages = record_enqueued_pages(monkeypatch)
    monkeypatch.setattr(steps, "scan_page", overlapping(steps.scan_page, writers, db.url, 10, 2))
    monkeypatch.setattr(
        steps, "source_page", overlapping(steps.source_page, writers, db.url, 100, 1)
    )
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        first_epoch = status_row(db.engine, "articles")["change_epoch"]
        instance.add_dynamic_partitions(PARTITIONS, ["articles"])
        runs = []
        for _ in range(8):
            result = run_partition(db, instance, "articles")
            assert result.success
            runs.append(step_outcomes(result.all_events))
            if status_row(db.engine, "articles")["status"] == "complete":
                break
            _due_again(db, articles)

    assert len(writers) == 2
    assert [writer.error for writer in writers] == [None, None]
    assert runs[-1] == COMPLETE_RUN
    assert len(runs) >= 2, runs  # the burst during the source walk ended the first run
    final_epoch = status_row(db.engine, "articles")["change_epoch"]
    # The scan started over at a newer epoch: the run began at the next epoch, and pages
    # were enqueued again at the epoch the writes moved it to.
    scanned_epochs = sorted({page.change_epoch for page in pages if page.phase == "scan"})
    assert scanned_epochs[0] == first_epoch + 1
    assert scanned_epochs[-1] == final_epoch > first_epoch + 1
    # 500 entries, 6 inserted, 2 deleted for good (trashed entries keep their row).
    assert count(db.engine, schema.content_table("articles")) == ENTRIES + 6 - 2
    assert all_rows(db.engine, schema.sources, content_id="art-e00011") == []
    # One canonical source per entry (trashed ones included) plus one per draft revision.
    assert count(db.engine, schema.sources, collection_id=articles.id) == ENTRIES + 6 - 2 + 2
    assert_coverage_complete(db.engine, [articles])


# --- (b) a run process killed mid-scan ----------------------------------------------------------

_KILLABLE_RUN = """
import sys

import dagster as dg

from media_usage_orchestration.definitions import defs
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository

slug, killed_page = sys.argv[1], int(sys.argv[2])
write_scan_page = ReconciliationRepository.write_scan_page
pages = []


def announced(self, claim, reconciliation, *args, **kwargs):
    if len(pages) + 1 == killed_page:
        print("PAUSED", flush=True)
        sys.stdin.readline()  # the parent holds the coordinator row: this page's write waits
    written = write_scan_page(self, claim, reconciliation, *args, **kwargs)
    if written is not None:
        pages.append(written.cursor)
        print(f"WRITTEN scan {len(pages)} {written.cursor} {written.enqueued}", flush=True)
    return written


ReconciliationRepository.write_scan_page = announced
instance = dg.DagsterInstance.ephemeral()
instance.add_dynamic_partitions("media_usage_collections", [slug])
defs.resolve_job_def("media_usage_reconciliation").execute_in_process(
    instance=instance, partition_key=slug
)
"""

# The backend blocked by the given session's locks (the killed run's page write).
_BLOCKED_BACKEND = text(
    "SELECT pid FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
)


def _kill_mid_scan(url: str, collection_id: str, log_path) -> list[str]:
    """Run the job in its own process and SIGKILL it while the write of its scan page
    KILL_AFTER_PAGE is in flight (blocked on the coordinator row, which this test holds), its
    server session terminated as a dead client's would be; returns what it printed."""
    lines: list[str] = []
    engine = create_database_engine(url)
    holder = engine.connect()
    try:
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [sys.executable, "-c", _KILLABLE_RUN, "articles", str(KILL_AFTER_PAGE)],
                cwd=PROJECT_ROOT,
                env={**os.environ, DATABASE_URL_ENV: url},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
            timer = threading.Timer(READY_TIMEOUT_SECONDS, process.kill)
            timer.start()
            try:
                for line in process.stdout:
                    if line.startswith("WRITTEN "):
                        lines.append(line.strip())
                    if line.startswith("PAUSED"):
                        _hold_coordinator(holder, collection_id)
                        process.stdin.write("\n")
                        process.stdin.flush()
                        blocked = _wait_for_blocked_backend(holder)
                        os.kill(process.pid, signal.SIGKILL)
                        holder.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": blocked})
                        break
            finally:
                timer.cancel()
                if process.poll() is None:
                    process.kill()
                returncode = process.wait(timeout=30)
                process.stdout.close()
                process.stdin.close()
    finally:
        holder.rollback()
        holder.close()
        engine.dispose()
    log_tail = log_path.read_text()[-3000:]
    assert len(lines) == KILL_AFTER_PAGE - 1, (lines, log_tail)
    assert returncode == -signal.SIGKILL, (returncode, log_tail)
    return lines


def _hold_coordinator(connection, collection_id: str) -> None:
    table = schema.reconciliations
    connection.execute(
        select(table.c.collection_id)
        .where(table.c.collection_id == collection_id)
        .with_for_update()
    )


def _wait_for_blocked_backend(connection) -> int:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        blocked = connection.execute(_BLOCKED_BACKEND).scalar()
        if blocked is not None:
            return blocked
        time.sleep(0.05)
    raise AssertionError("the run's page write never waited on the coordinator row")


def test_a_run_killed_mid_scan_is_resumed_from_its_checkpoint_after_its_lease_expires(
    db, monkeypatch, tmp_path
):
    articles = write_collections(db.engine, {"articles": ENTRIES})["articles"]
    ids = [entry["id"] for entry in sample_entries("art", ENTRIES)]
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        instance.add_dynamic_partitions(PARTITIONS, ["articles"])

        printed = _kill_mid_scan(db.url, articles.id, tmp_path / "killed_run.log")

        assert printed == [
            f"WRITTEN scan {page} {ids[page * PAGE - 1]} {PAGE}"
            for page in range(1, KILL_AFTER_PAGE)
        ]
        dead = one(db.engine, schema.reconciliations, collection_id=articles.id)
        epoch = dead["target_epoch"]
        assert (dead["state"], dead["phase"]) == ("leased", "scan")
        assert dead["scan_cursor"] == ids[(KILL_AFTER_PAGE - 1) * PAGE - 1]
        assert status_row(db.engine, "articles")["change_epoch"] == epoch
        enqueued = all_rows(db.engine, schema.work, collection_id=articles.id)
        # The killed page's enqueue died with its statement, as its checkpoint did.
        assert sorted(row["content_id"] for row in enqueued) == ids[: (KILL_AFTER_PAGE - 1) * PAGE]
        assert {(row["change_epoch"], row["work_version"], row["state"]) for row in enqueued} == {
            (epoch, 1, "pending")
        }

        # While the dead run's lease is live, a later run takes nothing and writes nothing.
        blocked = run_partition(db, instance, "articles")
        assert step_outcomes(blocked.all_events) == {"claim_reconciliation": "claim_lost"}
        assert one(db.engine, schema.reconciliations, collection_id=articles.id) == dead

        assert (
            backdate(
                db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=articles.id
            )
            == 1
        )
        pages = record_enqueued_pages(monkeypatch)
        resumed = run_partition(db, instance, "articles")

    assert step_outcomes(resumed.all_events) == COMPLETE_RUN
    scans = [page for page in pages if page.phase == "scan"]
    # The scan resumed at its checkpoint: the page after it, whose enqueue the dead run never
    # committed, then the rest of the collection.
    resumed_from = (KILL_AFTER_PAGE - 1) * PAGE
    assert [page.content_ids for page in scans] == [
        tuple(ids[start : start + PAGE]) for start in range(resumed_from, ENTRIES, PAGE)
    ]
    assert [page.changed for page in scans] == [PAGE] * len(scans)
    assert {page.change_epoch for page in pages} == {epoch}
    assert [page for page in pages if page.phase == "sources"] == []
    # Every entry processed exactly once: the dead run's pages and the resumed ones.
    assert outcome_of(resumed.all_events, "drain_collection_work")["completed"] == ENTRIES
    status = status_row(db.engine, "articles")
    assert (status["change_epoch"], status["status"]) == (epoch, "complete")
    assert count(db.engine, schema.sources, collection_id=articles.id) == ENTRIES
    assert_coverage_complete(db.engine, [articles])
