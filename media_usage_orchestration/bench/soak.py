"""`media-usage bench --workload soak --minutes N`: the production setup of deploy/README.md
over time, as an operator would run it for a month.

On a PostgreSQL server (`--database-url`): a fresh schema for the CMS, its `--collections`
collections of sample content (`--entries` in all) captured and completely covered, then the
production setup of `deployment.py` (deploy/dagster.yaml on a scratch instance database, a gRPC
code server, one `dagster-daemon run`, the webserver), the alert sensor posting to a local
webhook. Edits are written through the CMS writer at `--rate` per second, round-robin over the
collections, for `--minutes`, each timed from its commit to its projection (`live.py`).

Every `--report-minutes` a window is reported: the instance's bytes and rows per table and
their growth per hour, RSS per process, latency p50/p95/max of the window's edits, runs created
in it by job and status, their queue waits, alert posts, FAILURE ticks. At the end: `verify`,
growth per hour over the whole soak, RSS growth over its last 30 minutes (its second half if it
is shorter), and the instance's size after 30 days with deploy/dagster.yaml's tick retention
and the instance pruning's defaults (`soak_samples.thirty_day_projection`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import click
import dagster as dg

from media_usage_orchestration.bench.database import console, index_is_verified
from media_usage_orchestration.bench.deployment import (
    ProductionSetup,
    production_setup,
    run_moments,
)
from media_usage_orchestration.bench.live import (
    LiveLoad,
    ProjectionWatch,
    entries_per_collection,
    epoch_seconds,
    percentile,
    prepare_content,
    rounded,
    write_edits,
)
from media_usage_orchestration.bench.measure import peak_rss_mb
from media_usage_orchestration.bench.soak_samples import (
    accumulating_mb_per_hour,
    database_mb_per_hour,
    directory_bytes,
    growth_by_kind,
    growth_per_hour,
    hours_between,
    process_rss,
    rss_growth,
    thirty_day_projection,
)
from media_usage_orchestration.bench.sql.dagster_instance import (
    InstanceSample,
    instance_database_engine,
    instance_tables,
)
from media_usage_orchestration.bench.webhook import Receiver, receiving
from media_usage_orchestration.dagster_kit.dagster_internals import TickStatus
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.partitions import media_usage_collections
from media_usage_orchestration.sensors.alerts import ALERT_WEBHOOK_ENV
from media_usage_orchestration.sensors.work import media_usage_work_sensor
from media_usage_orchestration.store.core.engine import Engine, create_database_engine

RSS_JUDGED_MINUTES = 30.0
LONG_LIVED = ("code_server", "daemon", "webserver")
TARGETS = {
    "instance_mb_per_hour": 2.0,
    "event_logs_rows_per_hour": 1500,
    "p95_seconds": 2.0,
    "max_seconds": 10.0,
    "rss_growth_last_30_min": 0.10,
    "alerts": 0,
    "failed_runs": 0,
    "failure_ticks": 0,
}


@dataclass(frozen=True)
class SoakLoad:
    url: str  # the CMS database (a fresh schema)
    server: str  # where the instance's scratch database goes
    entries: int
    collections: int
    rate: float
    minutes: float
    report_minutes: float

    def live_load(self) -> LiveLoad:
        return LiveLoad(
            self.url, self.entries, self.collections, self.rate, self.minutes * 60.0, 0.0
        )


@dataclass
class Soak:
    """What the soak keeps while it runs: the setup, the edits' watch, the alert webhook, and
    one sample of the instance and the processes per report."""

    setup: ProductionSetup
    instance_engine: Engine
    watch: ProjectionWatch
    alerts: Receiver
    samples: list[tuple[InstanceSample, dict[str, float]]] = field(default_factory=list)

    def sample(self) -> tuple[InstanceSample, dict[str, float]]:
        with self.instance_engine.connect() as connection:
            tables = instance_tables(connection)
        leaders = {name: process.pid for name, process in self.setup.processes.items()}
        processes = process_rss(leaders)
        # Files the instance keeps beside its database: the runs' captured stdout and stderr.
        processes["home_storage_mb"] = round(directory_bytes(self.setup.home) / 1e6, 2)
        taken = (tables, processes)
        self.samples.append(taken)
        return taken


# --- the run ------------------------------------------------------------------------------------


def run_soak(load: SoakLoad) -> dict:
    engine = create_database_engine(load.url)
    try:
        collections = prepare_content(engine, load.live_load())
        console.print(
            f"{len(collections)} collections, {entries_per_collection(load.live_load())} entries "
            "each, coverage complete; starting the production setup"
        )
        with (
            receiving() as alerts,
            production_setup(
                load.url,
                instance_server=load.server,
                environment={ALERT_WEBHOOK_ENV: alerts.url},
            ) as setup,
        ):
            setup.instance.add_dynamic_partitions(
                media_usage_collections.name, [collection.slug for collection in collections]
            )
            instance_engine = instance_database_engine(setup.environment)
            try:
                soak = Soak(setup, instance_engine, ProjectionWatch(engine), alerts)
                return _soak(engine, load, collections, soak)
            finally:
                instance_engine.dispose()
    finally:
        engine.dispose()


def _soak(engine: Engine, load: SoakLoad, collections, soak: Soak) -> dict:
    _wait_for_work_sensor(soak.setup)
    watcher = threading.Thread(target=soak.watch.run, name="projection-watch", daemon=True)
    watcher.start()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            write_edits(CmsWriter(engine), load.live_load(), collections, soak.watch)
        except BaseException as error:  # reported, and the soak stops writing
            failures.append(error)

    soak.sample()
    started = time.time()
    writer = threading.Thread(target=write, name="soak-edits", daemon=True)
    writer.start()
    console.print(
        f"{load.rate:g} edits/s over {len(collections)} collections for {load.minutes:g} min, "
        f"a report every {load.report_minutes:g} min"
    )
    windows = []
    try:
        end = started + load.minutes * 60.0
        boundary = started
        while boundary < end and not failures:
            boundary = min(end, boundary + load.report_minutes * 60.0)
            time.sleep(max(0.0, boundary - time.time()))
            soak.sample()
            windows.append(window_record(soak, len(soak.samples) - 2))
            print_window(windows[-1])
        writer.join()
        soak.watch.wait_projected()
    finally:
        soak.watch.stopped.set()
        watcher.join()
    if failures:
        raise click.ClickException(f"writing edits failed: {failures[0]!r}")
    # Each window again, now that every edit has landed.
    windows = [window_record(soak, index) for index in range(len(soak.samples) - 1)]
    return soak_record(engine, load, soak, windows)


def _wait_for_work_sensor(setup: ProductionSetup) -> None:
    """Until the work sensor has ticked: edits from then on are timed, not the start-up."""

    def ticked() -> bool:
        for state in setup.instance.all_instigator_state():
            if state.instigator_name == media_usage_work_sensor.name:
                return bool(setup.instance.get_ticks(state.instigator_origin_id, state.selector_id))
        return False

    setup.wait_for(ticked, "the work sensor's first tick")


# --- a window -----------------------------------------------------------------------------------


def window_record(soak: Soak, index: int) -> dict:
    """The window between samples `index` and `index + 1`."""
    (first, _), (last, last_rss) = soak.samples[index], soak.samples[index + 1]
    instance = soak.setup.instance
    runs = instance.get_run_records(
        filters=dg.RunsFilter(created_after=_utc(first.at), created_before=_utc(last.at))
    )
    growth = growth_per_hour(first, last)
    latencies = _latencies(soak.watch, first.at, last.at)
    moments = (run_moments(instance, record.dagster_run.run_id) for record in runs)
    waits = [each.queue_wait for each in moments if each.queue_wait is not None]
    return {
        "minute": round((last.at - soak.samples[0][0].at) / 60.0, 1),
        "instance_mb": round(last.database_bytes / 1e6, 2),
        "instance_mb_per_hour": round(database_mb_per_hour(first, last), 2),
        "tables": {
            name: {
                "mb": round(table.bytes / 1e6, 3),
                "rows": table.rows,
                "mb_per_hour": round(growth[name]["bytes"] / 1e6, 3),
                "rows_per_hour": round(growth[name]["rows"]),
            }
            for name, table in last.tables.items()
        },
        "rss_mb": last_rss,
        "edits": len(latencies),
        "latency_seconds": _spread(latencies),
        "runs": dict(
            Counter(f"{r.dagster_run.job_name} {r.dagster_run.status.value}" for r in runs)
        ),
        "queue_wait_seconds": _spread(waits),
        "alerts": soak.alerts.posts_between(first.at, last.at),
        "failure_ticks": _failure_ticks(instance, first.at, last.at),
    }


def _latencies(watch: ProjectionWatch, start: float, end: float) -> list[float]:
    with watch.lock:
        edits = [edit for edit in watch.expected if start <= epoch_seconds(edit.committed_at) < end]
    return watch.latencies(edits)


def _spread(seconds: Sequence[float]) -> dict:
    return {
        "p50": rounded(percentile(seconds, 0.5)),
        "p95": rounded(percentile(seconds, 0.95)),
        "max": rounded(max(seconds, default=None)),
    }


def _failure_ticks(instance: dg.DagsterInstance, start: float, end: float) -> int:
    count = 0
    for state in instance.all_instigator_state():
        count += len(
            instance.get_ticks(
                state.instigator_origin_id,
                state.selector_id,
                after=start,
                before=end,
                statuses=[TickStatus.FAILURE],
            )
        )
    return count


def _utc(moment: float) -> datetime:
    return datetime.fromtimestamp(moment, UTC)


# --- the whole soak -------------------------------------------------------------------------------


def soak_record(engine: Engine, load: SoakLoad, soak: Soak, windows: list[dict]) -> dict:
    (first, _), (last, _) = soak.samples[0], soak.samples[-1]
    latencies = soak.watch.latencies(soak.watch.expected)
    growth = growth_per_hour(first, last)
    hours = hours_between(first, last)
    runs = Counter()
    for window in windows:
        runs.update(window["runs"])
    record = {
        "workload": "soak",
        "dialect": "postgresql",
        "minutes": load.minutes,
        "rate": load.rate,
        "collections": load.collections,
        "entries": entries_per_collection(load.live_load()) * load.collections,
        "edits": len(soak.watch.expected),
        "projected": len(latencies),
        "latency_seconds": _spread(latencies),
        "instance_mb_start": round(first.database_bytes / 1e6, 2),
        "instance_mb_end": round(last.database_bytes / 1e6, 2),
        "instance_mb_per_hour": round(database_mb_per_hour(first, last), 2),
        "growth_mb_per_hour_by_kind": growth_by_kind(first, last),
        "accumulating_mb_per_hour": accumulating_mb_per_hour(first, last),
        "rows_per_hour": {
            name: round(each["rows"]) for name, each in growth.items() if round(each["rows"])
        },
        "event_types_per_hour": _event_types_per_hour(first, last, hours),
        "ticks_per_hour": _ticks_per_hour(soak.setup.instance, first, last, hours),
        "projection": thirty_day_projection(first, last),
        "runs": dict(runs),
        "failed_runs": sum(count for key, count in runs.items() if key.endswith(" FAILURE")),
        "alerts": soak.alerts.posts_between(0.0, time.time()),
        "failure_ticks": sum(window["failure_ticks"] for window in windows),
        "rss_mb": [rss for _, rss in soak.samples],
        "rss_growth_judged": _judged_rss_growth(soak),
        "verified": index_is_verified(engine),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "windows": windows,
        "targets": TARGETS,
    }
    record["met"] = soak_targets_met(record)
    return record


def _event_types_per_hour(first: InstanceSample, last: InstanceSample, hours: float) -> dict:
    gained = {
        kind: round((rows - first.event_types.get(kind, 0)) / hours)
        for kind, rows in last.event_types.items()
    }
    return dict(sorted(((k, v) for k, v in gained.items() if v), key=lambda kv: -kv[1]))


def _ticks_per_hour(
    instance: dg.DagsterInstance, first: InstanceSample, last: InstanceSample, hours: float
) -> dict[str, int]:
    """Tick rows written per hour by each sensor and schedule (purged ones aside)."""
    names = {
        state.instigator_origin_id: state.instigator_name
        for state in instance.all_instigator_state()
    }
    gained = {
        names.get(origin, origin): round((rows - first.tick_origins.get(origin, 0)) / hours)
        for origin, rows in last.tick_origins.items()
    }
    return dict(sorted(gained.items(), key=lambda item: -item[1]))


def _judged_rss_growth(soak: Soak) -> dict:
    """RSS growth of the long-lived processes over the soak's last 30 minutes (its second half
    if it is shorter): from the last sample at least that long before the end."""
    last_at, last_rss = soak.samples[-1][0].at, soak.samples[-1][1]
    span = min(RSS_JUDGED_MINUTES * 60.0, (last_at - soak.samples[0][0].at) / 2)
    earlier = [rss for sample, rss in soak.samples if sample.at <= last_at - span]
    first_rss = earlier[-1] if earlier else soak.samples[0][1]
    growth = rss_growth(first_rss, last_rss)
    return {"minutes": round(span / 60.0, 1), "growth": growth}


def soak_targets_met(record: dict) -> bool:
    latency = record["latency_seconds"]
    growth = record["rss_growth_judged"]["growth"]
    return (
        record["verified"]
        and record["projected"] == record["edits"]
        and latency["p95"] is not None
        and latency["p95"] <= TARGETS["p95_seconds"]
        and latency["max"] <= TARGETS["max_seconds"]
        and record["accumulating_mb_per_hour"] <= TARGETS["instance_mb_per_hour"]
        and record["rows_per_hour"].get("event_logs", 0) <= TARGETS["event_logs_rows_per_hour"]
        and all(
            (growth.get(name) or 0.0) <= TARGETS["rss_growth_last_30_min"] for name in LONG_LIVED
        )
        and record["alerts"] <= TARGETS["alerts"]
        and record["failed_runs"] <= TARGETS["failed_runs"]
        and record["failure_ticks"] <= TARGETS["failure_ticks"]
    )


# --- output -------------------------------------------------------------------------------------


def print_window(window: dict) -> None:
    latency = window["latency_seconds"]
    tables = window["tables"]
    events = tables.get("event_logs", {})
    rss = window["rss_mb"]
    console.print(
        f"[bold]{window['minute']:g} min[/]: instance {window['instance_mb']} MB "
        f"(+{window['instance_mb_per_hour']} MB/h; event_logs {events.get('rows', 0):,} rows, "
        f"+{events.get('rows_per_hour', 0):,}/h); {window['edits']} edits, latency p50 "
        f"{latency['p50']} s, p95 {latency['p95']} s, max {latency['max']} s; runs "
        + (", ".join(f"{k} {v}" for k, v in sorted(window["runs"].items())) or "none")
        + f"; queue wait p95 {window['queue_wait_seconds']['p95']} s; RSS "
        + ", ".join(f"{name} {rss.get(name)} MB" for name in LONG_LIVED)
        + f", {rss.get('run_workers', 0):g} run worker(s) {rss.get('run_workers_mb', 0)} MB; "
        f"alerts {window['alerts']}, FAILURE ticks {window['failure_ticks']}"
    )


def print_soak(record: dict) -> None:
    latency = record["latency_seconds"]
    projection = record["projection"]
    growth = record["rss_growth_judged"]
    console.print(
        f"soak ({record['minutes']:g} min, {record['rate']:g} edits/s over "
        f"{record['collections']} collections): {record['projected']}/{record['edits']} "
        f"projected, latency p50 {latency['p50']} s, p95 [bold]{latency['p95']}[/] s, max "
        f"{latency['max']} s; instance {record['instance_mb_start']} -> "
        f"{record['instance_mb_end']} MB ({record['instance_mb_per_hour']} MB/h, of which "
        f"[bold]{record['accumulating_mb_per_hour']} MB/h[/] stays past a day, "
        f"event_logs +{record['rows_per_hour'].get('event_logs', 0):,} rows/h); after 30 days "
        f"[bold]{projection['total_mb']} MB[/] with pruning (kept for good "
        f"{projection['kept_for_good_mb']} MB; {projection['without_pruning_mb']} MB "
        f"without); RSS growth over the last {growth['minutes']:g} min: "
        + ", ".join(
            f"{name} {value:+.1%}" for name, value in growth["growth"].items() if value is not None
        )
        + f"; runs {sum(record['runs'].values())} ({record['failed_runs']} failed), alerts "
        f"{record['alerts']}, FAILURE ticks {record['failure_ticks']}; verify "
        f"{'clean' if record['verified'] else 'NOT clean'}; targets met: {record['met']}"
    )


__all__ = ["SoakLoad", "print_soak", "run_soak"]
