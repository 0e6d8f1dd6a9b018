"""One measurement: a reconciliation from scratch (driver or Dagster), or captured work
processed, timed per phase with the statements each phase sent.

`reconcile` fills one collection with N entries before capture is activated, as an existing
CMS would have them, then times a reconciliation to complete coverage, either with the
Dagster-free driver (`run_to_completion`) or through real Dagster runs requested by the sensors
and executed in an instance. `work` times N captured work items (entries written after
activation) processed by the batch processor or by EmDash's one-job tick. With workers, that
many processes drain in parallel: the reconciliation's (or this process's) own drain and
`workers - 1` work runs in other processes, released when the drain begins.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import json
import pstats
import resource
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import click

from media_usage_orchestration.bench.database import (
    COLLECTION_SLUG,
    console,
    coverage_is_complete,
    create_collection,
    index_is_verified,
    insert_entries,
)
from media_usage_orchestration.bench.workers import WorkerPool
from media_usage_orchestration.emdash_double.cms_writer import Collection
from media_usage_orchestration.emdash_double.statement_counter import counting_statements
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.processing.loop.phases import (
    OTHER,
    PHASES,
    PhaseClock,
    phase,
    timing,
)
from media_usage_orchestration.processing.reconciliation.driver import run_to_completion
from media_usage_orchestration.processing.reconciliation.model import (
    DRAIN_BATCH_SIZE,
    ReconciliationOutcome,
)
from media_usage_orchestration.processing.work.processor import process_due_batch, process_due_work
from media_usage_orchestration.store.core.engine import Engine, create_database_engine
from media_usage_orchestration.store.host.registry import read_collection_slugs

# Work runs beside a reconciliation claim batches of the drain's size.
WORK_BATCH_SIZE = DRAIN_BATCH_SIZE
MAX_DRIVER_RUNS = 100
DRIVER_DONE = (
    ReconciliationOutcome.COMPLETED,
    ReconciliationOutcome.ALREADY_COMPLETE,
    ReconciliationOutcome.FAILED,
)
PROFILE_TOP_FUNCTIONS = 20
# The jobs whose runs a Dagster-mode measurement compares with their floor (bench/floor.py).
RECONCILIATION_JOB = "media_usage_reconciliation"
WORK_JOB = "media_usage_work"


def peak_rss_mb() -> float:
    """Peak resident set size of this process (Linux reports kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
    workers: int = 1
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    phase_statements: Mapping[str, int] = field(default_factory=dict)
    extra: Mapping[str, object] = field(default_factory=dict)

    @property
    def statements(self) -> int:
        return sum(self.phase_statements.values())

    def per_entry(self, count: int) -> float:
        return round(count / self.entries, 2)

    def record(self) -> dict:
        record = {
            "mode": self.mode,
            "dialect": self.dialect,
            "entries": self.entries,
            "seconds": round(self.seconds, 3),
            "entries_per_second": round(self.entries / self.seconds, 1) if self.seconds else None,
            "runs": self.runs,
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "verified": self.verified,
            "workers": self.workers,
            "statements": self.statements,
            "statements_per_entry": self.per_entry(self.statements),
            "phases": {
                name: {
                    "seconds": round(self.phase_seconds.get(name, 0.0), 3),
                    "statements": self.phase_statements.get(name, 0),
                    "statements_per_entry": self.per_entry(self.phase_statements.get(name, 0)),
                }
                for name in (*PHASES, OTHER)
            },
        }
        if self.workload == "work":
            record.update(workload=self.workload, path=self.path)
        record.update(self.extra)
        return record

    def as_json(self) -> str:
        return json.dumps(self.record())


# --- timing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timed:
    runs: int
    phase_seconds: dict[str, float]
    phase_statements: dict[str, int]

    @property
    def seconds(self) -> float:
        return sum(self.phase_seconds.values())


def timed(
    url: str,
    action: Callable[[], int],
    *,
    on_enter: Mapping[str, Callable[[], None]] | None = None,
    profile: str | None = None,
) -> Timed:
    """Run `action` (it returns how many runs it took) with a phase clock installed and every
    statement to the database at `url` counted by the phase it ran in; with `profile`, under
    cProfile, written to that file."""
    clock = PhaseClock(on_enter=on_enter)
    with counting_statements(url, label=lambda: clock.current) as counts, timing(clock):
        with _profiled(profile):
            runs = action()
        seconds = clock.stop()
    return Timed(runs, seconds, counts.by_label())


@contextlib.contextmanager
def _profiled(path: str | None) -> Iterator[None]:
    if path is None:
        yield
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        profiler.dump_stats(path)
        report = io.StringIO()
        stats = pstats.Stats(profiler, stream=report).sort_stats("cumulative")
        stats.print_stats(PROFILE_TOP_FUNCTIONS)
        console.print(f"profile written to {path}; top {PROFILE_TOP_FUNCTIONS} by cumulative time:")
        console.out(report.getvalue().strip(), highlight=False)


@contextlib.contextmanager
def work_runs(url: str, workers: int) -> Iterator[WorkerPool | None]:
    """`workers - 1` work-run processes, started and waiting (none for one worker)."""
    if workers <= 1:
        yield None
        return
    pool = WorkerPool(url, workers - 1, WORK_BATCH_SIZE)
    try:
        pool.start()
        yield pool
    finally:
        pool.stop()


def _with_work_runs(timing_of: Timed, pool: WorkerPool | None) -> Timed:
    """The work runs' statements join the drain's (their time is the drain's, by the clock)."""
    if pool is None:
        return timing_of
    reports = pool.join()
    statements = dict(timing_of.phase_statements)
    statements["drain"] = statements.get("drain", 0) + sum(each.statements for each in reports)
    return Timed(timing_of.runs, timing_of.phase_seconds, statements)


# --- drivers ------------------------------------------------------------------------------------


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
        with phase("drain"):
            while True:
                calls += 1
                if path == "batch":
                    claimed = process_due_batch(self.engine, WORK_BATCH_SIZE).counts.claimed
                else:
                    claimed = process_due_work(self.engine).counts.claimed
                if claimed == 0:
                    return calls


def reconciled_collection(engine: Engine, entries: int) -> Collection:
    """A collection of `entries` sample entries, capture active, reconciled to complete
    coverage by the driver (the starting point of the scrubber and GC measurements)."""
    collection = create_collection(engine)
    insert_entries(engine, entries)
    activate(engine)
    DriverMode(engine, collection).reconcile()
    if not coverage_is_complete(engine, collection):
        raise RuntimeError("coverage is not complete after the reconciliation")
    return collection


class DagsterLane:
    """What the daemon does, in this process: evaluate the given sensors and execute every run
    they request as a real run in the instance until none is requested (`lane(sensors)`
    returns how many runs that took); and the floor of a job beside those runs."""

    def __init__(self, instance, resources: Mapping[str, object]) -> None:
        self.instance = instance
        self.resources = resources
        self.runs: list = []

    def __call__(self, sensors: tuple) -> int:
        from media_usage_orchestration.local.in_process_lane import run_lane

        lane = run_lane(self.instance, self.resources, sensors=sensors, log_level="WARNING")
        runs = [run for run in lane if run.job_name != "partitions"]
        failed = [run for run in runs if not run.success]
        if failed:
            raise click.ClickException(f"{len(failed)} of {len(runs)} runs failed ({failed[0]})")
        self.runs += runs
        return len(runs)

    def floor(self, job_name: str, partition_key: str | None):
        """One run of the job's empty twin (`floor.py`) in the same instance; what it cost."""
        from media_usage_orchestration.bench.floor import execute_floor, run_cost

        run_id = execute_floor(self.instance, job_name, self.resources, partition_key)
        return run_cost(self.instance, run_id)

    def costs(self, job_name: str) -> list:
        """What each of the lane's runs of `job_name` cost."""
        from media_usage_orchestration.bench.floor import run_cost

        return [
            run_cost(self.instance, run.result.run_id)
            for run in self.runs
            if run.job_name == job_name
        ]


@contextlib.contextmanager
def dagster_lane(url: str) -> Iterator[DagsterLane]:
    """A Dagster instance and the resources runs get, ready before the clock starts."""

    from media_usage_orchestration.bench.instance import bench_instance
    from media_usage_orchestration.resources.automation import MediaUsageAutomation
    from media_usage_orchestration.resources.database import MediaUsageDatabase

    # The lane executes one run at a time in this process: a work run ends once drained.
    automation = MediaUsageAutomation(work_linger_seconds=0)
    resources = {"database": MediaUsageDatabase.for_url(url), "automation": automation}
    with bench_instance(url) as instance:
        _as_deployed(instance, url)
        yield DagsterLane(instance, resources)


def timed_beside_floor(
    workload: Workload, sensors: tuple, job_name: str, partition_key: str | None
) -> tuple[Timed, dict]:
    """The lane's runs timed, and the floor of `job_name` run in the same instance before and
    after them, outside the clock (after one floor run that warms the process up and is not
    counted: a deployment's instance has run runs before); the floor's numbers beside the
    real runs' (`floor.floor_record`)."""
    from media_usage_orchestration.bench.floor import floor_record

    with dagster_lane(workload.url) as lane:
        lane.floor(job_name, partition_key)
        floors = [lane.floor(job_name, partition_key)]
        measured = timed(workload.url, lambda: lane(sensors), profile=workload.profile)
        floors.append(lane.floor(job_name, partition_key))
        return measured, floor_record(lane.costs(job_name), floors)


def _as_deployed(instance, url: str) -> None:
    """The instance as a running deployment's is before a reconciliation: every registry
    collection has its partition (activation adds them, as the activation job does), and the
    run and event-log storage (with its asset index shard) have been opened before."""
    import dagster as dg

    from media_usage_orchestration.assets.index import MEDIA_USAGE_INDEX
    from media_usage_orchestration.partitions import media_usage_collections, partition_changes

    engine = create_database_engine(url)
    try:
        slugs = read_collection_slugs(engine)
    finally:
        engine.dispose()
    added, _removed = partition_changes(instance, slugs)
    if added:
        instance.add_dynamic_partitions(media_usage_collections.name, added)
    instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=MEDIA_USAGE_INDEX), limit=1)


def lane_sensors(*names: str) -> tuple:
    from media_usage_orchestration import sensors

    return tuple(getattr(sensors, name) for name in names)


# --- workloads ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    url: str
    entries: int
    mode: str
    workers: int = 1
    profile: str | None = None
    # Floor mode: a second fresh database, reconciled by the driver to compare end states.
    reference_url: str | None = None


def run_reconcile(workload: Workload) -> BenchResult:
    engine = create_database_engine(workload.url)
    try:
        collection = create_collection(engine)
        insert_entries(engine, workload.entries)
        activate(engine)
        console.print(
            f"{workload.entries} entries in {COLLECTION_SLUG!r}; capture active; reconciling"
            + (f" ({workload.workers} workers drain)" if workload.workers > 1 else "")
        )
        measured, floor = _measure_reconcile(workload, engine, collection)
        complete = coverage_is_complete(engine, collection)
        verified = complete and index_is_verified(engine)
        if workload.mode == "floor":
            floor = compare_with_driver(engine, collection, workload)
            verified = verified and floor["equal_to_driver"]
        return _result(workload, engine, measured, verified, "reconcile", extra=floor)
    finally:
        engine.dispose()


def compare_with_driver(engine: Engine, collection: Collection, workload: Workload) -> dict:
    """The floor's end state beside the driver's on a database seeded the same way (same
    collection identity, same entries), outside the clock."""
    from media_usage_orchestration.bench.drain_floor import end_state_digest

    if workload.reference_url is None:
        raise click.ClickException("the floor needs a reference database to compare with")
    floor = end_state_digest(engine, collection)
    reference = create_database_engine(workload.reference_url)
    try:
        same = create_collection(reference, collection_id=collection.id)
        insert_entries(reference, workload.entries)
        activate(reference)
        DriverMode(reference, same).reconcile()
        driver = end_state_digest(reference, same)
    finally:
        reference.dispose()
    equal = floor == driver
    console.print(
        f"floor end state {floor['sources']} sources, {floor['occurrences']} occurrences; "
        f"the driver's {driver['sources']}, {driver['occurrences']}: "
        + ("equal" if equal else "[red]DIFFERENT[/]")
    )
    return {"equal_to_driver": equal, "end_state_digest": floor["digest"]}


def _measure_reconcile(
    workload: Workload, engine: Engine, collection: Collection
) -> tuple[Timed, dict]:
    if workload.mode == "dagster":
        sensors = lane_sensors("media_usage_reconciliation_sensor", "media_usage_work_sensor")
        return timed_beside_floor(workload, sensors, RECONCILIATION_JOB, collection.slug)
    if workload.mode == "floor":
        from media_usage_orchestration.bench.drain_floor import reconcile_floor

        return _driven(workload, lambda: reconcile_floor(engine, collection)), {}
    return _driven(workload, DriverMode(engine, collection).reconcile), {}


def _driven(workload: Workload, action: Callable[[], int]) -> Timed:
    """`action` timed in this process, with `workload.workers - 1` work runs released when its
    drain begins."""
    with work_runs(workload.url, workload.workers) as pool:
        measured = timed(
            workload.url,
            action,
            on_enter={"drain": pool.release} if pool else None,
            profile=workload.profile,
        )
        return _with_work_runs(measured, pool)


def run_work(workload: Workload, path: str) -> BenchResult:
    engine = create_database_engine(workload.url)
    try:
        create_collection(engine)
        activate(engine)
        insert_entries(engine, workload.entries)
        console.print(
            f"{workload.entries} captured work items in {COLLECTION_SLUG!r}; processing ({path})"
        )
        floor = {}
        if workload.mode == "dagster":
            sensors = lane_sensors("media_usage_work_sensor")
            measured, floor = timed_beside_floor(workload, sensors, WORK_JOB, None)
        else:
            driver = DriverMode(engine, None)
            measured = _driven(workload, lambda: driver.process_work(path))
        verified = index_is_verified(engine)
        return _result(workload, engine, measured, verified, "work", path, extra=floor)
    finally:
        engine.dispose()


def _result(
    workload: Workload,
    engine: Engine,
    measured: Timed,
    verified: bool,
    kind: str,
    path: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> BenchResult:
    return BenchResult(
        mode=workload.mode,
        dialect=engine.dialect.name,
        entries=workload.entries,
        seconds=measured.seconds,
        runs=measured.runs,
        verified=verified,
        workload=kind,
        path=path,
        workers=workload.workers,
        phase_seconds=measured.phase_seconds,
        phase_statements=measured.phase_statements,
        extra=dict(extra or {}),
    )
