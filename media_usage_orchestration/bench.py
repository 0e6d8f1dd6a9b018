"""`media-usage bench`: how fast a collection is reconciled, or captured work is processed.

Every measurement starts from a fresh database: a new SQLite file in a temporary directory, or
a new schema `bench_<random>` on a PostgreSQL server (selected through the URL's `search_path`
option and dropped afterwards). One collection with the sample media fields is filled with N
entries before capture is activated, as an existing CMS would have them, then:

- `reconcile` times a reconciliation from scratch to complete coverage, either with the
  Dagster-free driver (`run_to_completion`) or through real Dagster runs requested by the
  sensors and executed in an instance;
- `work` times N captured work items (entries written after activation) processed by the batch
  processor or by EmDash's one-job tick.

The index is verified against the content at the end. Human lines go to the console; the last
line printed is one JSON object for scripts.
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from . import sample_content
from .processing.activation import activate
from .processing.reconciliation.driver import run_to_completion
from .processing.reconciliation.model import ReconciliationOutcome
from .processing.verify import verify_index
from .processing.work import process_due_batch, process_due_work
from .store.cms import CmsWriter, Collection
from .store.coverage import read_collection_coverage
from .store.engine import (
    URL,
    ArgumentError,
    Engine,
    create_database_engine,
    normalize_url,
    redacted_url,
    scrubbed,
)
from .store.schema import install_schema
from .store.scratch import scratch_schema

COLLECTION_SLUG = "articles"
ENTRY_PREFIX = "art"
INSERT_CHUNK = 1000
WORK_BATCH_SIZE = 50
MAX_DRIVER_RUNS = 100
DRIVER_DONE = (
    ReconciliationOutcome.COMPLETED,
    ReconciliationOutcome.ALREADY_COMPLETE,
    ReconciliationOutcome.FAILED,
)

console = Console(soft_wrap=True)


@dataclass(frozen=True)
class BenchResult:
    mode: str
    dialect: str
    entries: int
    seconds: float
    runs: int
    verified: bool
    workload: str
    path: str | None = None

    def as_json(self) -> str:
        record = {
            "mode": self.mode,
            "dialect": self.dialect,
            "entries": self.entries,
            "seconds": round(self.seconds, 3),
            "entries_per_second": round(self.entries / self.seconds, 1) if self.seconds else None,
            "runs": self.runs,
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "verified": self.verified,
        }
        if self.workload == "work":
            record.update(workload=self.workload, path=self.path)
        return json.dumps(record)


def peak_rss_mb() -> float:
    """Peak resident set size of this process (Linux reports kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- a fresh database -------------------------------------------------------------------------


@contextlib.contextmanager
def fresh_database(database_url: str | None, keep: bool) -> Iterator[str]:
    """A URL of an empty database that exists only for this measurement (unless `keep`)."""
    if database_url is None:
        with _temporary_sqlite(keep) as url:
            yield url
        return
    parsed = _usable_url(database_url)
    if parsed.get_backend_name() == "sqlite":
        if Path(parsed.database).exists():
            raise click.ClickException(f"{parsed.database} exists; the bench needs a new file")
        yield parsed.render_as_string(hide_password=False)
        return
    with _temporary_schema(parsed, keep) as url:
        yield url


def _usable_url(database_url: str) -> URL:
    """The URL, or bad usage (exit 2) without its password; a database error later goes
    through the command line's one error handler (exit 1, one line)."""
    try:
        return normalize_url(database_url)
    except (ArgumentError, ValueError) as error:
        message = scrubbed(str(error), database_url)
        raise click.BadParameter(message, param_hint="'--database-url'") from None


@contextlib.contextmanager
def _temporary_sqlite(keep: bool) -> Iterator[str]:
    directory = Path(tempfile.mkdtemp(prefix="media_usage_bench_"))
    try:
        yield f"sqlite:///{directory / 'bench.db'}"
    finally:
        if keep:
            console.print(f"kept {directory / 'bench.db'}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _temporary_schema(server: URL, keep: bool) -> Iterator[str]:
    with scratch_schema(server, "bench", keep=keep) as (schema, url):
        try:
            yield url
        finally:
            if keep:
                console.print(f"kept schema {schema}")


# --- content ------------------------------------------------------------------------------------


def create_collection(engine: Engine) -> Collection:
    with engine.begin() as connection:
        install_schema(connection)
    return CmsWriter(engine).create_collection(COLLECTION_SLUG, sample_content.MEDIA_FIELDS)


def insert_entries(engine: Engine, count: int) -> None:
    writer = CmsWriter(engine)
    for start in range(0, count, INSERT_CHUNK):
        size = min(INSERT_CHUNK, count - start)
        writer.insert_entries(
            COLLECTION_SLUG, sample_content.sample_entries(ENTRY_PREFIX, size, start)
        )


def coverage_is_complete(engine: Engine, collection: Collection) -> bool:
    coverage = read_collection_coverage(engine, collection.id)
    return (
        coverage is not None
        and coverage.status == "complete"
        and coverage.reconciliation_required is False
    )


def index_is_verified(engine: Engine) -> bool:
    report = verify_index(engine)
    for difference in report.differences[:5]:
        console.print(
            f"  drift: {difference.kind.value} {difference.content_id} {difference.detail}"
        )
    return not report.has_drift and report.pending_work_count == 0


# --- workloads ----------------------------------------------------------------------------------


class DriverMode:
    """`run_to_completion` until coverage is complete (no Dagster)."""

    def __init__(self, engine: Engine, collection: Collection) -> None:
        self.engine = engine
        self.collection = collection

    def reconcile(self) -> int:
        """Returns how many runs that took."""
        for runs in range(1, MAX_DRIVER_RUNS + 1):
            outcome = run_to_completion(self.engine, self.collection.id)
            if outcome in DRIVER_DONE:
                return runs
            if outcome is ReconciliationOutcome.INACTIVE:
                break
        raise click.ClickException(f"reconciliation did not complete (last outcome {outcome})")

    def process_work(self, path: str) -> int:
        """Drain the due work with the batch processor or EmDash's tick; returns the calls."""
        calls = 0
        while True:
            calls += 1
            if path == "batch":
                claimed = process_due_batch(self.engine, WORK_BATCH_SIZE).claimed_count
            else:
                claimed = process_due_work(self.engine).claimed_count
            if claimed == 0:
                return calls


@contextlib.contextmanager
def dagster_lane(url: str) -> Iterator[Callable[[tuple], int]]:
    """A Dagster instance and the resources runs get, ready before the clock starts; yields
    what the daemon does: evaluate the given sensors and execute every run they request as a
    real run in the instance until none is requested (returns how many runs that took)."""
    import dagster as dg

    from .local_runner import run_lane
    from .resources.automation import MediaUsageAutomation
    from .resources.database import MediaUsageDatabase

    resources = {"database": MediaUsageDatabase.for_url(url), "automation": MediaUsageAutomation()}

    def run(sensors: tuple) -> int:
        lane = run_lane(instance, resources, sensors=sensors, log_level="WARNING")
        runs = [run for run in lane if run.job_name != "partitions"]
        failed = [run for run in runs if not run.success]
        if failed:
            raise click.ClickException(f"{len(failed)} of {len(runs)} runs failed ({failed[0]})")
        return len(runs)

    with dg.instance_for_test() as instance:
        yield run


def _sensors(*names: str) -> tuple:
    from . import sensors

    return tuple(getattr(sensors, name) for name in names)


# --- the command --------------------------------------------------------------------------------


def _timed(action: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    runs = action()
    return time.perf_counter() - started, runs


def run_reconcile(url: str, entries: int, mode: str) -> BenchResult:
    engine = create_database_engine(url)
    try:
        collection = create_collection(engine)
        insert_entries(engine, entries)
        activate(engine)
        console.print(f"{entries} entries in {COLLECTION_SLUG!r}; capture active; reconciling")
        if mode == "dagster":
            lane_sensors = _sensors("media_usage_reconciliation_sensor", "media_usage_work_sensor")
            with dagster_lane(url) as lane:
                seconds, runs = _timed(lambda: lane(lane_sensors))
        else:
            seconds, runs = _timed(DriverMode(engine, collection).reconcile)
        complete = coverage_is_complete(engine, collection)
        verified = complete and index_is_verified(engine)
        return BenchResult(mode, engine.dialect.name, entries, seconds, runs, verified, "reconcile")
    finally:
        engine.dispose()


def run_work(url: str, entries: int, mode: str, path: str) -> BenchResult:
    engine = create_database_engine(url)
    try:
        collection = create_collection(engine)
        activate(engine)
        insert_entries(engine, entries)
        console.print(f"{entries} captured work items in {COLLECTION_SLUG!r}; processing ({path})")
        if mode == "dagster":
            lane_sensors = _sensors("media_usage_work_sensor")
            with dagster_lane(url) as lane:
                seconds, runs = _timed(lambda: lane(lane_sensors))
        else:
            driver = DriverMode(engine, collection)
            seconds, runs = _timed(lambda: driver.process_work(path))
        verified = index_is_verified(engine)
        dialect = engine.dialect.name
        return BenchResult(mode, dialect, entries, seconds, runs, verified, "work", path)
    finally:
        engine.dispose()


@click.command("bench")
@click.option(
    "--database-url",
    default=None,
    help="A PostgreSQL server (a fresh schema is used) or a new SQLite file; "
    "default: a SQLite file in a temporary directory.",
)
@click.option("--entries", default=20_000, show_default=True, type=click.IntRange(1))
@click.option(
    "--mode", type=click.Choice(["driver", "dagster"]), default="driver", show_default=True
)
@click.option(
    "--workload", type=click.Choice(["reconcile", "work"]), default="reconcile", show_default=True
)
@click.option(
    "--path",
    "work_path",
    type=click.Choice(["batch", "tick"]),
    default="batch",
    show_default=True,
    help="Work workload only: the batch processor or EmDash's tick.",
)
@click.option("--keep", is_flag=True, help="Keep the database (file or schema) afterwards.")
def bench(
    database_url: str | None, entries: int, mode: str, workload: str, work_path: str, keep: bool
) -> None:
    """Measure reconciliation (or work processing) throughput on a fresh database."""
    if workload == "work" and mode == "dagster" and work_path == "tick":
        raise click.UsageError("Dagster's work job runs the batch path; use --path batch")
    with fresh_database(database_url, keep) as url:
        console.print(f"bench database: [bold]{escape(redacted_url(url))}[/]")
        if workload == "reconcile":
            result = run_reconcile(url, entries, mode)
        else:
            result = run_work(url, entries, mode, work_path)
    rate = result.entries / result.seconds if result.seconds else float("inf")
    console.print(
        f"{result.workload} ({result.mode}{', ' + result.path if result.path else ''}, "
        f"{result.dialect}): {result.entries} entries in {result.seconds:.2f} s = "
        f"[bold]{rate:,.0f} entries/s[/], {result.runs} runs, "
        f"peak RSS {peak_rss_mb():.0f} MB, verified: {result.verified}"
    )
    click.echo(result.as_json())
    if not result.verified:
        raise SystemExit(1)


__all__ = ["BenchResult", "bench", "fresh_database", "peak_rss_mb"]
