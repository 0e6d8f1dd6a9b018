"""`make bench`: every measurement the acceptance numbers need, each in its own process (so
peak RSS is that measurement's), then one summary table and the targets, met or not.

    python -m media_usage_orchestration.bench.suite --entries 5000 --postgres-url URL

Measurements: the six reconciliation combinations (SQLite/PostgreSQL x driver/floor/Dagster) at N
entries, `--repeat` times in alternation (this machine's speed drifts by 10-15 % within
minutes, so one pair can differ by that much for no reason of its own; the targets are judged
on each combination's median); 10 N entries with the driver and with Dagster on SQLite (and
the driver on PostgreSQL unless `--no-large-postgres`); the drain with 2 workers on PostgreSQL
against one; the work and queue sensors' ticks over `--tick-rows` generated work rows on both
dialects; the projection GC reaping a backlog of `--gc-rows` obsolete rows (`gc.py`) on both
dialects; unless `--no-live`, the live latency with a real daemon (`live.py`) on both dialects;
unless `--soak-minutes 0`, a short soak of the production setup on PostgreSQL (`soak.py`).
Each Dagster-mode reconciliation also runs its job's floor (`floor.py`) before and after its
run: the summary's floor table shows both, and the reconciliation run's overhead beyond its
steps is judged against the floor's wall time, on the medians of the rounds.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import click
from rich.console import Console
from rich.table import Table

from media_usage_orchestration.bench.database import console
from media_usage_orchestration.processing.loop.phases import OTHER, PHASES

# Wide enough for the summary table whatever the terminal (or pipe) says.
SUMMARY_WIDTH = 160
TARGETS = {
    "sqlite_dagster_rate": 2000.0,
    "postgresql_dagster_rate": 1000.0,
    "dagster_over_driver": 1.10,
    "tenfold_time_ratio": 11.0,
    "peak_rss_mb": 300.0,
    "tick_ms": 50.0,
    "queue_probe_ms": 20.0,
    "drain_speedup": 1.7,
    "overhead_over_floor": 1.25,
    "driver_over_drain_floor": 0.8,
    "live_p50_seconds": 3.0,
    "live_p95_seconds": 10.0,
    "live_runs_in_idle": 0,
    "gc_runs": 2,
    "gc_seconds": 120.0,
}
FLOOR_COLUMNS = (
    ("dagster_floor_seconds", "floor s"),
    ("floor_events_per_run", "floor events"),
    ("run_seconds", "run s"),
    ("run_steps_seconds", "steps s"),
    ("run_overhead_seconds", "overhead s"),
    ("events_per_run", "events"),
    ("overhead_over_floor", "overhead/floor"),
)


@dataclass(frozen=True)
class Measurement:
    name: str
    arguments: tuple[str, ...]
    record: dict = field(default_factory=dict)
    failed: str | None = None
    round: int = 1

    @property
    def label(self) -> str:
        return measurement_label(self.name, self.round)


def measurement_label(name: str, round_: int) -> str:
    return name if round_ == 1 else f"{name} #{round_}"


def bench_command(arguments: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "media_usage_orchestration.cli", "bench", *arguments]


def run_measurement(name: str, arguments: Sequence[str], round_: int = 1) -> Measurement:
    """One `media-usage bench` process; its output passes through, its last line is the
    record."""
    console.rule(f"[bold]{measurement_label(name, round_)}")
    process = subprocess.Popen(
        bench_command(arguments), stdout=subprocess.PIPE, text=True, encoding="utf-8"
    )
    last = ""
    for line in process.stdout:
        sys.stdout.write(line)
        if line.strip():
            last = line.strip()
    code = process.wait()
    arguments = tuple(arguments)
    try:
        record = json.loads(last)
    except json.JSONDecodeError:
        return Measurement(name, arguments, failed=f"exit {code}, no record", round=round_)
    if code != 0:
        return Measurement(name, arguments, record, failed=f"exit {code}", round=round_)
    return Measurement(name, arguments, record, round=round_)


def plan(
    entries: int,
    postgres_url: str,
    tick_rows: int,
    large_postgres: bool,
    repeat: int = 1,
    live: bool = True,
    gc_rows: int = 100_000,
    soak_minutes: float = 0,
) -> list[tuple[str, list[str], int]]:
    """(name, arguments, round) of every measurement, in the order they run."""
    postgres = ["--database-url", postgres_url]
    large = str(entries * 10)
    base = [
        ("sqlite driver", ["--entries", str(entries), "--mode", "driver"]),
        ("sqlite floor", ["--entries", str(entries), "--mode", "floor"]),
        ("sqlite dagster", ["--entries", str(entries), "--mode", "dagster"]),
        ("postgresql driver", ["--entries", str(entries), "--mode", "driver", *postgres]),
        ("postgresql floor", ["--entries", str(entries), "--mode", "floor", *postgres]),
        ("postgresql dagster", ["--entries", str(entries), "--mode", "dagster", *postgres]),
    ]
    measurements = [
        (name, arguments, round_) for round_ in range(1, repeat + 1) for name, arguments in base
    ]
    once = [
        ("sqlite driver 10x", ["--entries", large, "--mode", "driver"]),
        # Dagster's cost is per run, not per entry: the ratio at 10x shows how much is fixed.
        ("sqlite dagster 10x", ["--entries", large, "--mode", "dagster"]),
    ]
    if large_postgres:
        once.append(("postgresql driver 10x", ["--entries", large, *postgres]))
    once += [
        ("postgresql 2 workers", ["--entries", str(entries), "--workers", "2", *postgres]),
        ("sqlite tick", ["--workload", "tick", "--entries", str(tick_rows)]),
        ("postgresql tick", ["--workload", "tick", "--entries", str(tick_rows), *postgres]),
        ("sqlite gc", ["--workload", "gc", "--entries", str(gc_rows)]),
        ("postgresql gc", ["--workload", "gc", "--entries", str(gc_rows), *postgres]),
    ]
    if live:
        once += [
            ("sqlite live", ["--workload", "live"]),
            ("postgresql live", ["--workload", "live", *postgres]),
        ]
    if soak_minutes:
        soak = ["--workload", "soak", "--minutes", f"{soak_minutes:g}", "--report-minutes", "1"]
        once.append(("postgresql soak", [*soak, "--entries", "1500", *postgres]))
    return measurements + [(name, arguments, 1) for name, arguments in once]


# --- the summary --------------------------------------------------------------------------------


def summary_table(measurements: Sequence[Measurement]) -> Table:
    table = Table(title="media-usage bench", show_lines=False)
    floors = _floor_rates(measurements)
    columns = ("measurement", "entries", "s", "entries/s", "/floor", *PHASES, OTHER, "stmts/entry")
    for column in columns:
        table.add_column(column, justify="left" if column == "measurement" else "right")
    table.add_column("peak RSS MB", justify="right")
    table.add_column("verified", justify="center")
    for each in measurements:
        record = each.record
        if each.failed and not record:
            table.add_row(each.label, *["-"] * 12, each.failed)
            continue
        if record.get("workload") in ("tick", "live", "gc"):
            continue
        phases = record.get("phases", {})
        table.add_row(
            each.label,
            f"{record['entries']:,}",
            f"{record['seconds']:.2f}",
            f"{record['entries_per_second']:,.0f}",
            _over_floor(record, floors),
            *(f"{phases.get(name, {}).get('seconds', 0.0):.2f}" for name in (*PHASES, OTHER)),
            f"{record['statements_per_entry']:.2f}",
            f"{record['peak_rss_mb']:.0f}",
            "yes" if record.get("verified") and not each.failed else f"NO {each.failed or ''}",
        )
    return table


def _floor_rates(measurements: Sequence[Measurement]) -> dict[tuple[str, int], float]:
    """The floor mode's rate of each (dialect, entries): the median of its rounds."""
    rates: dict[tuple[str, int], list[float]] = {}
    for each in measurements:
        record = each.record
        if record.get("mode") == "floor" and record.get("entries_per_second"):
            key = (record["dialect"], record["entries"])
            rates.setdefault(key, []).append(record["entries_per_second"])
    return {key: statistics.median(values) for key, values in rates.items()}


def _over_floor(record: dict, floors: dict[tuple[str, int], float]) -> str:
    """project/floor: this rate over the floor mode's median rate at the same size."""
    floor = floors.get((record.get("dialect"), record.get("entries")))
    rate = record.get("entries_per_second")
    if not floor or not rate or record.get("mode") == "floor":
        return "-"
    return f"{rate / floor:.2f}"


def floor_table(measurements: Sequence[Measurement]) -> Table:
    """Each Dagster-mode measurement's job run beside its floor (bench/floor.py)."""
    table = Table(title="runs beside Dagster's floor (medians of the runs of each measurement)")
    table.add_column("measurement")
    for _key, header in FLOOR_COLUMNS:
        table.add_column(header, justify="right")
    for each in measurements:
        if "dagster_floor_seconds" in each.record:
            table.add_row(each.label, *(str(each.record.get(key, "-")) for key, _ in FLOOR_COLUMNS))
    return table


def live_table(measurements: Sequence[Measurement]) -> Table:
    table = Table(title="live latency with a real daemon (seconds from commit to projection)")
    for header in ("measurement", "edits", "projected", "p50", "p95", "max", "runs", "idle runs"):
        table.add_column(header, justify="left" if header == "measurement" else "right")
    for each in measurements:
        record = each.record
        if record.get("workload") != "live":
            continue
        latency = record["latency_seconds"]
        table.add_row(
            each.label,
            str(record["edits"]),
            str(record["projected"]),
            *(str(latency[name]) for name in ("p50", "p95", "max")),
            str(record["runs_during_load"]),
            str(record["runs_in_idle"]),
        )
    return table


def gc_table(measurements: Sequence[Measurement]) -> Table:
    table = Table(title="projection GC reaping a backlog of obsolete rows")
    for header in (
        "measurement",
        "backlog",
        "s",
        "rows/s",
        "runs",
        "passes",
        "ms/pass",
        "verified",
    ):
        table.add_column(header, justify="left" if header == "measurement" else "right")
    for each in measurements:
        record = each.record
        if record.get("workload") != "gc":
            continue
        table.add_row(
            each.label,
            f"{record['backlog_rows']:,}",
            f"{record['seconds']:.1f}",
            f"{record['rows_per_second']:,.0f}",
            str(record["runs"]),
            f"{record['passes']:,}",
            str(record["pass_ms"]),
            "yes" if record["verified"] and not each.failed else f"NO {each.failed or ''}",
        )
    return table


def _records_by_name(measurements: Sequence[Measurement]) -> dict[str, list[dict]]:
    """Each name's records, a repeated measurement's in order of time."""
    grouped: dict[str, list[dict]] = {}
    for each in measurements:
        if each.record:
            grouped.setdefault(each.name, []).append(each.record)
    return {
        name: sorted(records, key=lambda record: record.get("seconds", 0.0))
        for name, records in grouped.items()
    }


def findings(measurements: Sequence[Measurement]) -> list[tuple[str, float | None, str, bool]]:
    """(what, value, target, met) for every acceptance number the run measured."""
    by_name = _records_by_name(measurements)
    # Of a repeated measurement, the run of median time (the lower middle one for an even count).
    records = {name: runs[(len(runs) - 1) // 2] for name, runs in by_name.items()}
    found = []

    def add(what: str, value: float | None, target: str, met: bool) -> None:
        found.append((what, value, target, met))

    def median_of(name: str) -> str:
        times = len(by_name.get(name, ()))
        return f" (medians of {times})" if times > 1 else ""

    for dialect, name in (
        ("sqlite", "sqlite_dagster_rate"),
        ("postgresql", "postgresql_dagster_rate"),
    ):
        dagster, driver = records.get(f"{dialect} dagster"), records.get(f"{dialect} driver")
        if dagster:
            rate = dagster["entries_per_second"]
            add(
                f"{dialect} Dagster entries/s{median_of(f'{dialect} dagster')}",
                rate,
                f">= {TARGETS[name]:,.0f}",
                rate >= TARGETS[name],
            )
        # At the base size a run's fixed cost is judged against Dagster's floor (overhead/floor
        # below), not mixed into a Dagster/driver ratio; at 10x that ratio shows the per-entry
        # cost, which is what it can judge.
        large = records.get(f"{dialect} driver 10x")
        large_dagster = records.get(f"{dialect} dagster 10x")
        if large and large_dagster:
            ratio = round(large_dagster["seconds"] / large["seconds"], 2)
            limit = TARGETS["dagster_over_driver"]
            add(f"{dialect} Dagster/driver time, 10x entries", ratio, f"<= {limit}", ratio <= limit)
        if large and driver:
            ratio = round(large["seconds"] / driver["seconds"], 2)
            limit = TARGETS["tenfold_time_ratio"]
            add(f"{dialect} 10x entries time ratio", ratio, f"<= {limit}", ratio <= limit)
        tick = records.get(f"{dialect} tick")
        if tick:
            rows = f"{tick['work_rows']:,} rows"
            for what, name, target in (
                ("work sensor tick", "tick_ms", "tick_ms"),
                ("work sensor probe", "probe_ms", "tick_ms"),
                ("queue sensor probe", "queue_probe_ms", "queue_probe_ms"),
                ("queue sensor tick", "queue_tick_ms", "tick_ms"),
            ):
                limit = TARGETS[target]
                value = tick[name]
                add(f"{dialect} {what} ms ({rows})", value, f"<= {limit}", value <= limit)
        _drain_floor_finding(add, by_name, dialect)
        _floor_findings(add, by_name.get(f"{dialect} dagster", []), dialect)
        _live_findings(add, records.get(f"{dialect} live"), dialect)
        _gc_findings(add, records.get(f"{dialect} gc"), dialect)
    _soak_findings(add, records.get("postgresql soak"))
    peaks = [record["peak_rss_mb"] for record in records.values() if "peak_rss_mb" in record]
    if peaks:
        limit = TARGETS["peak_rss_mb"]
        add("peak RSS MB (largest)", max(peaks), f"<= {limit:.0f}", max(peaks) <= limit)
    workers = records.get("postgresql 2 workers")
    if workers and workers.get("drain_speedup") is not None:
        limit = TARGETS["drain_speedup"]
        speedup = workers["drain_speedup"]
        add("postgresql drain, 2 workers over 1", speedup, f">= {limit}", speedup >= limit)
    return found


def _ratio_of_medians(
    tops: Sequence[dict], top_key: str, bottoms: Sequence[dict], bottom_key: str
) -> float | None:
    """The median of `top_key` over the median of `bottom_key`, as reported (None over 0)."""
    bottom = statistics.median(record[bottom_key] for record in bottoms)
    top = statistics.median(record[top_key] for record in tops)
    return round(top / bottom, 2) if bottom else None


def _floor_findings(add, runs: Sequence[dict], dialect: str) -> None:
    """The reconciliation run's overhead beyond its steps over the floor's wall time, each the
    median of the rounds."""
    measured = [record for record in runs if "run_overhead_seconds" in record]
    if not measured:
        return
    ratio = _ratio_of_medians(measured, "run_overhead_seconds", measured, "dagster_floor_seconds")
    limit = TARGETS["overhead_over_floor"]
    rounds = f" (medians of {len(measured)})" if len(measured) > 1 else ""
    what = f"{dialect} run overhead / Dagster floor{rounds}"
    add(what, ratio, f"<= {limit}", ratio is not None and ratio <= limit)


def _drain_floor_finding(add, by_name: dict[str, list[dict]], dialect: str) -> None:
    """The driver's rate over the floor mode's, medians of the alternated rounds."""
    drivers = by_name.get(f"{dialect} driver", [])
    floors = by_name.get(f"{dialect} floor", [])
    if not drivers or not floors:
        return
    ratio = _ratio_of_medians(drivers, "entries_per_second", floors, "entries_per_second")
    limit = TARGETS["driver_over_drain_floor"]
    rounds = f" (medians of {min(len(drivers), len(floors))})" if len(drivers) > 1 else ""
    met = ratio is not None and ratio >= limit
    add(f"{dialect} driver/floor entries/s{rounds}", ratio, f">= {limit}", met)


def _live_findings(add, live: dict | None, dialect: str) -> None:
    if not live:
        return
    latency = live["latency_seconds"]
    complete = live["projected"] == live["edits"]
    for name, target in (("p50", "live_p50_seconds"), ("p95", "live_p95_seconds")):
        value, limit = latency[name], TARGETS[target]
        met = complete and value is not None and value <= limit
        add(
            f"{dialect} live latency {name} s ({live['rate']:g} edits/s)", value, f"<= {limit}", met
        )
    limit = TARGETS["live_runs_in_idle"]
    idle = live["runs_in_idle"]
    add(
        f"{dialect} live runs launched in the idle {live['idle_seconds']:g} s",
        idle,
        f"= {limit}",
        idle <= limit,
    )


def _soak_findings(add, soak: dict | None) -> None:
    """The soak's targets (`soak.TARGETS`), each on its own line."""
    if not soak:
        return
    targets = soak["targets"]
    minutes = f"soak {soak['minutes']:g} min"
    latency = soak["latency_seconds"]
    complete = soak["verified"] and soak["projected"] == soak["edits"]
    lines = (
        ("latency p95 s", latency["p95"], "p95_seconds"),
        ("latency max s", latency["max"], "max_seconds"),
        (
            "instance MB/h staying past a day",
            soak["accumulating_mb_per_hour"],
            "instance_mb_per_hour",
        ),
        (
            "event_logs rows/h",
            soak["rows_per_hour"].get("event_logs", 0),
            "event_logs_rows_per_hour",
        ),
        ("alerts posted", soak["alerts"], "alerts"),
        ("failed runs", soak["failed_runs"], "failed_runs"),
        ("FAILURE ticks", soak["failure_ticks"], "failure_ticks"),
    )
    for what, value, name in lines:
        limit = targets[name]
        add(
            f"{minutes}: {what}",
            value,
            f"<= {limit}",
            complete and value is not None and value <= limit,
        )


def _gc_findings(add, gc: dict | None, dialect: str) -> None:
    """The backlog drained (to its last row, the index verified) within the runs and seconds."""
    if not gc:
        return
    backlog = f"{gc['backlog_rows']:,}-row backlog"
    drained = gc["verified"] and gc["backlog_left"] == 0
    for what, value, name in (("runs", gc["runs"], "gc_runs"), ("s", gc["seconds"], "gc_seconds")):
        limit = TARGETS[name]
        add(
            f"{dialect} projection GC {what} to drain a {backlog}",
            value,
            f"<= {limit}",
            drained and value <= limit,
        )


def print_summary(measurements: Sequence[Measurement]) -> None:
    wide = Console(width=SUMMARY_WIDTH, soft_wrap=True)
    wide.rule("[bold]summary")
    wide.print(summary_table(measurements))
    if any("dagster_floor_seconds" in each.record for each in measurements):
        wide.print(floor_table(measurements))
    if any(each.record.get("workload") == "live" for each in measurements):
        wide.print(live_table(measurements))
    if any(each.record.get("workload") == "gc" for each in measurements):
        wide.print(gc_table(measurements))
    for what, value, target, met in findings(measurements):
        mark = "[green]met[/]" if met else "[red]NOT met[/]"
        wide.print(f"  {what:<60} {value!s:>10}  target {target:<9} {mark}")
    for each in measurements:
        if each.failed:
            wide.print(f"  [red]{each.label} failed: {each.failed}[/]")


@click.command()
@click.option("--entries", default=5000, show_default=True, type=click.IntRange(1))
@click.option("--postgres-url", required=True, help="The PostgreSQL server (fresh schemas).")
@click.option("--tick-rows", default=1_000_000, show_default=True, type=click.IntRange(1))
@click.option("--large-postgres/--no-large-postgres", default=True, show_default=True)
@click.option(
    "--repeat",
    default=3,
    show_default=True,
    type=click.IntRange(1, 9),
    help="Rounds of the six base-size reconciliations, in alternation; medians are judged.",
)
@click.option(
    "--live/--no-live",
    default=True,
    show_default=True,
    help="The live latency with a real daemon on both dialects (about 3 minutes each).",
)
@click.option(
    "--soak-minutes",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 1440),
    help="A soak of the production setup on PostgreSQL for this many minutes (0: none).",
)
@click.option(
    "--gc-rows",
    default=100_000,
    show_default=True,
    type=click.IntRange(1),
    help="Obsolete occurrence rows the projection GC reaps on each dialect.",
)
def main(
    entries: int,
    postgres_url: str,
    tick_rows: int,
    large_postgres: bool,
    repeat: int,
    live: bool,
    gc_rows: int,
    soak_minutes: float,
) -> None:
    """Run every bench measurement in its own process and print one summary."""
    measurements = [
        run_measurement(name, arguments, round_)
        for name, arguments, round_ in plan(
            entries, postgres_url, tick_rows, large_postgres, repeat, live, gc_rows, soak_minutes
        )
    ]
    print_summary(measurements)
    if any(each.failed for each in measurements):
        raise SystemExit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
