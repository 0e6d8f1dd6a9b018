"""`media-usage bench` end to end on small databases of both dialects: every mode reports one
JSON line with its measurement, its phases (seconds and statements) and a verified index; the
suite's summary computes the acceptance ratios from those lines."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from media_usage_orchestration.bench.suite import Measurement, findings, plan
from media_usage_orchestration.cli import main
from media_usage_orchestration.emdash_double.generated_work import insert_generated_work
from media_usage_orchestration.emdash_double.statement_counter import counting_statements
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.processing.loop.phases import (
    OTHER,
    PHASES,
    PhaseClock,
    phase,
    timing,
)
from media_usage_orchestration.resources.automation import WORK_LINGER_ENV
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import create_database_engine
from media_usage_orchestration.store.reads.probes import due_work_by_collection
from tests.support.databases import postgres_admin_url, require_postgres
from tests.support.states import count, make_collection

FIELDS = {
    "mode",
    "dialect",
    "entries",
    "seconds",
    "entries_per_second",
    "runs",
    "peak_rss_mb",
    "verified",
    "workers",
    "statements",
    "statements_per_entry",
    "phases",
}
DIALECT_NAMES = {"sqlite": "sqlite", "postgres": "postgresql"}


@pytest.fixture(params=["sqlite", "postgres"])
def server(request) -> list[str]:
    """The bench's database arguments: none (a temporary SQLite file) or a PostgreSQL server."""
    if request.param == "sqlite":
        return []
    require_postgres()
    return ["--database-url", postgres_admin_url()]


def invoke(*arguments: str):
    return CliRunner().invoke(main, ["bench", *arguments])


def run_bench(*arguments: str) -> dict:
    result = invoke("--entries", "120", *arguments)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_phases_add_up(report: dict) -> None:
    phases = report["phases"]
    assert set(phases) == {*PHASES, OTHER}
    assert sum(each["seconds"] for each in phases.values()) == pytest.approx(
        report["seconds"], abs=0.01
    )
    assert sum(each["statements"] for each in phases.values()) == report["statements"]
    assert report["statements_per_entry"] > 0
    for name in PHASES:  # a reconciliation from scratch runs every phase
        assert phases[name]["seconds"] > 0 and phases[name]["statements"] > 0, name


FLOOR_FIELDS = {
    "dagster_floor_seconds",
    "floor_steps_seconds",
    "floor_overhead_seconds",
    "floor_events_per_run",
    "run_seconds",
    "run_steps_seconds",
    "run_overhead_seconds",
    "events_per_run",
    "overhead_over_floor",
}


def assert_beside_the_floor(report: dict) -> None:
    """The job's run and its empty twin's: wall time, steps and events, read from the instance."""
    assert report["dagster_floor_seconds"] > 0 and report["floor_steps_seconds"] > 0
    assert report["floor_overhead_seconds"] == pytest.approx(
        report["dagster_floor_seconds"] - report["floor_steps_seconds"], abs=0.001
    )
    assert report["run_overhead_seconds"] == pytest.approx(
        report["run_seconds"] - report["run_steps_seconds"], abs=0.001
    )
    # The real run does everything its floor does (same graph, same IO manager) and more.
    # No run evaluates a check or observes the per-collection assets: the project's runs record
    # no more events than the floor's.
    assert report["events_per_run"] >= report["floor_events_per_run"] > 0
    assert report["run_steps_seconds"] > 0
    assert report["overhead_over_floor"] == pytest.approx(
        report["run_overhead_seconds"] / report["dagster_floor_seconds"], abs=0.01
    )


@pytest.mark.parametrize("mode", ["driver", "dagster"])
def test_reconcile_bench_reports_a_verified_measurement_per_phase(mode, server):
    report = run_bench("--mode", mode, *server)

    assert set(report) == (FIELDS | FLOOR_FIELDS if mode == "dagster" else FIELDS)
    if mode == "dagster":
        assert_beside_the_floor(report)
    dialect = "sqlite" if not server else "postgresql"
    assert (report["mode"], report["dialect"], report["entries"]) == (mode, dialect, 120)
    assert report["verified"] is True and report["workers"] == 1
    assert report["seconds"] > 0 and report["entries_per_second"] > 0
    assert report["runs"] >= 1 and report["peak_rss_mb"] > 0
    assert_phases_add_up(report)


def test_floor_bench_writes_the_drivers_end_state(server):
    report = run_bench("--mode", "floor", *server)

    assert set(report) == FIELDS | {"equal_to_driver", "end_state_digest"}
    assert (report["mode"], report["entries"]) == ("floor", 120)
    assert report["equal_to_driver"] is True and report["verified"] is True
    # Its bookkeeping per page of 100: read, enqueue, claim, occurrences, sources, complete.
    assert report["statements"] < 120


@pytest.mark.parametrize("path", ["batch", "tick"])
def test_work_bench_reports_the_path_it_measured(path):
    report = run_bench("--workload", "work", "--path", path)

    assert FIELDS | {"workload", "path"} == set(report)
    assert (report["workload"], report["path"], report["dialect"]) == ("work", path, "sqlite")
    assert report["verified"] is True
    assert report["phases"]["drain"]["statements"] > 0


def test_the_dagster_work_bench_reports_the_work_run_beside_its_floor(server):
    report = run_bench("--workload", "work", "--mode", "dagster", *server)

    assert FIELDS | FLOOR_FIELDS | {"workload", "path"} == set(report)
    assert report["verified"] is True and report["runs"] == 1
    assert_beside_the_floor(report)


LIVE_FIELDS = {
    "workload",
    "dialect",
    "instance_storage",
    "collections",
    "entries",
    "edits_spread",
    "rate",
    "seconds",
    "idle_seconds",
    "linger_seconds",
    "edits",
    "edits_per_second",
    "projected",
    "latency_seconds",
    "latency_resolution",
    "runs_during_load",
    "runs_in_idle",
    "runs_in_idle_by_job",
    "runs_by_job",
    "runs_in_flight_at_end",
    "work_run_start_seconds",
    "first_run_seconds",
    "work_run_events",
    "work_sensor_tick_interval_seconds",
    "load_average",
    "peak_rss_mb",
    "targets",
    "met",
    "processes_left",
}


@pytest.mark.slow
def test_two_workers_drain_on_postgresql_and_report_the_speedup():
    require_postgres()
    report = run_bench("--workers", "2", "--database-url", postgres_admin_url())

    assert report["verified"] is True and report["workers"] == 2
    assert report["baseline_drain_seconds"] > 0 and report["drain_speedup"] > 0
    assert_phases_add_up(report)


def test_profile_writes_a_cprofile_and_prints_its_top_functions(tmp_path):
    profile = tmp_path / "bench.prof"
    result = invoke("--entries", "30", "--profile", str(profile))

    assert result.exit_code == 0, result.output
    assert profile.stat().st_size > 0
    assert "top 20 by cumulative time" in result.output
    assert "run_to_completion" in result.output


def test_the_tick_bench_times_the_work_and_queue_sensors_over_generated_rows(server):
    result = invoke("--workload", "tick", "--entries", "400", *server)

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["workload"] == "tick" and report["work_rows"] == 400
    assert 0 < report["probe_ms"] <= report["probe_max_ms"]
    assert 0 < report["tick_ms"] <= report["tick_max_ms"]
    assert 0 < report["queue_probe_ms"] <= report["queue_probe_max_ms"]
    assert 0 < report["queue_tick_ms"] <= report["queue_tick_max_ms"]
    assert (report["tick_bound_ms"], report["queue_bound_ms"]) == (50.0, 20.0)
    assert "queue sensor over 400 rows" in result.output


def test_the_scrub_bench_times_the_scrubbers_slices_over_reconciled_entries(server):
    result = invoke("--workload", "scrub", "--entries", "40", *server)

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert (report["workload"], report["entries"], report["differences"]) == ("scrub", 40, 0)
    assert 0 < report["slice_ms"] <= report["slice_max_ms"]
    assert report["entries_per_second"] > 0
    assert report["sweep_hours_per_100k"] > 0


def test_the_gc_bench_reaps_the_backlog_with_real_runs_and_verifies_the_index(server):
    result = invoke("--workload", "gc", "--entries", "600", *server)

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["workload"] == "gc"
    assert (report["backlog_rows"], report["deleted_rows"], report["backlog_left"]) == (600, 600, 0)
    assert report["stale_rows"] > report["abandoned_rows"] > 0 and report["current_rows"] > 0
    assert report["runs"] == 1 and report["passes"] >= 600 // 50
    assert report["verified"] and report["rows_per_second"] > 0
    assert "projection GC over a backlog of 600 rows" in result.output


@pytest.mark.slow
def test_the_live_bench_projects_every_edit_with_a_real_daemon_and_stops_it(server, monkeypatch):
    """A real daemon, two collections, six edits in three seconds and a short linger: the
    smallest load that has each collection's first run start and every edit projected."""
    monkeypatch.setenv(WORK_LINGER_ENV, "1")
    arguments = ["--workload", "live", "--entries", "40", "--collections", "2"]
    result = invoke(*arguments, "--rate", "2", "--seconds", "3", "--idle-seconds", "4", *server)

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report) == LIVE_FIELDS
    dialect = "sqlite" if not server else "postgresql"
    assert (report["workload"], report["collections"]) == ("live", 2)
    assert report["dialect"] == report["instance_storage"] == dialect
    assert report["linger_seconds"] == 1.0
    # Every edit was projected, each with its own commit-to-projection latency.
    assert report["edits"] == report["projected"] == 6
    latency = report["latency_seconds"]
    assert 0 < latency["p50"] <= latency["p95"] <= latency["max"]
    # Only work runs were launched (the sensor's first may come after the three seconds of
    # edits: the daemon's sensor loop runs every five).
    launched = {**report["runs_by_job"], **report["runs_in_idle_by_job"]}
    assert set(launched) <= {"media_usage_work"}
    # Nothing of the daemon's process group (code server, run workers) is left running.
    assert report["processes_left"] == 0


# --- the pieces -----------------------------------------------------------------------------


def test_generated_work_is_one_collection_backlog_with_a_due_earliest_item(db):
    collection = make_collection(db.engine, "articles")
    activate(db.engine)

    assert insert_generated_work(db.engine, collection.id, collection.slug, 81) == 81

    assert count(db.engine, schema.work, collection_id=collection.id) == 81
    assert count(db.engine, schema.work, state="pending") == 76
    assert count(db.engine, schema.work, state="retry") == 2
    assert count(db.engine, schema.work, state="leased") == 3
    [due] = due_work_by_collection(db.engine, 10)
    assert (due.collection_id, due.collection_slug) == (collection.id, collection.slug)
    assert "|gen-" in due.generation and due.lease_expired is False


def test_generated_work_refuses_a_count_that_is_not_positive(db):
    collection = make_collection(db.engine, "articles")

    with pytest.raises(ValueError, match="Generated work row count"):
        insert_generated_work(db.engine, collection.id, collection.slug, 0)
    assert count(db.engine, schema.work) == 0


def test_statements_are_counted_for_the_named_database_only(db, tmp_path):
    other = create_database_engine(f"sqlite:///{tmp_path / 'other.db'}")
    running = ["ours"]
    try:
        with counting_statements(db.url, label=lambda: running[0]) as counts:
            for _ in range(3):
                with db.engine.connect() as connection:
                    connection.exec_driver_sql("SELECT 1")
            running[0] = "theirs"
            with other.connect() as connection:
                connection.exec_driver_sql("SELECT 1")
    finally:
        other.dispose()

    assert set(counts.by_label()) == {"ours"}
    assert counts.total == counts.by_label()["ours"] >= 3


def test_phases_are_exclusive_and_sum_to_the_time_measured():
    ticks = iter(range(0, 100, 1))
    clock = PhaseClock(clock=lambda: float(next(ticks)))  # 0
    with timing(clock), phase("scan"), phase("drain"):  # 1, then 2
        pass  # 3 back to scan, 4 back to other
    seconds = clock.stop()  # 5

    assert seconds == {
        "scan": 2.0,
        "drain": 1.0,
        "sources": 0.0,
        "finalize": 0.0,
        "other": 2.0,
    }


def test_the_suite_plans_every_measurement_and_judges_the_targets():
    planned = plan(5000, "postgresql+psycopg://server/db", 1_000_000, True, repeat=2)
    base = [
        "sqlite driver",
        "sqlite floor",
        "sqlite dagster",
        "postgresql driver",
        "postgresql floor",
        "postgresql dagster",
    ]
    assert [(name, round_) for name, _, round_ in planned] == [
        *((name, 1) for name in base),
        *((name, 2) for name in base),
        ("sqlite driver 10x", 1),
        ("sqlite dagster 10x", 1),
        ("postgresql driver 10x", 1),
        ("postgresql 2 workers", 1),
        ("sqlite tick", 1),
        ("postgresql tick", 1),
        ("sqlite gc", 1),
        ("postgresql gc", 1),
        ("sqlite live", 1),
        ("postgresql live", 1),
    ]
    unlive = plan(5000, "postgresql+psycopg://server/db", 1_000_000, True, live=False)
    assert not [name for name, _, _ in unlive if "live" in name]

    def measured(name: str, round_: int = 1, **record) -> Measurement:
        return Measurement(name, (), {"peak_rss_mb": 100.0, **record}, round=round_)

    def floor(floor_seconds: float, overhead_seconds: float) -> dict:
        return {"dagster_floor_seconds": floor_seconds, "run_overhead_seconds": overhead_seconds}

    def gc(runs: int, seconds: float) -> dict:
        return {
            "workload": "gc",
            "backlog_rows": 100_000,
            "backlog_left": 0,
            "verified": True,
            "runs": runs,
            "seconds": seconds,
        }

    def live(p50: float, p95: float, idle: int) -> dict:
        latency = {"p50": p50, "p95": p95, "max": p95}
        return {
            "workload": "live",
            "edits": 120,
            "projected": 120,
            "rate": 2.0,
            "idle_seconds": 60.0,
            "latency_seconds": latency,
            "runs_in_idle": idle,
        }

    judged = findings(
        [
            measured("sqlite driver", seconds=2.0, entries_per_second=2500.0),
            measured("sqlite dagster", seconds=2.1, entries_per_second=2380.0, **floor(0.4, 0.5)),
            measured("sqlite driver", 2, seconds=2.6, entries_per_second=1920.0),
            measured(
                "sqlite dagster", 2, seconds=3.0, entries_per_second=1670.0, **floor(0.6, 0.9)
            ),
            measured("sqlite driver", 3, seconds=2.2, entries_per_second=2270.0),
            measured(
                "sqlite dagster", 3, seconds=2.4, entries_per_second=2080.0, **floor(0.5, 0.6)
            ),
            measured("sqlite floor", mode="floor", entries_per_second=3000.0),
            measured("sqlite floor", 2, mode="floor", entries_per_second=2600.0),
            measured("sqlite driver 10x", seconds=23.0, entries_per_second=2170.0),
            measured("sqlite dagster 10x", seconds=23.4, entries_per_second=2140.0),
            measured("postgresql 2 workers", drain_speedup=1.5),
            measured(
                "sqlite tick",
                work_rows=10,
                tick_ms=40.0,
                probe_ms=3.0,
                queue_probe_ms=25.0,
                queue_tick_ms=45.0,
            ),
            measured("sqlite tick", work_rows=10, tick_ms=40.0, probe_ms=3.0),
            measured("sqlite live", **live(p50=0.8, p95=12.5, idle=0)),
            measured("postgresql live", **live(p50=0.6, p95=4.0, idle=1)),
            measured("sqlite gc", **gc(runs=1, seconds=40.0)),
            measured("postgresql gc", **gc(runs=3, seconds=110.0)),
        ]
    )

    # Medians: driver 2.2 s, Dagster 2.4 s (each combination's own median run).
    assert {what: (value, met) for what, value, _, met in judged} == {
        "sqlite Dagster entries/s (medians of 3)": (2080.0, True),
        # Median rates: driver 2,270, floor 2,800.
        "sqlite driver/floor entries/s (medians of 2)": (0.81, True),
        "sqlite Dagster/driver time, 10x entries": (1.02, True),
        "sqlite 10x entries time ratio": (10.45, True),
        "sqlite work sensor tick ms (10 rows)": (40.0, True),
        "sqlite work sensor probe ms (10 rows)": (3.0, True),
        "sqlite queue sensor probe ms (10 rows)": (25.0, False),
        "sqlite queue sensor tick ms (10 rows)": (45.0, True),
        # Medians over the rounds: overhead 0.6 s, floor 0.5 s.
        "sqlite run overhead / Dagster floor (medians of 3)": (1.2, True),
        "sqlite live latency p50 s (2 edits/s)": (0.8, True),
        "sqlite live latency p95 s (2 edits/s)": (12.5, False),
        "sqlite live runs launched in the idle 60 s": (0, True),
        "postgresql live latency p50 s (2 edits/s)": (0.6, True),
        "postgresql live latency p95 s (2 edits/s)": (4.0, True),
        "postgresql live runs launched in the idle 60 s": (1, False),
        "sqlite projection GC runs to drain a 100,000-row backlog": (1, True),
        "sqlite projection GC s to drain a 100,000-row backlog": (40.0, True),
        "postgresql projection GC runs to drain a 100,000-row backlog": (3, False),
        "postgresql projection GC s to drain a 100,000-row backlog": (110.0, True),
        "peak RSS MB (largest)": (100.0, True),
        "postgresql drain, 2 workers over 1": (1.5, False),
    }
    assert [each.label for each in (measured("a"), measured("a", 2))] == ["a", "a #2"]


def test_the_dagster_lane_on_postgresql_keeps_instance_storage_in_postgresql_and_drops_it():
    """As deploy/dagster.yaml deploys it: runs and events in PostgreSQL (a scratch database)."""
    from sqlalchemy import make_url, text

    from media_usage_orchestration.bench.instance import bench_instance

    require_postgres()
    with bench_instance(postgres_admin_url()) as instance:
        storage = instance.event_log_storage
        assert type(storage).__name__ == "PostgresEventLogStorage"
        database = make_url(storage.postgres_url).database
        assert database.startswith("media_usage_bench_dagster_")
    admin = create_database_engine(postgres_admin_url())
    try:
        with admin.connect() as connection:
            left = connection.execute(
                text("SELECT count(*) FROM pg_database WHERE datname = :name"), {"name": database}
            ).scalar_one()
    finally:
        admin.dispose()
    assert left == 0


def test_the_floor_end_state_equals_the_drivers_and_the_digest_sees_a_difference(db, twin):
    from sqlalchemy import func, select, update

    from media_usage_orchestration.bench.database import create_collection, insert_entries
    from media_usage_orchestration.bench.drain_floor import end_state_digest, reconcile_floor
    from media_usage_orchestration.bench.measure import DriverMode

    floor_collection = create_collection(db.engine)
    driver_collection = create_collection(twin.engine, collection_id=floor_collection.id)
    for each in (db, twin):
        insert_entries(each.engine, 130)  # three pages of at most 50, as the driver's scan
        activate(each.engine)
    assert reconcile_floor(db.engine, floor_collection) == 1
    DriverMode(twin.engine, driver_collection).reconcile()

    floor = end_state_digest(db.engine, floor_collection)
    assert floor == end_state_digest(twin.engine, driver_collection)
    assert floor["sources"] == 130 and floor["occurrences"] > 130
    assert count(db.engine, schema.work) == 0

    with db.engine.begin() as connection:
        connection.execute(
            update(schema.occurrences)
            .where(
                schema.occurrences.c.id
                == select(func.min(schema.occurrences.c.id)).scalar_subquery()
            )
            .values(media_id="another-media")
        )
    assert end_state_digest(db.engine, floor_collection)["digest"] != floor["digest"]


def test_the_floor_keeps_the_seeds_contract_items_own_leases_and_guarded_checkpoints(db):
    """Each work item is claimed under its own token, each page moves the leased coordinator's
    scan cursor, and a page whose coordinator lease was lost is not written at all."""
    from sqlalchemy import select, update

    from media_usage_orchestration.bench.database import create_collection, insert_entries
    from media_usage_orchestration.bench.drain_floor import FLOOR_PAGE_SIZE, _built
    from media_usage_orchestration.bench.sql import bulk_floor
    from media_usage_orchestration.processing.work.content_reads import read_fields
    from media_usage_orchestration.values.errors import FloorLeaseLost

    collection = create_collection(db.engine)
    insert_entries(db.engine, 70)
    activate(db.engine)
    fields = read_fields(db.engine, collection.slug, collection.id)
    epoch = bulk_floor.take_status(db.engine, collection.id, collection.slug, "coordinator")
    assert epoch is not None and FLOOR_PAGE_SIZE == 50

    rows, revisions = bulk_floor.read_and_claim_page(
        db.engine, collection.id, collection.slug, fields, epoch, "", FLOOR_PAGE_SIZE, "page"
    )
    with db.engine.connect() as connection:
        tokens = connection.execute(select(schema.work.c.lease_token)).scalars().all()
    assert len(rows) == 50 and len(set(tokens)) == 50
    assert {token.split(":", 1)[0] for token in tokens} == {"page"}
    built = _built(collection, fields, rows, revisions)
    bulk_floor.write_page(db.engine, collection.id, *built, "page", ("coordinator", rows[-1]["id"]))
    reconciliation = schema.reconciliations
    with db.engine.connect() as connection:
        cursor = connection.execute(select(reconciliation.c.scan_cursor)).scalar_one()
    assert cursor == rows[-1]["id"]
    assert count(db.engine, schema.sources) == 50 and count(db.engine, schema.work) == 0

    # Another holder takes the coordinator: the next page writes nothing, its work stays.
    rows, revisions = bulk_floor.read_and_claim_page(
        db.engine, collection.id, collection.slug, fields, epoch, cursor, FLOOR_PAGE_SIZE, "p2"
    )
    with db.engine.begin() as connection:
        connection.execute(update(reconciliation).values(lease_token="another"))
    built = _built(collection, fields, rows, revisions)
    with pytest.raises(FloorLeaseLost):
        bulk_floor.write_page(db.engine, collection.id, *built, "p2", ("coordinator", "x"))
    assert count(db.engine, schema.sources) == 50 and count(db.engine, schema.work) == 20
    with pytest.raises(FloorLeaseLost):
        bulk_floor.take_status(db.engine, collection.id, collection.slug, "a third")


# --- the soak -----------------------------------------------------------------------------------


def test_the_suite_plans_a_short_soak_last_and_judges_each_of_its_targets():
    from media_usage_orchestration.bench.soak import TARGETS as SOAK_TARGETS

    planned = plan(5000, "postgresql+psycopg://server/db", 10, False, soak_minutes=5)
    name, arguments, _ = planned[-1]
    assert name == "postgresql soak"
    assert arguments[:4] == ["--workload", "soak", "--minutes", "5"]
    assert arguments[-2:] == ["--database-url", "postgresql+psycopg://server/db"]
    assert not [each for each in plan(5000, "x", 10, False) if "soak" in each[0]]

    soak = {
        "workload": "soak",
        "minutes": 5.0,
        "verified": True,
        "edits": 600,
        "projected": 600,
        "latency_seconds": {"p50": 0.3, "p95": 0.6, "max": 12.0},
        "accumulating_mb_per_hour": 1.5,
        "rows_per_hour": {"event_logs": 1800},
        "alerts": 0,
        "failed_runs": 0,
        "failure_ticks": 1,
        "targets": SOAK_TARGETS,
        "peak_rss_mb": 100.0,
    }
    judged = findings([Measurement("postgresql soak", (), soak)])

    assert {what: (value, met) for what, value, _, met in judged} == {
        "soak 5 min: latency p95 s": (0.6, True),
        "soak 5 min: latency max s": (12.0, False),
        "soak 5 min: instance MB/h staying past a day": (1.5, True),
        "soak 5 min: event_logs rows/h": (1800, False),
        "soak 5 min: alerts posted": (0, True),
        "soak 5 min: failed runs": (0, True),
        "soak 5 min: FAILURE ticks": (1, False),
        "peak RSS MB (largest)": (100.0, True),
    }


def test_the_soak_refuses_sqlite_before_deploying_anything():
    result = invoke("--workload", "soak", "--minutes", "1")

    assert result.exit_code == 2
    assert "--workload soak deploys on PostgreSQL" in result.output


def test_a_soak_sample_reads_every_instance_table_and_splits_events_and_ticks():
    """On a real dagster-postgres instance: a run's events are run-bound, a runless
    observation is not, and each tick is counted under its type and status."""
    import dagster as dg
    from dagster._core.scheduler.instigation import (
        InstigatorType,
        TickData,
        TickStatus,
    )
    from sqlalchemy import make_url

    from media_usage_orchestration.bench.instance import bench_instance
    from media_usage_orchestration.bench.soak_samples import growth_per_hour
    from media_usage_orchestration.bench.sql.dagster_instance import (
        RUN_EVENTS,
        RUNLESS_EVENTS,
        instance_database_engine,
        instance_tables,
    )

    require_postgres()

    @dg.op
    def noop():
        return None

    @dg.job
    def soak_sample_job():
        noop()

    with bench_instance(postgres_admin_url()) as instance:
        url = make_url(instance.event_log_storage.postgres_url)
        engine = instance_database_engine(
            {
                "DAGSTER_PG_USER": url.username or "postgres",
                "DAGSTER_PG_PASSWORD": url.password or "",
                "DAGSTER_PG_HOST": url.host or "127.0.0.1",
                "DAGSTER_PG_PORT": str(url.port or 5432),
                "DAGSTER_PG_DB": url.database or "",
            }
        )
        try:
            with engine.connect() as connection:
                before = instance_tables(connection)
            assert soak_sample_job.execute_in_process(instance=instance).success
            instance.report_runless_asset_event(dg.AssetObservation("soak_sample_asset"))
            instance.create_tick(
                TickData(
                    instigator_origin_id="origin",
                    instigator_name="soak_sample_sensor",
                    instigator_type=InstigatorType.SENSOR,
                    status=TickStatus.SKIPPED,
                    timestamp=0.0,
                    selector_id="selector",
                )
            )
            with engine.connect() as connection:
                after = instance_tables(connection)
        finally:
            engine.dispose()

    assert {"runs", "event_logs", "job_ticks", "run_tags"} <= set(after.tables)
    assert after.tables["runs"].rows == before.tables["runs"].rows + 1
    run_rows, run_bytes = after.parts[RUN_EVENTS]
    assert run_rows > 5 and run_bytes > 0
    assert after.parts[RUNLESS_EVENTS][0] == 1
    assert after.parts["job_ticks:SENSOR:SKIPPED"][0] == 1
    assert after.tick_origins == {"origin": 1}
    assert after.event_types["ASSET_OBSERVATION"] == 1
    assert after.database_bytes >= after.table_bytes() > 0
    assert growth_per_hour(before, after)["runs"]["rows"] > 0
