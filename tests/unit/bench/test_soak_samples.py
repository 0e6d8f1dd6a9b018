"""The soak benchmark's arithmetic: growth per hour, how long each part of the instance is
kept, the 30-day projection, and RSS growth (no database: samples are built by hand)."""

from __future__ import annotations

import os

import pytest

from media_usage_orchestration.bench.soak_samples import (
    RUN_EVENTS,
    RUNLESS_EVENTS,
    InstanceSample,
    TableSample,
    directory_bytes,
    growth_per_hour,
    kept_days,
    part_growth_bytes_per_hour,
    process_rss,
    rss_growth,
    thirty_day_projection,
)

MB = 1_000_000


def sample(at: float, tables: dict[str, tuple[int, int]], parts=None, database=None):
    built = {name: TableSample(name, size, rows) for name, (size, rows) in tables.items()}
    total = database if database is not None else sum(size for size, _ in tables.values())
    return InstanceSample(at, total, built, dict(parts or {}), {})


def test_growth_per_hour_is_the_difference_over_the_hours_between_the_samples():
    first = sample(0.0, {"runs": (1 * MB, 10)})
    last = sample(1800.0, {"runs": (2 * MB, 60), "kvs": (MB, 4)})

    growth = growth_per_hour(first, last)

    assert growth["runs"] == {"bytes": 2 * MB, "rows": 100}
    # A table that appeared in between grew from nothing.
    assert growth["kvs"] == {"bytes": 2 * MB, "rows": 8}


@pytest.mark.parametrize(
    ("part", "days"),
    [
        ("runs", 14.0),
        ("run_tags", 14.0),
        (RUN_EVENTS, 14.0),
        ("job_ticks:SENSOR:SKIPPED", 1.0),
        ("job_ticks:SENSOR:SUCCESS", 14.0),
        ("job_ticks:SENSOR:FAILURE", 30.0),
        ("job_ticks:SCHEDULE:SKIPPED", 30.0),
        (RUNLESS_EVENTS, None),
        ("asset_check_executions", None),
        ("snapshots", None),
    ],
)
def test_each_part_of_the_instance_is_kept_as_retention_and_pruning_keep_it(part, days):
    assert kept_days(part) == days


def test_a_split_table_shares_its_growth_among_its_parts_by_their_row_data():
    first = sample(0.0, {"event_logs": (0, 0)}, {RUN_EVENTS: (0, 0), RUNLESS_EVENTS: (0, 0)})
    last = sample(
        3600.0,
        {"event_logs": (4 * MB, 400), "runs": (MB, 10)},
        {RUN_EVENTS: (300, 3 * MB), RUNLESS_EVENTS: (100, MB)},
    )

    parts = part_growth_bytes_per_hour(first, last)

    assert parts == {RUN_EVENTS: 3 * MB, RUNLESS_EVENTS: MB, "runs": MB}


def test_the_projection_keeps_pruned_parts_for_their_age_and_the_rest_for_thirty_days():
    first = sample(0.0, {"event_logs": (0, 0)}, database=10 * MB)
    last = sample(
        3600.0,
        {"event_logs": (3 * MB, 300), "asset_check_executions": (MB, 10)},
        {RUN_EVENTS: (200, 2 * MB), RUNLESS_EVENTS: (100, MB)},
        database=14 * MB,
    )

    projection = thirty_day_projection(first, last)

    # Run-bound events: 2 MB/h for 14 days; runless events and check executions: 1 MB/h
    # each for 30 days.
    assert projection["pruned_parts_mb"] == 2 * 24 * 14
    assert projection["kept_for_good_mb"] == 2 * 24 * 30
    assert projection["total_mb"] == 10 + 2 * 24 * 14 + 2 * 24 * 30
    assert projection["without_pruning_mb"] == 10 + 4 * 24 * 30


def test_rss_growth_is_judged_on_the_long_lived_processes_only():
    first = {"daemon": 100.0, "webserver": 200.0, "run_workers": 2.0, "run_workers_mb": 300.0}
    last = {"daemon": 110.0, "webserver": 190.0, "run_workers": 5.0, "run_workers_mb": 900.0}

    assert rss_growth(first, last) == {"daemon": 0.1, "webserver": -0.05}


def test_process_rss_reads_this_process_and_a_gone_one_as_nothing():
    rss = process_rss({"this": os.getpid(), "gone": 2**22 + 1}, workers_of="none")

    assert rss["this"] > 10
    assert rss["gone"] == 0.0


def test_directory_bytes_sums_the_files_below(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "out").write_bytes(b"x" * 1000)
    (tmp_path / "err").write_bytes(b"y" * 24)

    assert directory_bytes(tmp_path) == 1024


def test_growth_is_told_apart_by_what_keeps_it():
    """Run-bound rows go with their runs, ticks with tick retention, a table whose bytes grow
    while its rows do not is update churn (reused by vacuum: no part of the projection), the
    rest stays for good; what stays past a day leaves out the churn and skipped ticks."""
    from media_usage_orchestration.bench.soak_samples import (
        KEPT_FOR_GOOD,
        PRUNED_WITH_RUNS,
        TICK_HISTORY,
        UPDATE_CHURN,
        accumulating_mb_per_hour,
        growth_by_kind,
    )

    tables = {"runs": (0, 0), "instigators": (MB, 10), "asset_check_executions": (0, 0)}
    first = sample(0.0, {**tables, "job_ticks": (0, 0)}, database=10 * MB)
    last = sample(
        3600.0,
        {
            "runs": (MB, 10),
            "instigators": (3 * MB, 10),
            "asset_check_executions": (MB, 40),
            "job_ticks": (3 * MB, 300),
        },
        {"job_ticks:SENSOR:SKIPPED": (290, 2 * MB), "job_ticks:SENSOR:SUCCESS": (10, MB)},
        database=18 * MB,
    )

    assert growth_by_kind(first, last) == {
        PRUNED_WITH_RUNS: 1.0,
        TICK_HISTORY: 3.0,
        UPDATE_CHURN: 2.0,
        KEPT_FOR_GOOD: 1.0,
    }
    # runs 1 + check executions 1 + success ticks 1 (kept 14 days)
    assert accumulating_mb_per_hour(first, last) == 3.0
    projection = thirty_day_projection(first, last)
    assert projection["kept_for_good_mb"] == 24 * 30
    # runs and success ticks for 14 days, skipped ticks for one; churn adds nothing
    assert projection["pruned_parts_mb"] == 24 * 14 * 2 + 2 * 24
