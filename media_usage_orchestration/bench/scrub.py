"""What one scrubber slice costs: N sample entries reconciled to complete coverage, then whole
sweeps of `scrub_tick` at the sensor's slice size, each slice timed (no time budget, so every
slice holds its full count of entries).

From the entries compared per second follow the entries a tick compares within its budget and
how long a sweep of 100,000 entries takes at the sensor's interval.
"""

from __future__ import annotations

import statistics
import time

from media_usage_orchestration.bench.database import (
    console,
)
from media_usage_orchestration.bench.measure import reconciled_collection
from media_usage_orchestration.processing.integrity.scrub import (
    SLICE_ENTRIES,
    SLICE_SECONDS,
    ScrubLimits,
    ScrubPosition,
    scrub_tick,
)
from media_usage_orchestration.store.core.engine import create_database_engine

SWEEPS = 3
# The scrubber sensor's minimum interval (`sensors/scrubber.py`), kept here without importing
# Dagster.
TICK_INTERVAL_SECONDS = 30
PER_SWEEP_ENTRIES = 100_000


def _sweep(engine, limits: ScrubLimits) -> tuple[list[float], int]:
    """One sweep from a fresh position: each slice's seconds, and the differences found."""
    position, seconds = ScrubPosition(), []
    while True:
        started = time.perf_counter()
        tick = scrub_tick(engine, position, limits)
        seconds.append(time.perf_counter() - started)
        position = tick.position
        if tick.sweep is not None:
            return seconds, tick.sweep.differences


def run_scrub(url: str, entries: int) -> dict:
    """Reconcile `entries` sample entries, then time `SWEEPS` sweeps slice by slice."""
    engine = create_database_engine(url)
    try:
        reconciled_collection(engine, entries)
        console.print(f"{entries:,} entries reconciled; timing {SWEEPS} sweeps")
        limits = ScrubLimits(entries=SLICE_ENTRIES, seconds=3600.0)
        slices: list[float] = []
        differences = 0
        for _ in range(SWEEPS):
            seconds, found = _sweep(engine, limits)
            slices += seconds
            differences += found
        dialect = engine.dialect.name
    finally:
        engine.dispose()
    per_second = entries * SWEEPS / sum(slices)
    per_tick = min(SLICE_ENTRIES, int(per_second * SLICE_SECONDS))
    return {
        "workload": "scrub",
        "dialect": dialect,
        "entries": entries,
        "slice_entries": SLICE_ENTRIES,
        "slice_ms": round(statistics.median(slices) * 1000, 1),
        "slice_max_ms": round(max(slices) * 1000, 1),
        "entries_per_second": round(per_second),
        "entries_per_tick": per_tick,
        "sweep_hours_per_100k": round(
            PER_SWEEP_ENTRIES / per_tick * TICK_INTERVAL_SECONDS / 3600, 2
        ),
        "differences": differences,
    }
