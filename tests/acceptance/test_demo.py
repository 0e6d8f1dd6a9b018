"""The demo end to end on both dialects, at a small size: real runs in a persistent instance,
launched as the daemon and the Launchpad launch them, every remaining collection complete, no
drift, the deleted collection gone; run twice. What `make dev` then shows is checked through
its own instance config and workspace: runs per job, partition status, sensor ticks, and
re-execution with the default run launcher."""

import io
import itertools
import re
import time

import click
import dagster as dg
import pytest
from dagster._core.scheduler.instigation import TickStatus
from dagster._daemon.types import DaemonHeartbeat
from rich.console import Console

from media_usage_orchestration.assets.index import MEDIA_USAGE_INDEX
from media_usage_orchestration.assets.media_library import MEDIA_USAGE_MEDIA_LIBRARY
from media_usage_orchestration.assets.projection_cleanup import MEDIA_USAGE_PROJECTION_CLEANUP
from media_usage_orchestration.demo import (
    DELETED_COLLECTION,
    LOCAL_INSTANCE_MARKER,
    DemoCollection,
    demo_media_library,
    run_demo,
)
from media_usage_orchestration.emdash_double.sample_content import UNUSED_UPLOADS
from media_usage_orchestration.local.daemon_lane import LOCATION_NAME, SENSOR_ROUND_SECONDS
from media_usage_orchestration.local.in_process_lane import LANE_SENSORS
from media_usage_orchestration.local.instance_home import DEV_PID_FILE
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.sensors.projection_gc import media_usage_projection_gc_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.schema import missing_tables
from media_usage_orchestration.store.host.registry import read_collection_id
from media_usage_orchestration.store.reads.coverage import read_collection_coverage
from media_usage_orchestration.store.sources.usage import media_library
from tests.support.cli import invoke_json
from tests.support.demo import (
    REPOSITORY,
    dequeue_and_wait,
    dev_context,
    exited_pid,
    partition_statuses,
    reexecute_all_steps,
    step_failures,
)
from tests.support.media_library import media_referenced_by_content
from tests.support.projection_gc import non_current_occurrences
from tests.support.sensor_loop import plain
from tests.support.states import all_rows, snapshot

SMALL = (
    DemoCollection("articles", "art", 40),
    DemoCollection("pages", "pag", 25),
    DemoCollection(DELETED_COLLECTION, "pro", 15),
)
SUCCESS = dg.DagsterRunStatus.SUCCESS
JOBS = {
    "media_usage_activation",
    "media_usage_reconciliation",
    "media_usage_work",
    "request_collection_deletion",
    "media_usage_collection_deletion",
    "media_usage_maintenance",
    "media_usage_projection_gc",
}
LIVE = {"articles", "pages"}
# The demo's own sensors: the lane's, and the projection GC's.
DEMO_SENSORS = (*LANE_SENSORS, media_usage_projection_gc_sensor)


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
    # Every run carries the origin of the workspace's code location, as a launched run does.
    origins = {run.remote_job_origin.location_name for job in runs.values() for run in job}
    assert origins == {LOCATION_NAME}
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for job_name, job_runs in runs.items():
            found = instance.get_runs(filters=dg.RunsFilter(job_name=job_name))
            assert {run.run_id for run in found} == {run.run_id for run in job_runs}
    assert (home / LOCAL_INSTANCE_MARKER).exists()
    assert "Demo phases" in output and "code server" in output
    _assert_the_index_overview_is_a_live_collection(db, home)
    _assert_one_projection_gc_pass_deleted_replaced_generations(db, home, output)
    _assert_unused_lists_exactly_the_unreferenced_media(db, home)


def _latest_materialization(home, key: dg.AssetKey) -> dg.EventLogEntry:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        event = instance.get_latest_materialization_event(key)
    assert event is not None, key
    return event


def _latest_metadata(home, key: dg.AssetKey) -> dict:
    return plain(_latest_materialization(home, key).asset_materialization.metadata)


def _assert_the_index_overview_is_a_live_collection(db, home) -> None:
    """The asset's latest materialization (its overview in the UI) is a collection that exists,
    with what its index holds now, not the deleted collection's last one."""
    event = _latest_materialization(home, MEDIA_USAGE_INDEX)
    slug = event.dagster_event.partition
    assert slug in LIVE
    metadata = plain(event.asset_materialization.metadata)
    coverage = read_collection_coverage(db.engine, read_collection_id(db.engine, slug))
    shown = {key: metadata[key] for key in ("coverage", "entries", "sources", "occurrences")}
    assert shown == {
        "coverage": "complete",
        "entries": coverage.entries,
        "sources": coverage.sources,
        "occurrences": coverage.occurrences,
    }


def _assert_one_projection_gc_pass_deleted_replaced_generations(db, home, output: str) -> None:
    [run] = _runs_by_job(home)["media_usage_projection_gc"]
    assert run.tags["dagster/sensor_name"] == media_usage_projection_gc_sensor.name
    aged = int(re.search(r"Projection GC: (\d+) occurrence rows", output).group(1))
    cleanup = _latest_metadata(home, MEDIA_USAGE_PROJECTION_CLEANUP)
    assert cleanup["outcome"] == "completed" and 0 < cleanup["deleted_rows"] <= aged
    # The pass deleted only replaced generations: the current ones are all still there.
    assert non_current_occurrences(db.engine) == aged - cleanup["deleted_rows"]


def _unused_ids(db) -> list[str]:
    """Every page of `media-usage unused`."""
    ids: list[str] = []
    cursor: tuple[str, ...] = ()
    while True:
        page = invoke_json(db, "unused", "--limit", "100", *cursor)
        ids += [item["id"] for item in page["items"]]
        if page["next_cursor"] is None:
            return ids
        cursor = ("--cursor", page["next_cursor"])


def _assert_unused_lists_exactly_the_unreferenced_media(db, home) -> None:
    """EmDash's media table holds the demo's library; `unused` lists exactly what no content
    references now (read from the content, not the index); the media library asset recorded
    the same numbers."""
    rows = {row["id"]: row for row in all_rows(db.engine, media_library)}
    library = {file.id for file in demo_media_library(SMALL)}
    assert set(rows) == library
    assert all(row["status"] == "ready" and row["size"] > 0 for row in rows.values())
    unused = library - media_referenced_by_content(db.engine)
    # Never used, the deleted collection's, and what the edit wave replaced or deleted.
    assert {file.id for file in UNUSED_UPLOADS} < unused
    assert {media_id[:4] for media_id in unused} == {"lib-", "pro-", "art-", "pag-"}
    assert _unused_ids(db) == sorted(unused)
    summary = _latest_metadata(home, MEDIA_USAGE_MEDIA_LIBRARY)
    assert {key: summary[key] for key in ("media", "used", "unused", "reclaimable_bytes")} == {
        "media": len(library),
        "used": len(library) - len(unused),
        "unused": len(unused),
        "reclaimable_bytes": sum(rows[media_id]["size"] for media_id in unused),
    }


def _assert_make_dev_sees_the_demo(db, home, monkeypatch) -> None:
    """Through `make dev`'s own instance config and workspace: the partition status, the lane
    sensors' ticks with the runs they launched, and "Re-execute all" of a run a sensor
    launched and of one launched from the job (default launcher, a run worker per run)."""
    runs = _runs_by_job(home)
    with dev_context(home, db.url, monkeypatch) as context:
        statuses = partition_statuses(context, "media_usage_reconciliation")
        assert statuses == {"articles": "SUCCESS", "pages": "SUCCESS"}

        instance = context.instance
        repository = (
            context.create_request_context().get_code_location(LOCATION_NAME)
        ).get_repository(REPOSITORY)
        ticked_run_ids = set()
        for sensor in DEMO_SENSORS:
            remote = repository.get_sensor(sensor.name)
            ticks = instance.get_ticks(remote.get_remote_origin_id(), remote.selector_id)
            assert TickStatus.SUCCESS in {tick.status for tick in ticks}, sensor.name
            # Dagster's clock ran about an hour behind the wall clock, a minute between rounds.
            times = sorted(tick.timestamp for tick in ticks)
            assert time.time() - 2 * 3600 < times[0] and times[-1] < time.time()
            assert min(b - a for a, b in itertools.pairwise(times)) >= SENSOR_ROUND_SECONDS
            ticked_run_ids.update(run_id for tick in ticks for run_id in tick.run_ids)
        sensor_runs = {
            run.run_id for job in runs.values() for run in job if "dagster/sensor_name" in run.tags
        }
        assert sensor_runs and ticked_run_ids == sensor_runs

        [articles] = [
            run
            for run in runs["media_usage_reconciliation"]
            if run.tags["dagster/partition"] == "articles"
        ]
        [activation] = runs["media_usage_activation"]
        [deletion_request] = runs["request_collection_deletion"]
        parents = [articles, activation, deletion_request]
        new_run_ids = [reexecute_all_steps(context, parent.run_id) for parent in parents]
        new_runs = dequeue_and_wait(context, new_run_ids)
        for parent, run in zip(parents, new_runs, strict=True):
            assert (run.parent_run_id, run.remote_job_origin.location_name) == (
                parent.run_id,
                LOCATION_NAME,
            )
        # The deleted collection cannot be deleted twice: that run fails with the reason.
        assert [run.status for run in new_runs] == [SUCCESS, SUCCESS, dg.DagsterRunStatus.FAILURE]
        assert f"Collection '{DELETED_COLLECTION}' does not exist" in step_failures(
            instance, new_runs[-1].run_id
        )
    assert not verify_index(db.engine).has_drift


def _leave_stale_signs_of_make_dev(home) -> None:
    """A pid file of a process that has exited and a daemon heartbeat ten minutes old."""
    (home / DEV_PID_FILE).write_text(f"{exited_pid()}\n")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time() - 600, "SENSOR", "gone", None))


@pytest.mark.slow
def test_the_demo_runs_every_workflow_and_a_second_demo_starts_over(
    empty_db, tmp_path, monkeypatch
):
    """On SQLite the second demo starts over (its own file, its own instance history), stale
    signs of an earlier `make dev` notwithstanding; a server database it already filled is
    refused, and left as it is."""
    home = tmp_path / ".dagster_home"
    _assert_demo_outcome(empty_db, home, *_demo(empty_db, home))
    first_runs = sum(len(runs) for runs in _runs_by_job(home).values())
    _assert_make_dev_sees_the_demo(empty_db, home, monkeypatch)

    if empty_db.dialect == "sqlite":
        _leave_stale_signs_of_make_dev(home)
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
