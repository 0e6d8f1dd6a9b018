"""`media-usage bench --workload live`: how long an edit waits for the index, with a real
daemon, and whether an idle deployment launches runs.

On a fresh database, `--collections` collections of sample content (`--entries` in all) are
activated and reconciled to complete coverage first. Then a real `dagster-daemon run` (see
`daemon.py`) runs the sensors on a temporary instance, and edits are written through the CMS
writer at `--rate` edits per second for `--seconds`: each edit gives one existing entry a new
hero image (a media field, so the projection must change), round-robin over the collections,
each entry edited once while there are entries left. Then nothing is written for
`--idle-seconds`.

Per edit, both ends are database time written by the database itself: the commit time is the
entry's `updated_at` that the edit's transaction writes, and the projection time is the
`indexed_at` that the projecting transaction writes on the entry's source row (the write
lease's `created_at`, in the same transaction). A watcher thread reads the source rows of
unprojected edits every `WATCH_SECONDS` until their `source_version` reaches the edit's
version; the poll only finds the rows, it does not time them, so the latency's resolution is
the timestamps' millisecond.

Runs are counted by creation time (their first event, when they were submitted): during the
load, and in the idle window after the last edit. Runs launched during the load that end in
the idle window are not launched in it.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import click
import dagster as dg

from media_usage_orchestration.bench.daemon import RunningDaemon, running_daemon, running_in_group
from media_usage_orchestration.bench.database import (
    console,
    coverage_is_complete,
    create_collection,
    insert_entries,
)
from media_usage_orchestration.bench.measure import DriverMode, peak_rss_mb
from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_ID_TAG, IN_FLIGHT_STATUSES
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, Collection
from media_usage_orchestration.jobs import media_usage_work
from media_usage_orchestration.media.sources import source_key
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.resources.automation import work_linger_from_environment
from media_usage_orchestration.sensors.work import media_usage_work_sensor
from media_usage_orchestration.store.core.engine import Engine, create_database_engine
from media_usage_orchestration.store.sources.rows import sources_by_key

# (slug, entry id prefix) of the collections, in order.
LIVE_COLLECTIONS = (
    ("articles", "art"),
    ("pages", "pag"),
    ("products", "pro"),
    ("events", "evt"),
    ("recipes", "rec"),
    ("authors", "aut"),
)
COLUMNS_VARIANT = "columns"
WATCH_SECONDS = 0.1
# After the idle window, how long edits still unprojected may take before they count as lost.
PROJECTION_GRACE_SECONDS = 120.0
TARGETS = {"p50_seconds": 3.0, "p95_seconds": 10.0, "runs_in_idle": 0}
DATABASE_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


@dataclass(frozen=True)
class LiveLoad:
    url: str
    entries: int
    collections: int
    rate: float
    seconds: float
    idle_seconds: float

    @property
    def edits(self) -> int:
        return max(1, round(self.rate * self.seconds))


@dataclass(frozen=True)
class Edit:
    index: int
    collection: Collection
    content_id: str
    version: int
    committed_at: str  # the entry's updated_at, written by the edit's transaction

    @property
    def source_key(self) -> str:
        return source_key(self.collection.id, self.content_id, COLUMNS_VARIANT)


def database_time(text: str) -> datetime:
    return datetime.strptime(text, DATABASE_TIME_FORMAT)


def epoch_seconds(text: str) -> float:
    """A database timestamp (UTC) on the clock Dagster stamps its events with."""
    return database_time(text).replace(tzinfo=UTC).timestamp()


# --- content ------------------------------------------------------------------------------------


def prepare_content(engine: Engine, load: LiveLoad) -> list[Collection]:
    """The collections with their share of the entries, captured and completely covered."""
    collections = []
    for slug, prefix in LIVE_COLLECTIONS[: load.collections]:
        collections.append(create_collection(engine, slug))
        insert_entries(engine, entries_per_collection(load), slug, prefix)
    activate(engine)
    for collection in collections:
        DriverMode(engine, collection).reconcile()
        if not coverage_is_complete(engine, collection):
            raise click.ClickException(f"coverage of {collection.slug} is not complete")
    return collections


def entries_per_collection(load: LiveLoad) -> int:
    return max(1, load.entries // load.collections)


def edit_target(load: LiveLoad, collections: Sequence[Collection], index: int):
    """Edit `index`'s collection and entry id: round-robin over the collections, then over
    each collection's entries."""
    collection_index = index % len(collections)
    prefix = LIVE_COLLECTIONS[collection_index][1]
    entry = (index // len(collections)) % entries_per_collection(load)
    return collections[collection_index], f"{prefix}-e{entry:05d}"


# --- the watcher --------------------------------------------------------------------------------


@dataclass
class ProjectionWatch:
    """Finds, from its own thread, when each edit's source row shows the edit's version."""

    engine: Engine
    pending: dict[int, Edit] = field(default_factory=dict)
    expected: list[Edit] = field(default_factory=list)  # every edit, in order
    projected_at: dict[int, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: threading.Event = field(default_factory=threading.Event)

    def expect(self, edit: Edit) -> None:
        with self.lock:
            self.pending[edit.index] = edit
            self.expected.append(edit)

    def unprojected(self) -> int:
        with self.lock:
            return len(self.pending)

    def run(self) -> None:
        while not self.stopped.wait(WATCH_SECONDS):
            self.look()

    def wait_projected(self, grace: float = PROJECTION_GRACE_SECONDS) -> None:
        """Until every expected edit is projected or `grace` seconds have passed; then one
        last look."""
        deadline = time.monotonic() + grace
        while self.unprojected() and time.monotonic() < deadline:
            time.sleep(WATCH_SECONDS)
        self.look()

    def look(self) -> None:
        with self.lock:
            pending = list(self.pending.values())
        if not pending:
            return
        with self.engine.connect() as connection:
            rows = sources_by_key(connection, [edit.source_key for edit in pending])
        with self.lock:
            for edit in pending:
                row = rows.get(edit.source_key)
                if row is not None and (row.source_version or 0) >= edit.version:
                    self.projected_at[edit.index] = row.indexed_at
                    self.pending.pop(edit.index, None)

    def latencies(self, edits: Sequence[Edit]) -> list[float]:
        """Seconds from each projected edit's commit to its projection, in edit order."""
        return [
            (
                database_time(self.projected_at[edit.index]) - database_time(edit.committed_at)
            ).total_seconds()
            for edit in edits
            if edit.index in self.projected_at
        ]


def write_edits(
    writer: CmsWriter, load: LiveLoad, collections: Sequence[Collection], watch: ProjectionWatch
) -> list[Edit]:
    """The load: one edit every 1/rate seconds on the monotonic clock (no catching up in
    bursts: an edit that is late is written at once, the next one on its own schedule)."""
    edits = []
    started = time.monotonic()
    for index in range(load.edits):
        time.sleep(max(0.0, started + index / load.rate - time.monotonic()))
        collection, content_id = edit_target(load, collections, index)
        hero = {"id": f"{content_id}-live-{index}", "provider": "local", "mimeType": "image/webp"}
        stamp = writer.update_entry(collection.slug, content_id, {"hero": hero})
        edit = Edit(index, collection, content_id, stamp.version, stamp.updated_at)
        watch.expect(edit)
        edits.append(edit)
    return edits


# --- runs ---------------------------------------------------------------------------------------


# The moments of a run's start, by the first event of each kind: submitted to the queue,
# dequeued and handed to the launcher, its worker process executing, its op starting.
START_EVENTS = {
    "queued": dg.DagsterEventType.RUN_ENQUEUED,
    "launched": dg.DagsterEventType.RUN_STARTING,
    "running": dg.DagsterEventType.RUN_START,
    "op": dg.DagsterEventType.STEP_START,
}


@dataclass(frozen=True)
class LiveRun:
    job_name: str
    collection_id: str | None
    created: float  # its first event: when it was submitted
    started: float | None
    ended: float | None
    in_flight: bool
    events: int  # entries of its event log
    moments: dict[str, float]  # START_EVENTS' names -> the first such event's time


def live_runs(daemon: RunningDaemon) -> list[LiveRun]:
    instance = daemon.instance
    runs = []
    for record in instance.get_run_records():
        run = record.dagster_run
        events = instance.get_records_for_run(run.run_id).records
        created = events[0].timestamp if events else record.create_timestamp.timestamp()
        moments: dict[str, float] = {}
        for event in events:
            kind = event.event_log_entry.dagster_event_type
            for name, wanted in START_EVENTS.items():
                if kind is wanted:
                    moments.setdefault(name, event.timestamp)
        runs.append(
            LiveRun(
                run.job_name,
                run.tags.get(COLLECTION_ID_TAG),
                created,
                record.start_time,
                record.end_time,
                run.status in IN_FLIGHT_STATUSES,
                len(events),
                moments,
            )
        )
    return sorted(runs, key=lambda run: run.created)


def first_runs(edits: Sequence[Edit], runs: Sequence[LiveRun]) -> dict[str, float | None]:
    """Where the first edit of each collection spent its wait for the collection's first work
    run (medians over the collections): until the sensor submitted the run, in the run queue,
    the run worker's start (a process importing the definitions), the op's start."""
    phases: dict[str, list[float]] = {
        "sensor": [],
        "queue": [],
        "worker_start": [],
        "op_start": [],
    }
    for collection_id in {edit.collection.id for edit in edits}:
        first_edit = min(
            epoch_seconds(edit.committed_at)
            for edit in edits
            if edit.collection.id == collection_id
        )
        run = next(
            (
                run
                for run in runs
                if run.job_name == media_usage_work.name
                and run.collection_id == collection_id
                and run.created >= first_edit
            ),
            None,
        )
        if run is None or set(run.moments) != set(START_EVENTS):
            continue
        moments = run.moments
        phases["sensor"].append(run.created - first_edit)
        phases["queue"].append(moments["launched"] - moments["queued"])
        phases["worker_start"].append(moments["running"] - moments["launched"])
        phases["op_start"].append(moments["op"] - moments["running"])
    return {
        name: rounded(statistics.median(values)) if values else None
        for name, values in phases.items()
    }


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile: the smallest value at least `fraction` of them reach."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _median_gap(times: Sequence[float]) -> float | None:
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    return statistics.median(gaps) if gaps else None


# --- the measurement ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    def holds(self, moment: float) -> bool:
        return self.start <= moment < self.end


def run_live(load: LiveLoad) -> dict:
    engine = create_database_engine(load.url)
    try:
        collections = prepare_content(engine, load)
        console.print(
            f"{len(collections)} collections, {entries_per_collection(load)} entries each, "
            "coverage complete; starting dagster-daemon"
        )
        with running_daemon(load.url, [each.slug for each in collections]) as daemon:
            record = _measure(engine, load, collections, daemon)
        # The daemon's group is its own: whatever of it still runs was left behind.
        record["processes_left"] = len(list(running_in_group(daemon.process.pid)))
        return record
    finally:
        engine.dispose()


def _measure(
    engine: Engine, load: LiveLoad, collections: Sequence[Collection], daemon: RunningDaemon
) -> dict:
    console.print(
        f"daemon ticking; {load.edits} edits at {load.rate:g}/s over {len(collections)} "
        f"collection(s), then {load.idle_seconds:g} s idle"
    )
    watch = ProjectionWatch(engine)
    watcher = threading.Thread(target=watch.run, name="projection-watch", daemon=True)
    watcher.start()
    try:
        load_window_start = time.time()
        edits = write_edits(CmsWriter(engine), load, collections, watch)
        load_window = Window(load_window_start, time.time())
        idle = Window(load_window.end, load_window.end + load.idle_seconds)
        time.sleep(max(0.0, idle.end - time.time()))
        watch.wait_projected()
    finally:
        watch.stopped.set()
        watcher.join()
    ticks = daemon.sensor_ticks(media_usage_work_sensor.name, load_window.start, load_window.end)
    return live_record(engine, load, edits, watch, live_runs(daemon), load_window, idle, ticks)


def live_record(
    engine: Engine,
    load: LiveLoad,
    edits: Sequence[Edit],
    watch: ProjectionWatch,
    runs: Sequence[LiveRun],
    load_window: Window,
    idle: Window,
    ticks: Sequence,
) -> dict:
    latencies = watch.latencies(edits)
    during = [run for run in runs if load_window.holds(run.created)]
    in_idle = [run for run in runs if idle.holds(run.created)]
    work_runs = [run for run in during if run.job_name == media_usage_work.name]
    work_starts = [run.started - run.created for run in work_runs if run.started is not None]
    work_events = [run.events for run in work_runs if not run.in_flight]
    record = {
        "workload": "live",
        "dialect": engine.dialect.name,
        "instance_storage": "postgresql" if engine.dialect.name == "postgresql" else "sqlite",
        "collections": load.collections,
        "entries": entries_per_collection(load) * load.collections,
        "edits_spread": "round-robin over the collections",
        "rate": load.rate,
        "seconds": load.seconds,
        "idle_seconds": load.idle_seconds,
        "linger_seconds": work_linger_from_environment(),
        "edits": len(edits),
        # the rate achieved: edits after the first over the time from the first to the last
        "edits_per_second": round((len(edits) - 1) / (load_window.end - load_window.start), 2),
        "projected": len(latencies),
        "latency_seconds": {
            "p50": rounded(percentile(latencies, 0.50)),
            "p95": rounded(percentile(latencies, 0.95)),
            "max": rounded(max(latencies, default=None)),
            "first": rounded(latencies[0] if latencies else None),
        },
        "latency_resolution": "database timestamps (ms): commit updated_at, source indexed_at",
        "runs_during_load": len(during),
        "runs_in_idle": len(in_idle),
        "runs_in_idle_by_job": dict(Counter(run.job_name for run in in_idle)),
        "runs_by_job": dict(Counter(run.job_name for run in during)),
        "runs_in_flight_at_end": sum(run.in_flight for run in runs),
        "work_run_start_seconds": {
            "median": rounded(statistics.median(work_starts) if work_starts else None),
            "max": rounded(max(work_starts, default=None)),
        },
        "first_run_seconds": first_runs(edits, runs),
        "work_run_events": {
            "median": statistics.median(work_events) if work_events else None,
            "max": max(work_events, default=None),
        },
        "work_sensor_tick_interval_seconds": rounded(
            _median_gap([tick.timestamp for tick in ticks])
        ),
        "load_average": [round(each, 2) for each in os.getloadavg()],
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "targets": TARGETS,
    }
    record["met"] = live_targets_met(record)
    return record


def live_targets_met(record: dict) -> bool:
    latency = record["latency_seconds"]
    return (
        record["projected"] == record["edits"]
        and latency["p50"] is not None
        and latency["p50"] <= TARGETS["p50_seconds"]
        and latency["p95"] <= TARGETS["p95_seconds"]
        and record["runs_in_idle"] <= TARGETS["runs_in_idle"]
    )


def print_live(record: dict) -> None:
    latency = record["latency_seconds"]
    console.print(
        f"live ({record['dialect']}, {record['collections']} collections, "
        f"{record['edits']} edits at {record['rate']:g}/s, linger {record['linger_seconds']:g} s): "
        f"{record['projected']}/{record['edits']} projected, latency p50 "
        f"[bold]{latency['p50']}[/] s, p95 [bold]{latency['p95']}[/] s, max {latency['max']} s; "
        f"runs during load {record['runs_during_load']}, in the idle "
        f"{record['idle_seconds']:g} s [bold]{record['runs_in_idle']}[/]; work sensor tick "
        f"every {record['work_sensor_tick_interval_seconds']} s, work run start "
        f"{record['work_run_start_seconds']['median']} s; first run of a collection: "
        + ", ".join(f"{name} {value} s" for name, value in record["first_run_seconds"].items())
        + f"; load average "
        f"{record['load_average'][0]}; targets met: {record['met']}"
    )


__all__ = ["LiveLoad", "percentile", "print_live", "rounded", "run_live"]
