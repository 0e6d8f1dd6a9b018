"""The soak benchmark's arithmetic on its samples of the Dagster instance database
(`bench/sql/dagster_instance.py`), and what it samples of the processes.

- `process_rss`: the resident set of the deployment's processes and of the run workers (the code
  server's process group).
- `growth_per_hour` and `thirty_day_projection`: pure functions over two samples.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

from media_usage_orchestration.bench.daemon import group_members
from media_usage_orchestration.bench.sql.dagster_instance import (
    RUN_EVENTS,
    RUNLESS_EVENTS,
    InstanceSample,
    TableSample,
)

HOURS_PER_DAY = 24.0
PROJECTION_DAYS = 30.0
# How long each part of the instance stays, in days, with deploy/dagster.yaml's `retention:` and
# the instance pruning's defaults (media_usage_instance_pruning): run-bound rows go with their
# runs after 14 days (the soak's runs succeed), sensor ticks after 1 (skipped), 14 (success) or
# 30 (failure) days, schedule ticks after 30. Everything else (runless events: the queue
# sensor's observations; check executions, which Dagster keeps when it deletes a run) stays.
RUN_BOUND_DAYS = 14.0
TICK_DAYS = {"SKIPPED": 1.0, "SUCCESS": 14.0, "FAILURE": 30.0, "STARTED": 1.0}
SCHEDULE_TICK_DAYS = 30.0
RUN_BOUND_TABLES = frozenset({"runs", "run_tags", "asset_event_tags"})


# --- growth and the projection --------------------------------------------------------------------


def hours_between(first: InstanceSample, last: InstanceSample) -> float:
    return max(1e-9, (last.at - first.at) / 3600.0)


def database_mb_per_hour(first: InstanceSample, last: InstanceSample) -> float:
    """The whole instance database's growth between the samples, in MB per hour."""
    gained = last.database_bytes - first.database_bytes
    return gained / 1e6 / hours_between(first, last)


def growth_per_hour(first: InstanceSample, last: InstanceSample) -> dict[str, dict[str, float]]:
    """Per table: bytes and rows gained per hour between the samples (a table that appeared
    in between grew from nothing)."""
    hours = hours_between(first, last)
    growth = {}
    for name, table in last.tables.items():
        before = first.tables.get(name, TableSample(name, 0, 0))
        growth[name] = {
            "bytes": (table.bytes - before.bytes) / hours,
            "rows": (table.rows - before.rows) / hours,
        }
    return growth


def kept_days(part: str) -> float | None:
    """How long a part of the instance is kept, in days; None: for good."""
    if part in RUN_BOUND_TABLES or part == RUN_EVENTS:
        return RUN_BOUND_DAYS
    if part.startswith("job_ticks:"):
        _, kind, status = part.split(":", 2)
        if kind == "SCHEDULE":
            return SCHEDULE_TICK_DAYS
        return TICK_DAYS.get(status, max(TICK_DAYS.values()))
    return None


def part_growth_bytes_per_hour(first: InstanceSample, last: InstanceSample) -> dict[str, float]:
    """Bytes per hour by part: a split table's growth (with its indexes) shared among its parts
    in proportion to the growth of their row data; any other table is a part of its own."""
    table_growth = growth_per_hour(first, last)
    parts: dict[str, float] = {}
    for table, growth in table_growth.items():
        prefix = f"{table}:"
        gained = {
            part: max(0, size - first.parts.get(part, (0, 0))[1])
            for part, (_, size) in last.parts.items()
            if part.startswith(prefix)
        }
        total = sum(gained.values())
        if not total:
            parts[table] = growth["bytes"]
            continue
        for part, size in gained.items():
            parts[part] = growth["bytes"] * size / total
    return parts


# How the instance's growth is kept, by kind (`growth_kind`).
PRUNED_WITH_RUNS = "pruned with their runs (14 days)"
TICK_HISTORY = "tick history (purged after 1-30 days)"
UPDATE_CHURN = "update churn (rows rewritten in place, reclaimed by autovacuum)"
KEPT_FOR_GOOD = "kept for good (runless events, check executions)"


def growth_kind(part: str, first: InstanceSample, last: InstanceSample) -> str:
    """What keeps a part's growth: pruning, tick retention, autovacuum (a table whose bytes
    grow while its rows do not: the sensors' and schedules' state rows, rewritten at every tick,
    leave dead versions that vacuum reuses), or nothing."""
    if part.startswith("job_ticks:"):
        return TICK_HISTORY
    if kept_days(part) is not None:
        return PRUNED_WITH_RUNS
    table = last.tables.get(part)
    before = first.tables.get(part)
    if table is not None and before is not None and table.rows <= before.rows:
        return UPDATE_CHURN
    return KEPT_FOR_GOOD


def growth_by_kind(first: InstanceSample, last: InstanceSample) -> dict[str, float]:
    """MB per hour by `growth_kind`."""
    kinds = dict.fromkeys((PRUNED_WITH_RUNS, TICK_HISTORY, UPDATE_CHURN, KEPT_FOR_GOOD), 0.0)
    for part, rate in part_growth_bytes_per_hour(first, last).items():
        kinds[growth_kind(part, first, last)] += rate / 1e6
    return {kind: round(rate, 3) for kind, rate in kinds.items()}


def accumulating_mb_per_hour(first: InstanceSample, last: InstanceSample) -> float:
    """The growth that stays past a day before pruning: all but the update churn and the
    skipped ticks' (purged after a day)."""
    parts = part_growth_bytes_per_hour(first, last)
    staying = sum(
        rate
        for part, rate in parts.items()
        if growth_kind(part, first, last) in (PRUNED_WITH_RUNS, KEPT_FOR_GOOD)
        or (part.startswith("job_ticks:") and (kept_days(part) or 0) > 1)
    )
    return round(staying / 1e6, 3)


def thirty_day_projection(
    first: InstanceSample, last: InstanceSample, days: float = PROJECTION_DAYS
) -> dict[str, float]:
    """The instance's size after `days` at the measured rates: its size at the start plus each
    part's growth per hour times the hours it is kept (at most `days`). PostgreSQL reuses the
    space of deleted rows (autovacuum), so a pruned part stops growing once its age is reached:
    a steady state; update churn is reused as it goes and adds nothing."""
    hours = days * HOURS_PER_DAY
    kept_bytes = 0.0
    pruned_bytes = 0.0
    for part, rate in part_growth_bytes_per_hour(first, last).items():
        kind = growth_kind(part, first, last)
        if kind == UPDATE_CHURN:
            continue
        keep = kept_days(part)
        if keep is None:
            kept_bytes += max(0.0, rate) * hours
        else:
            pruned_bytes += max(0.0, rate) * min(hours, keep * HOURS_PER_DAY)
    start = first.database_bytes
    return {
        "days": days,
        "start_mb": round(start / 1e6, 1),
        "pruned_parts_mb": round(pruned_bytes / 1e6, 1),
        "kept_for_good_mb": round(kept_bytes / 1e6, 1),
        "total_mb": round((start + pruned_bytes + kept_bytes) / 1e6, 1),
        "without_pruning_mb": round(start / 1e6 + database_mb_per_hour(first, last) * hours, 1),
    }


# --- processes ----------------------------------------------------------------------------------


def rss_mb(pid: int) -> float | None:
    """A process's resident set in MB (None when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def process_rss(leaders: Mapping[str, int], workers_of: str = "code_server") -> dict[str, float]:
    """RSS in MB of each named process; of the run workers (the processes the code server
    spawned to execute runs) their count; and of everything else in the code server's group
    (the run workers with their log tails and orphan watchers) the total."""
    sample = {name: round(rss_mb(pid) or 0.0, 1) for name, pid in leaders.items()}
    leader = leaders.get(workers_of)
    if leader is not None:
        members = [pid for pid in group_members(leader, zombies=False) if pid != leader]
        sizes = {pid: rss_mb(pid) for pid in members}
        sample["run_workers"] = float(sum(_is_run_worker(pid) for pid in members))
        sample["run_workers_mb"] = round(sum(size or 0.0 for size in sizes.values()), 1)
    return sample


def _is_run_worker(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"multiprocessing.spawn" in command


def directory_bytes(path: Path) -> int:
    """The bytes of the files under `path` (files that vanish meanwhile are skipped)."""
    total = 0
    for entry in path.rglob("*"):
        with contextlib.suppress(OSError):
            if entry.is_file():
                total += entry.stat().st_size
    return total


def rss_growth(first: Mapping[str, float], last: Mapping[str, float]) -> dict[str, float | None]:
    """Each long-lived process's RSS growth between two samples, as a fraction."""
    return {
        name: (round(last[name] / first[name] - 1, 3) if first.get(name) else None)
        for name in last
        if not name.startswith(("run_workers", "home_"))
    }


__all__ = [
    "RUNLESS_EVENTS",
    "RUN_EVENTS",
    "InstanceSample",
    "TableSample",
    "accumulating_mb_per_hour",
    "database_mb_per_hour",
    "directory_bytes",
    "growth_by_kind",
    "growth_per_hour",
    "hours_between",
    "kept_days",
    "part_growth_bytes_per_hour",
    "process_rss",
    "rss_growth",
    "thirty_day_projection",
]
