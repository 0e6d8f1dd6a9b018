"""How long the work sensor takes with a large work table: N generated work rows (one
`INSERT ... SELECT`), then the sensor's probe alone and whole sensor evaluations, timed.

The probe (`due_work_by_collection`) is the sensor's only query on the work table; the evaluation
adds the schema check and the instance's run queries. Both must stay well under Dagster's
evaluation timeout however large the backlog is: the acceptance bound is 50 ms a tick.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from media_usage_orchestration.bench.database import console, create_collection
from media_usage_orchestration.emdash_double.generated_work import insert_generated_work
from media_usage_orchestration.processing.activation import activate
from media_usage_orchestration.store.core.engine import create_database_engine
from media_usage_orchestration.store.probes import MAX_DUE_WORK_COLLECTIONS, due_work_by_collection

PROBES = 20
EVALUATIONS = 5
TICK_BOUND_MS = 50.0


def _milliseconds(action: Callable[[], object], repeat: int) -> list[float]:
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        timings.append((time.perf_counter() - started) * 1000)
    return timings


def _sensor_evaluation(url: str) -> Callable[[], object]:
    import dagster as dg

    from media_usage_orchestration.definitions import defs
    from media_usage_orchestration.resources.automation import MediaUsageAutomation
    from media_usage_orchestration.resources.database import MediaUsageDatabase
    from media_usage_orchestration.sensors.work import media_usage_work_sensor

    resources = {"database": MediaUsageDatabase.for_url(url), "automation": MediaUsageAutomation()}
    instance = dg.DagsterInstance.ephemeral()

    def evaluate() -> object:
        with dg.build_sensor_context(
            instance=instance, resources=resources, definitions=defs
        ) as context:
            data = media_usage_work_sensor.evaluate_tick(context)
        if not data.run_requests:
            raise RuntimeError(f"the work sensor requested no run ({data.skip_message})")
        return data

    return evaluate


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
        evaluate = _sensor_evaluation(url)
        evaluate()  # the first evaluation loads the definitions' resources
        ticks = _milliseconds(evaluate, EVALUATIONS)
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
    }
