"""EmDash's scheduled lane looping in a process of its own, as EmDash's cron runs it beside the
project on one database: one `run_scheduled_lane` call after another until told to stop.

Every call is written down (one JSON line: outcome, task class, turn and what the class's tick
did), and an error ends the loop with its traceback in the ledger. Only Dagster-free modules are
imported, so the spawned process starts quickly.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any

from media_usage_orchestration.processing.deletion.processor import DeletionTickResult
from media_usage_orchestration.processing.lane.scheduled_lane import LaneResult, run_scheduled_lane
from media_usage_orchestration.processing.work.processor import WorkTickResult
from media_usage_orchestration.store.core.engine import create_database_engine

# EmDash's cron waits between lane events; a short pause keeps this one from starving the rest.
PAUSE_SECONDS = 0.01


def describe(result: LaneResult) -> dict[str, Any]:
    """One ledger line: what the lane event did, as plain values."""
    tick = result.tick
    if isinstance(tick, WorkTickResult):
        did: Any = tick.counts.as_dict()
    elif isinstance(tick, DeletionTickResult):
        did = {"outcome": tick.outcome.value, "claimed": tick.claimed_count}
    elif tick is not None:
        did = {"outcome": tick.outcome.value, "collection_id": tick.collection_id}
    else:
        did = None
    return {
        "outcome": result.outcome.value,
        "task_class": result.task_class.value if result.task_class else None,
        "turn": result.turn,
        "tick": did,
    }


def lane_loop(url: str, stop, calls, ledger_path: str) -> None:
    """The process target: `stop` is a multiprocessing Event, `calls` a shared counter."""
    engine = create_database_engine(url)
    try:
        with open(ledger_path, "a", buffering=1, encoding="utf-8") as ledger:
            try:
                while not stop.is_set():
                    ledger.write(json.dumps(describe(run_scheduled_lane(engine))) + "\n")
                    with calls.get_lock():
                        calls.value += 1
                    stop.wait(PAUSE_SECONDS)
            except BaseException:
                ledger.write(json.dumps({"error": traceback.format_exc()}) + "\n")
                raise
    finally:
        engine.dispose()


def read_ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
