"""How long the work sensor and the queue sensor take with a large work table: N generated work
rows (one `INSERT ... SELECT`), then each sensor's probe alone and whole sensor evaluations,
timed.

The probe (`due_work_by_collection`) is the work sensor's only query on the work table; the
evaluation adds the schema check and the instance's run queries. Both must stay well under
Dagster's evaluation timeout however large the backlog is: the acceptance bound is 50 ms a tick.
The queue sensor's probe (`read_work_queues`) reads at most a fixed number of index entries per
collection whatever the backlog; its evaluation (without a cursor, so it observes every
collection: its most expensive tick) adds the recent work runs' query and the events. The
queue observation's bound is 20 ms a tick.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from media_usage_orchestration.bench.database import console, create_collection
from media_usage_orchestration.emdash_double.generated_work import insert_generated_work
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.store.core.engine import create_database_engine
from media_usage_orchestration.store.reads.probes import (
    MAX_DUE_WORK_COLLECTIONS,
    due_work_by_collection,
)
from media_usage_orchestration.store.reads.queue import read_work_queues

PROBES = 20
EVALUATIONS = 5
TICK_BOUND_MS = 50.0
QUEUE_BOUND_MS = 20.0


def _milliseconds(action: Callable[[], object], repeat: int) -> list[float]:
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        timings.append((time.perf_counter() - started) * 1000)
    return timings


def _sensor_evaluation(url: str, sensor_name: str) -> Callable[[], object]:
    """One evaluation of the named sensor, without a cursor; it must do its work (request a
    run, or observe the queues)."""
    import dagster as dg

    from media_usage_orchestration.definitions import defs
    from media_usage_orchestration.resources.automation import MediaUsageAutomation
    from media_usage_orchestration.resources.database import MediaUsageDatabase

    sensor = defs.resolve_sensor_def(sensor_name)
    resources = {"database": MediaUsageDatabase.for_url(url), "automation": MediaUsageAutomation()}
    instance = dg.DagsterInstance.ephemeral()

    def evaluate() -> object:
        with dg.build_sensor_context(
            instance=instance, resources=resources, definitions=defs
        ) as context:
            data = sensor.evaluate_tick(context)
        if not (data.run_requests or data.asset_events):
            raise RuntimeError(f"{sensor_name} did nothing ({data.skip_message})")
        return data

    return evaluate


def _timed_evaluations(url: str, sensor_name: str) -> list[float]:
    evaluate = _sensor_evaluation(url, sensor_name)
    evaluate()  # the first evaluation loads the definitions' resources
    return _milliseconds(evaluate, EVALUATIONS)


def run_tick(url: str, rows: int) -> dict:
    """Fill the work table with `rows` rows and time the probe and the sensor's evaluation."""
    engine = create_database_engine(url)
    try:
        collection = create_collection(engine)
        activate(engine)
        started = time.perf_counter()
        insert_generated_work(engine, collection.id, collection.slug, rows)
        console.print(f"{rows:,} work rows in {time.perf_counter() - started:.1f} s; timing ticks")
        probe = _milliseconds(
            lambda: due_work_by_collection(engine, MAX_DUE_WORK_COLLECTIONS), PROBES
        )
        queue_probe = _milliseconds(lambda: read_work_queues(engine), PROBES)
        ticks = _timed_evaluations(url, "media_usage_work_sensor")
        queue_ticks = _timed_evaluations(url, "media_usage_queue_sensor")
        dialect = engine.dialect.name
    finally:
        engine.dispose()
    return {
        "workload": "tick",
        "dialect": dialect,
        "work_rows": rows,
        "probe_ms": round(statistics.median(probe), 2),
        "probe_max_ms": round(max(probe), 2),
        "tick_ms": round(statistics.median(ticks), 2),
        "tick_max_ms": round(max(ticks), 2),
        "tick_bound_ms": TICK_BOUND_MS,
        "queue_probe_ms": round(statistics.median(queue_probe), 2),
        "queue_probe_max_ms": round(max(queue_probe), 2),
        "queue_tick_ms": round(statistics.median(queue_ticks), 2),
        "queue_tick_max_ms": round(max(queue_ticks), 2),
        "queue_bound_ms": QUEUE_BOUND_MS,
    }
