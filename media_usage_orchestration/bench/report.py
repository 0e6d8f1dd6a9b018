"""What a measurement prints for people: one line of throughput, a line per phase."""

from __future__ import annotations

from media_usage_orchestration.bench.database import console
from media_usage_orchestration.bench.measure import BenchResult, peak_rss_mb
from media_usage_orchestration.processing.loop.phases import OTHER, PHASES


def print_phases(result: BenchResult) -> None:
    for name in (*PHASES, OTHER):
        seconds = result.phase_seconds.get(name, 0.0)
        statements = result.phase_statements.get(name, 0)
        console.print(
            f"  {name:<9} {seconds:8.2f} s  {statements / result.entries:7.2f} statements/entry"
        )


def print_result(result: BenchResult) -> None:
    rate = result.entries / result.seconds if result.seconds else float("inf")
    workers = f", {result.workers} workers" if result.workers > 1 else ""
    console.print(
        f"{result.workload} ({result.mode}{', ' + result.path if result.path else ''}, "
        f"{result.dialect}{workers}): {result.entries} entries in {result.seconds:.2f} s = "
        f"[bold]{rate:,.0f} entries/s[/], {result.runs} runs, "
        f"{result.statements / result.entries:.2f} statements/entry, "
        f"peak RSS {peak_rss_mb():.0f} MB, verified: {result.verified}"
    )
    print_phases(result)
    speedup = result.extra.get("drain_speedup")
    if speedup is not None:
        console.print(
            f"drain: {result.extra['baseline_drain_seconds']:.2f} s with one worker, "
            f"{result.phase_seconds.get('drain', 0.0):.2f} s with {result.workers}: "
            f"[bold]{speedup:.2f}x[/]"
        )
