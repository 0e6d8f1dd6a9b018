"""The demo end to end on both dialects, at a small size: real runs in a persistent instance,
every remaining collection complete, no drift, the deleted collection gone; run twice."""

import io

import click
import dagster as dg
import pytest
from rich.console import Console

from media_usage_orchestration.demo import (
    DELETED_COLLECTION,
    LOCAL_INSTANCE_MARKER,
    DemoCollection,
    run_demo,
)
from media_usage_orchestration.processing.verify import verify_index
from media_usage_orchestration.store import schema
from media_usage_orchestration.store.schema import missing_tables
from tests.support import all_rows, snapshot

SMALL = (
    DemoCollection("articles", "art", 40),
    DemoCollection("pages", "pag", 25),
    DemoCollection(DELETED_COLLECTION, "pro", 15),
)
JOBS = {
    "media_usage_activation",
    "media_usage_reconciliation",
    "media_usage_work",
    "request_collection_deletion",
    "media_usage_collection_deletion",
    "media_usage_maintenance",
}


def _demo(db, home) -> tuple[int, str]:
    output = io.StringIO()
    code = run_demo(db.url, Console(file=output, width=120), home, SMALL)
    return code, output.getvalue()


def _runs_by_job(home) -> dict[str, list[dg.DagsterRun]]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
    by_job: dict[str, list[dg.DagsterRun]] = {}
    for run in runs:
        by_job.setdefault(run.job_name, []).append(run)
    return by_job


def _assert_demo_outcome(db, home, code: int, output: str) -> None:
    assert code == 0, output
    assert "verify: 0 differences (no drift)" in output
    assert f"{DELETED_COLLECTION}: deleted" in output
    assert "Media usage coverage" in output and "Open the UI with make dev" in output
    slugs = sorted(row["slug"] for row in all_rows(db.engine, schema.collections))
    assert slugs == ["articles", "pages"]
    statuses = {row["scope_key"]: row["status"] for row in all_rows(db.engine, schema.index_status)}
    assert statuses == {"articles": "complete", "pages": "complete"}
    assert not verify_index(db.engine).has_drift
    assert all_rows(db.engine, schema.work) == []
    runs = _runs_by_job(home)
    assert set(runs) == JOBS
    assert all(run.status == dg.DagsterRunStatus.SUCCESS for job in runs.values() for run in job)
    partitions = {run.tags.get("dagster/partition") for run in runs["media_usage_reconciliation"]}
    assert partitions == {"articles", "pages", DELETED_COLLECTION}
    assert (home / LOCAL_INSTANCE_MARKER).exists()


@pytest.mark.slow
def test_the_demo_runs_every_workflow_and_a_second_demo_starts_over(empty_db, tmp_path):
    """On SQLite the second demo starts over (its own file, its own instance history); a
    server database it already filled is refused, and left as it is."""
    home = tmp_path / ".dagster_home"
    _assert_demo_outcome(empty_db, home, *_demo(empty_db, home))
    first_runs = sum(len(runs) for runs in _runs_by_job(home).values())

    if empty_db.dialect == "sqlite":
        code, output = _demo(empty_db, home)
        assert "Starting over: removing the previous demo database" in output
        assert "Starting over: clearing the demo's Dagster history" in output
        _assert_demo_outcome(empty_db, home, code, output)
        assert sum(len(runs) for runs in _runs_by_job(home).values()) == first_runs
    else:
        before = snapshot(empty_db.engine)
        with pytest.raises(click.ClickException, match="needs an empty database"):
            _demo(empty_db, home)
        assert snapshot(empty_db.engine) == before


def test_the_demo_never_clears_an_instance_it_did_not_create(empty_db, tmp_path):
    home = tmp_path / "someone_elses_home"
    home.mkdir()
    (home / "history").mkdir()

    with pytest.raises(click.ClickException, match="did not create"):
        _demo(empty_db, home)

    assert (home / "history").is_dir()
    assert missing_tables(empty_db.engine) == [table.name for table in schema.EMDASH_TABLES]
