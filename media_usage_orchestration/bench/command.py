"""`media-usage bench`: how fast a collection is reconciled, captured work is processed, a
work sensor ticks over a large work table, the projection GC reaps a backlog, or (live) how
long an edit waits for the index with a real daemon running, each on a fresh database (see
`database.py`).

Human lines go to the console: the measurement, its phases (seconds and statements per entry)
and peak RSS; the last line printed is one JSON object for scripts.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import click
from rich.markup import escape

from media_usage_orchestration.bench.database import console, fresh_database, is_postgres_url
from media_usage_orchestration.bench.gc import run_gc
from media_usage_orchestration.bench.live import LiveLoad, print_live, run_live
from media_usage_orchestration.bench.measure import (
    BenchResult,
    Workload,
    peak_rss_mb,
    run_reconcile,
    run_work,
)
from media_usage_orchestration.bench.report import print_phases, print_result
from media_usage_orchestration.bench.scrub import run_scrub
from media_usage_orchestration.bench.soak import SoakLoad, print_soak, run_soak
from media_usage_orchestration.bench.tick import run_tick
from media_usage_orchestration.store.core.engine import redacted_url

DEFAULT_ENTRIES = 5000


def _refuse_bad_combinations(
    database_url: str | None, mode: str, workload: str, work_path: str, workers: int
) -> None:
    if workload == "soak" and not is_postgres_url(database_url):
        raise click.UsageError(
            "--workload soak deploys on PostgreSQL (instance and CMS databases): pass "
            "--database-url postgresql+psycopg://..."
        )
    if workload in ("live", "gc", "soak") and workers > 1:
        raise click.UsageError(f"--workload {workload} measures one lane's runs: one worker")
    if mode == "floor" and (workload != "reconcile" or workers > 1):
        raise click.UsageError("--mode floor reconciles with one worker (--workload reconcile)")
    if workload == "work" and mode == "dagster" and work_path == "tick":
        raise click.UsageError("Dagster's work job runs the batch path; use --path batch")
    if workers == 1:
        return
    if not is_postgres_url(database_url):
        raise click.UsageError(
            "--workers needs PostgreSQL (SQLite has one writer, so parallel work runs only "
            "queue behind each other): pass --database-url postgresql+psycopg://..."
        )
    if mode == "dagster":
        raise click.UsageError(
            "--workers measures the driver's drain beside work-run processes; use --mode driver"
        )
    if workload in ("tick", "scrub") or (workload == "work" and work_path == "tick"):
        raise click.UsageError("--workers drains with the batch path (reconcile or work)")


def _measure(
    database_url: str | None, keep: bool, workload: str, job: Workload, path: str
) -> BenchResult | dict:
    with (
        fresh_database(database_url, keep) as url,
        _reference_database(database_url, keep, job.mode) as reference_url,
    ):
        console.print(f"bench database: [bold]{escape(redacted_url(url))}[/]")
        measured = Workload(url, job.entries, job.mode, job.workers, job.profile, reference_url)
        if workload == "reconcile":
            return run_reconcile(measured)
        if workload == "work":
            return run_work(measured, path)
        if workload == "scrub":
            return run_scrub(url, job.entries)
        if workload == "gc":
            return run_gc(url, job.entries, job.profile)
        return run_tick(url, job.entries)


@contextlib.contextmanager
def _reference_database(database_url: str | None, keep: bool, mode: str) -> Iterator[str | None]:
    """Floor mode compares its end state with the driver's on a second fresh database."""
    if mode != "floor":
        yield None
        return
    reference = database_url
    if database_url is not None and not is_postgres_url(database_url):
        reference = database_url + ".reference.db"
    with fresh_database(reference, keep) as url:
        yield url


@click.command("bench")
@click.option(
    "--database-url",
    default=None,
    help="A PostgreSQL server (a fresh schema is used) or a new SQLite file; "
    "default: a SQLite file in a temporary directory.",
)
@click.option(
    "--entries",
    default=DEFAULT_ENTRIES,
    show_default=True,
    type=click.IntRange(1),
    help="Entries to reconcile or work items to process; work rows for --workload tick; "
    "obsolete occurrence rows to reap for --workload gc.",
)
@click.option(
    "--mode",
    type=click.Choice(["driver", "dagster", "floor"]),
    default="driver",
    show_default=True,
    help="Reconcile and work only (live always runs Dagster); floor: the reconciliation's end "
    "state with plain bulk SQL and the rules' minimal bookkeeping, compared with the driver's.",
)
@click.option(
    "--workload",
    type=click.Choice(["reconcile", "work", "tick", "scrub", "live", "gc", "soak"]),
    default="reconcile",
    show_default=True,
    help="tick: time the work sensor over --entries generated work rows; scrub: time the "
    "scrubber's slices over --entries reconciled entries; gc: projection-GC runs reaping a "
    "backlog of --entries obsolete rows aged past the safety window; live: edits at "
    "--rate with a real daemon, after --entries entries in --collections are reconciled; soak: "
    "the production setup (deploy/dagster.yaml on PostgreSQL, code server, daemon, webserver) "
    "under edits at --rate for --minutes, reported every --report-minutes.",
)
@click.option(
    "--rate",
    default=2.0,
    show_default=True,
    type=click.FloatRange(0.1, 100),
    help="Live and soak: edits per second.",
)
@click.option(
    "--seconds",
    default=60.0,
    show_default=True,
    type=click.FloatRange(1, 3600),
    help="Live only: how long edits are written.",
)
@click.option(
    "--idle-seconds",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0, 3600),
    help="Live only: how long nothing is written afterwards (runs launched then are counted).",
)
@click.option(
    "--collections",
    default=3,
    show_default=True,
    type=click.IntRange(1, 6),
    help="Live and soak: collections the entries and the edits (round-robin) are spread over.",
)
@click.option(
    "--minutes",
    default=60.0,
    show_default=True,
    type=click.FloatRange(1, 1440),
    help="Soak only: how long edits are written.",
)
@click.option(
    "--report-minutes",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.5, 60),
    help="Soak only: the length of each reported window.",
)
@click.option(
    "--path",
    "work_path",
    type=click.Choice(["batch", "tick"]),
    default="batch",
    show_default=True,
    help="Work workload only: the batch processor or EmDash's tick.",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 16),
    help="PostgreSQL only: processes that drain in parallel (the drain and N-1 work runs); "
    "also measures one worker and reports the drain's speed-up.",
)
@click.option(
    "--profile",
    "profile_path",
    default=None,
    type=click.Path(dir_okay=False, writable=True),
    help="Write a cProfile of the measured section to this file and print its top functions.",
)
@click.option("--keep", is_flag=True, help="Keep the database (file or schema) afterwards.")
def bench(
    database_url: str | None,
    entries: int,
    mode: str,
    workload: str,
    work_path: str,
    rate: float,
    seconds: float,
    idle_seconds: float,
    collections: int,
    minutes: float,
    report_minutes: float,
    workers: int,
    profile_path: str | None,
    keep: bool,
) -> None:
    """Measure reconciliation (or work processing, a sensor tick, live latency) on a fresh
    database."""
    _refuse_bad_combinations(database_url, mode, workload, work_path, workers)
    if workload == "soak":
        with fresh_database(database_url, keep) as url:
            console.print(f"bench database: [bold]{escape(redacted_url(url))}[/]")
            load = SoakLoad(url, database_url, entries, collections, rate, minutes, report_minutes)
            record = run_soak(load)
        print_soak(record)
        click.echo(json.dumps(record))
        if not record["verified"]:
            raise SystemExit(1)
        return
    if workload == "live":
        with fresh_database(database_url, keep) as url:
            console.print(f"bench database: [bold]{escape(redacted_url(url))}[/]")
            record = run_live(LiveLoad(url, entries, collections, rate, seconds, idle_seconds))
        print_live(record)
        click.echo(json.dumps(record))
        return
    job = Workload("", entries, mode, workers, profile_path)
    if workload == "gc":
        record = _measure(database_url, keep, workload, job, work_path)
        print_gc(record)
        record["peak_rss_mb"] = round(peak_rss_mb(), 1)
        click.echo(json.dumps(record))
        if not record["verified"]:
            raise SystemExit(1)
        return
    if workload == "scrub":
        record = _measure(database_url, keep, workload, job, work_path)
        console.print(
            f"scrubber over {record['entries']:,} entries ({record['dialect']}): "
            f"{record['entries_per_second']:,} entries/s, a {record['slice_entries']}-entry "
            f"slice {record['slice_ms']} ms (max {record['slice_max_ms']}); a sweep of 100,000 "
            f"entries takes {record['sweep_hours_per_100k']} h"
        )
        click.echo(json.dumps(record))
        return
    if workload == "tick":
        record = _measure(database_url, keep, workload, job, work_path)
        console.print(
            f"work sensor over {record['work_rows']:,} rows ({record['dialect']}): probe "
            f"{record['probe_ms']} ms, tick {record['tick_ms']} ms (max {record['tick_max_ms']})"
        )
        console.print(
            f"queue sensor over {record['work_rows']:,} rows ({record['dialect']}): probe "
            f"{record['queue_probe_ms']} ms, tick {record['queue_tick_ms']} ms "
            f"(max {record['queue_tick_max_ms']})"
        )
        record["peak_rss_mb"] = round(peak_rss_mb(), 1)
        click.echo(json.dumps(record))
        return
    baseline = None
    if workers > 1:
        console.print("one worker first, for the speed-up")
        single = Workload("", entries, mode, 1, None)
        baseline = _measure(database_url, keep, workload, single, work_path)
        print_phases(baseline)
    result = _measure(database_url, keep, workload, job, work_path)
    if baseline is not None:
        result = with_speedup(result, baseline)
    print_result(result)
    click.echo(result.as_json())
    if not result.verified or (baseline is not None and not baseline.verified):
        raise SystemExit(1)


def print_gc(record: dict) -> None:
    console.print(
        f"projection GC over a backlog of {record['backlog_rows']:,} rows ({record['dialect']}, "
        f"{record['current_rows']:,} current rows kept): {record['deleted_rows']:,} deleted in "
        f"{record['seconds']:.1f} s ({record['rows_per_second']:,} rows/s), "
        f"{record['runs']} run(s), {record['passes']:,} passes ({record['pass_ms']} ms, "
        f"{record['statements_per_pass']} statements a pass); left {record['backlog_left']:,}; "
        f"verify {'clean' if record['verified'] else 'NOT clean'} (load average "
        f"{record['load_average']})"
    )


def with_speedup(result: BenchResult, baseline: BenchResult) -> BenchResult:
    """`result` carrying the one-worker drain time and the drain's speed-up over it."""
    single = baseline.phase_seconds.get("drain", 0.0)
    parallel = result.phase_seconds.get("drain", 0.0)
    extra = {
        "baseline_drain_seconds": round(single, 3),
        "drain_speedup": round(single / parallel, 2) if parallel else None,
    }
    return BenchResult(**{**result.__dict__, "extra": {**result.extra, **extra}})


__all__ = ["DEFAULT_ENTRIES", "bench", "print_gc", "with_speedup"]
