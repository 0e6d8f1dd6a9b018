"""The deployment tier's shared pieces: a CMS database with captured, completely covered
collections of sample content, the production setup of deploy/README.md over it
(`media_usage_orchestration.bench.deployment`), edits whose projection is watched, and reads of
what the instance recorded (runs by collection, their start moments, queue waits).

The tier runs on PostgreSQL only: it is the deployment the guide describes (instance storage
in PostgreSQL, run workers in processes of their own beside the daemon and the code server),
where SQLite is correct only on one host and is exercised by every other tier.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import dagster as dg

from media_usage_orchestration.bench.database import (
    coverage_is_complete,
    create_collection,
    insert_entries,
)
from media_usage_orchestration.bench.deployment import (
    ProductionSetup,
    _executable,
    production_setup,
)
from media_usage_orchestration.bench.live import (
    LIVE_COLLECTIONS,
    Edit,
    LiveLoad,
    ProjectionWatch,
    prepare_content,
)
from media_usage_orchestration.bench.measure import DriverMode
from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_ID_TAG, IN_FLIGHT_STATUSES
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, Collection
from media_usage_orchestration.partitions import media_usage_collections
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.resources.automation import WORK_LINGER_ENV
from media_usage_orchestration.sensors.common import WAITING_STATUSES
from tests.support.databases import TestDatabase, postgres_admin_url

ENTRIES_PER_COLLECTION = 12
# Queue waits are measured and reported (target: p95 <= 5 s); they are asserted below a
# lingering work run's 30 s, so a run that waits behind another run's linger fails its test
# whatever the machine's load (under the whole suite's load a crash retry waited 18 s once).
QUEUE_WAIT_BOUND_SECONDS = 25
QUEUED = (dg.DagsterRunStatus.QUEUED,)


# The sensor daemon's loop (Dagster 1.13), and how often a start or stop is repeated until it
# holds.
DAEMON_LOOP_SECONDS = 5
SWITCH_ATTEMPTS = 4


@dataclass
class Tier:
    """A running production setup over `db`, whose `collections` are captured and covered."""

    db: TestDatabase
    setup: ProductionSetup
    collections: list[Collection]
    writer: CmsWriter
    watch: ProjectionWatch
    edits: int = 0

    @property
    def instance(self) -> dg.DagsterInstance:
        return self.setup.instance

    def edit(self, collection: Collection, entry: int = 0) -> Edit:
        """Give one entry of `collection` a new hero image (its projection must change)."""
        self.edits += 1
        content_id = f"{_prefix(collection)}-e{entry:05d}"
        hero = {"id": f"{content_id}-tier-{self.edits}", "provider": "local"}
        stamp = self.writer.update_entry(collection.slug, content_id, {"hero": hero})
        edit = Edit(self.edits, collection, content_id, stamp.version, stamp.updated_at)
        self.watch.expect(edit)
        return edit

    def projected(self, edits: Sequence[Edit]) -> bool:
        with self.watch.lock:
            return all(edit.index in self.watch.projected_at for edit in edits)

    def sensor(self, command: str, name: str) -> None:
        """`dagster sensor start|stop <name>`, as deploy/README.md tells an operator."""
        subprocess.run(
            [_executable("dagster"), "sensor", command, name, "-w", str(self.setup.workspace)],
            env=self.setup.environment,
            check=True,
            capture_output=True,
            timeout=120,
        )

    def switch_sensor(self, name: str, command: str) -> None:
        """Start or stop a sensor and see it hold: a tick in flight when the change lands
        writes the sensor's state back as it read it, so the command is repeated until the
        stored state agrees after the daemon's next loop."""
        wanted = {"start": "RUNNING", "stop": "STOPPED"}[command]
        for _ in range(SWITCH_ATTEMPTS):
            self.sensor(command, name)
            time.sleep(DAEMON_LOOP_SECONDS + 1)
            if self.sensor_status(name) == wanted:
                return
        raise AssertionError(f"{name} is not {wanted} after {SWITCH_ATTEMPTS} times {command}")

    def sensor_status(self, name: str) -> str | None:
        states = [state for state in self.instance.all_instigator_state() if state.name == name]
        return states[0].status.value if states else None

    def wait_projected(self, edits: Sequence[Edit], timeout: float) -> None:
        self.setup.wait_for(lambda: self.projected(edits), f"{len(edits)} edit(s)", timeout)

    def runs(self, job_name: str, statuses=None) -> list[dg.DagsterRun]:
        return list(
            self.instance.get_runs(filters=dg.RunsFilter(job_name=job_name, statuses=statuses))
        )

    def runs_of(self, job_name: str, collection: Collection, statuses=None) -> list[dg.DagsterRun]:
        return [
            run
            for run in self.runs(job_name, statuses)
            if run.tags.get(COLLECTION_ID_TAG) == collection.id
        ]

    def status(self, run_id: str) -> dg.DagsterRunStatus:
        run = self.instance.get_run_by_id(run_id)
        assert run is not None
        return run.status

    def wait_status(self, run_id: str, statuses, timeout: float) -> dg.DagsterRun:
        wanted = set(statuses)

        def reached():
            run = self.instance.get_run_by_id(run_id)
            return run if run is not None and run.status in wanted else None

        return self.setup.wait_for(reached, f"run {run_id} to reach {wanted}", timeout)


def _prefix(collection: Collection) -> str:
    """The prefix of the collection's entry ids: the live bench's for its collections, else
    the slug's first three letters (`covered_collections`)."""
    return dict(LIVE_COLLECTIONS).get(collection.slug, collection.slug[:3])


def covered_collections(db: TestDatabase, slugs: Sequence[str]) -> list[Collection]:
    """Collections of sample content (entry ids `<slug[:3]>-e<n>`), captured and covered."""
    collections = []
    for slug in slugs:
        collections.append(create_collection(db.engine, slug))
        insert_entries(db.engine, ENTRIES_PER_COLLECTION, slug, slug[:3])
    activate(db.engine)
    for collection in collections:
        DriverMode(db.engine, collection).reconcile()
        assert coverage_is_complete(db.engine, collection), collection.slug
    return collections


@contextlib.contextmanager
def deployed_tier(
    db: TestDatabase,
    collections: int = 3,
    *,
    linger_seconds: float = 30,
    slugs: Sequence[str] | None = None,
    environment: Mapping[str, str] | None = None,
    webserver: bool = True,
) -> Iterator[Tier]:
    """Collections of sample content on `db` (the first `collections` of the live bench's, or
    `slugs`), captured and covered, and the production setup running over them."""
    if slugs is None:
        load = LiveLoad(
            db.url,
            entries=ENTRIES_PER_COLLECTION * collections,
            collections=collections,
            rate=1,
            seconds=1,
            idle_seconds=0,
        )
        covered = prepare_content(db.engine, load)
    else:
        covered = covered_collections(db, slugs)
    with production_setup(
        db.url,
        instance_server=postgres_admin_url(),
        environment={WORK_LINGER_ENV: str(linger_seconds), **(environment or {})},
        webserver=webserver,
    ) as setup:
        # As the maintenance schedule keeps them, without waiting for its next tick.
        setup.instance.add_dynamic_partitions(
            media_usage_collections.name, [collection.slug for collection in covered]
        )
        watch = ProjectionWatch(db.engine)
        # Every edit's projection is seen as it lands (an entry edited again later would
        # otherwise lend its earlier edit the later projection's time).
        watcher = threading.Thread(target=watch.run, daemon=True)
        watcher.start()
        try:
            yield Tier(db, setup, covered, CmsWriter(db.engine), watch)
        finally:
            watch.stopped.set()
            watcher.join(timeout=10)


class QueueSampler:
    """Samples, from a thread, how many runs of a job each collection has queued (and in
    flight) at once; `most_queued` is the largest count seen for one collection."""

    def __init__(self, instance: dg.DagsterInstance, job_name: str, every: float = 0.5) -> None:
        self.instance = instance
        self.job_name = job_name
        self.every = every
        self.most_queued = 0
        self.most_in_flight = 0
        self.samples = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> QueueSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stopped.wait(self.every):
            runs = self.instance.get_runs(
                filters=dg.RunsFilter(job_name=self.job_name, statuses=IN_FLIGHT_STATUSES)
            )
            waiting: dict[str | None, int] = {}
            flying: dict[str | None, int] = {}
            for run in runs:
                key = run.tags.get(COLLECTION_ID_TAG)
                flying[key] = flying.get(key, 0) + 1
                if run.status in WAITING_STATUSES:
                    waiting[key] = waiting.get(key, 0) + 1
            self.most_queued = max([self.most_queued, *waiting.values()])
            self.most_in_flight = max([self.most_in_flight, *flying.values()])
            self.samples += 1


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def summary(values: Sequence[float]) -> str:
    if not values:
        return "none"
    return (
        f"n={len(values)} p50={statistics.median(values):.2f} s "
        f"p95={percentile(values, 0.95):.2f} s max={max(values):.2f} s"
    )


def report(line: str) -> None:
    """A measured fact, in the test's output (`pytest -s`), with the machine's load then."""
    load = ", ".join(f"{each:.2f}" for each in os.getloadavg())
    print(f"[deployment tier] {line} (load average {load})", flush=True)
