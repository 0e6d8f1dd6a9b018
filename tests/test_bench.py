"""`media-usage bench` end to end on a small SQLite database: every mode reports one JSON
line with its measurement and a verified index."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from media_usage_orchestration.cli import main

FIELDS = {"mode", "dialect", "entries", "seconds", "entries_per_second", "runs", "peak_rss_mb"}


def run_bench(*arguments: str) -> dict:
    result = CliRunner().invoke(main, ["bench", "--entries", "200", *arguments])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["driver", "dagster"])
def test_reconcile_bench_reports_a_verified_measurement(mode):
    report = run_bench("--mode", mode)

    assert FIELDS | {"verified"} == set(report)
    assert (report["mode"], report["dialect"], report["entries"]) == (mode, "sqlite", 200)
    assert report["verified"] is True
    assert report["seconds"] > 0 and report["entries_per_second"] > 0
    assert report["runs"] >= 1 and report["peak_rss_mb"] > 0


@pytest.mark.parametrize("path", ["batch", "tick"])
def test_work_bench_reports_the_path_it_measured(path):
    report = run_bench("--workload", "work", "--path", path)

    assert FIELDS | {"verified", "workload", "path"} == set(report)
    assert (report["workload"], report["path"], report["dialect"]) == ("work", path, "sqlite")
    assert report["verified"] is True
