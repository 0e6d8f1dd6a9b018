"""The queue sensor: each live collection's queue asset observed and its check `queue_healthy`
evaluated by the tick itself (no run), again at once when its state changes and every 5
minutes while its numbers move or work is due; the failed items' table carries the Launchpad
config that retries each; the code location declares a queue asset and its check per collection."""

from __future__ import annotations

import json
import re
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.code_pointer import CodePointer
from dagster._core.definitions.definitions_load_context import DefinitionsLoadContext
from dagster._core.definitions.reconstruct import initialize_repository_def_from_pointer

from media_usage_orchestration import jobs
from media_usage_orchestration.assets.coverage_history import coverage_history_specs
from media_usage_orchestration.assets.health import RUN_START_GRACE_SECONDS
from media_usage_orchestration.assets.queue import (
    COMPLETED_METADATA,
    QUEUE_CHECK,
    QUEUE_GROUP,
    _code,
    queue_key,
    retry_run_config,
    with_queue_assets,
)
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.sensors.queue import (
    OBSERVE_AT_LEAST_EVERY_SECONDS,
    media_usage_queue_sensor,
)
from media_usage_orchestration.sensors.work import media_usage_work_sensor
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV
from media_usage_orchestration.store.reads.queue import COUNT_LIMIT
from tests.support.factories import ago, expired, failed, insert_works, leased, of
from tests.support.projection import active_collection, insert_entry
from tests.support.sensor_loop import evaluate, execute_request, plain, resources
from tests.support.states import db_now, make_collection
from tests.support.work import read_work

CODE = "MEDIA_USAGE_PROCESSING_FAILED"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
LOCATION = CodePointer.from_module(
    "media_usage_orchestration.definitions", "media_usage_definitions", str(PROJECT_ROOT)
)


def tick(db, instance: dg.DagsterInstance, cursor: str | None = None):
    """One evaluation; its events are stored as the sensor daemon stores them (runless)."""
    with dg.build_sensor_context(
        instance=instance, resources=resources(db), definitions=defs, cursor=cursor
    ) as context:
        data = media_usage_queue_sensor.evaluate_tick(context)
    for event in data.asset_events:
        instance.report_runless_asset_event(event)
    return data


def observations(data, group: str = QUEUE_GROUP) -> dict[str, dict]:
    """The tick's observations of one kind of asset (the queues unless told), by slug."""
    return {
        event.asset_key.path[1]: plain(event.metadata)
        for event in data.asset_events
        if isinstance(event, dg.AssetObservation) and event.asset_key.path[0] == group
    }


def evaluations(data, check: str = QUEUE_CHECK) -> dict[str, dg.AssetCheckEvaluation]:
    """The tick's evaluations of one check (queue_healthy unless told), by slug."""
    return {
        event.asset_key.path[1]: event
        for event in data.asset_events
        if isinstance(event, dg.AssetCheckEvaluation) and event.check_name == check
    }


def table_rows(markdown: str) -> list[list[str]]:
    """The body rows of a Markdown table, each cell as shown: a code span's text, its escaped
    pipes unescaped."""
    rows = [line for line in markdown.splitlines() if line.startswith("|")][2:]
    return [[_shown(cell) for cell in re.split(r"(?<!\\)\|", row.strip())[1:-1]] for row in rows]


def _shown(cell: str) -> str:
    cell = cell.strip().replace("\\|", "|")
    fence = re.match(r"`+", cell)
    if fence is None:
        return cell
    inner = cell[len(fence.group()) : -len(fence.group())]
    if inner.startswith(" ") and inner.endswith(" ") and inner.strip():
        inner = inner[1:-1]
    return inner


@pytest.fixture
def alpha(db):
    collection = make_collection(db.engine, "alpha")
    make_collection(db.engine, "beta")
    insert_works(
        db.engine,
        [
            # Younger than the grace after which due work needs a live run.
            {"content_id": "due-1", "next_attempt_at": ago(5), "updated_at": ago(5)},
            {"content_id": "due-2", "next_attempt_at": ago(2), "updated_at": ago(2)},
            {"content_id": "held", **leased()},
            {"content_id": "broken", **failed(CODE, attempts=5), "last_attempted_at": ago(40)},
        ],
        **of(collection),
    )
    return collection


def test_a_tick_observes_every_live_queue_and_evaluates_its_check_without_a_run(
    db, instance, alpha
):
    data = tick(db, instance)

    assert data.run_requests == []
    assert "observed 2 of 2 collection(s)" in data.skip_message
    observed = observations(data)
    assert sorted(observed) == ["alpha", "beta"]
    numbers = observed["alpha"]
    assert {
        name: numbers[name] for name in ("due", "backing_off", "leased", "stuck", "failed")
    } == {
        "due": 2,
        "backing_off": 0,
        "leased": 1,
        "stuck": 0,
        "failed": 1,
    }
    assert 5 <= numbers["lag_seconds"] < RUN_START_GRACE_SECONDS  # database time, backdated
    assert (numbers[COMPLETED_METADATA], numbers["inexact_counts"]) == (0, "-")
    assert numbers["collection_id"] == alpha.id
    assert "re-queues its work by itself" in numbers["failed_items"]
    [row] = table_rows(numbers["failed_items"])
    assert row[:3] == ["broken", CODE, "5"]
    assert row[3].endswith("Z")
    assert row[4] == retry_run_config("alpha", "broken")
    event = next(e for e in data.asset_events if e.asset_key == queue_key("alpha"))
    kinds = {name: type(value).__name__ for name, value in event.metadata.items()}
    assert kinds["due"] == kinds[COMPLETED_METADATA] == "IntMetadataValue"
    assert kinds["lag_seconds"] == "FloatMetadataValue"
    assert kinds["failed_items"] == "MarkdownMetadataValue"
    assert observed["beta"]["failed_items"] == "No failed work."

    checks = evaluations(data)
    assert (checks["alpha"].passed, checks["alpha"].severity) == (
        False,
        dg.AssetCheckSeverity.ERROR,
    )
    assert "1 failed work item(s)" in checks["alpha"].description
    assert checks["beta"].passed
    # Stored without a run, as the daemon stores them.
    stored = instance.fetch_observations(queue_key("alpha"), limit=5).records
    assert [record.run_id for record in stored] == [""]
    check_key = dg.AssetCheckKey(queue_key("alpha"), QUEUE_CHECK)
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key([check_key])
    assert latest[check_key].evaluation.passed is False


def test_unchanged_numbers_are_not_observed_again_and_the_tick_skips(db, instance, alpha):
    first = tick(db, instance)

    second = tick(db, instance, first.cursor)

    assert second.asset_events == []
    assert "in the state last observed" in second.skip_message
    assert second.cursor == first.cursor
    assert len(instance.fetch_observations(queue_key("alpha"), limit=5).records) == 1


def test_a_change_is_observed_for_its_collection_alone(db, instance, alpha):
    first = tick(db, instance)
    insert_works(db.engine, [{"content_id": "stuck", **expired(seconds_ago=5)}], **of(alpha))

    second = tick(db, instance, first.cursor)

    assert sorted(observations(second)) == ["alpha"]
    assert (observations(second)["alpha"]["due"], observations(second)["alpha"]["stuck"]) == (3, 1)
    assert "1 stuck work item(s)" in evaluations(second)["alpha"].description
    assert second.cursor != first.cursor


def test_a_queue_with_due_work_is_observed_again_once_its_last_observation_is_old(
    db, instance, alpha
):
    """alpha has due work (its lag grows by itself); beta is idle and unchanged: only alpha is
    observed again, both observations backdated past the interval (database time)."""
    first = tick(db, instance)
    stored = json.loads(first.cursor)
    for slug in ("alpha", "beta"):
        stored[slug][1] = db_now(db.engine, -OBSERVE_AT_LEAST_EVERY_SECONDS - 1)

    second = tick(db, instance, json.dumps(stored))

    assert sorted(observations(second)) == ["alpha"]
    assert json.loads(second.cursor)["alpha"][0] == stored["alpha"][0]  # same numbers
    assert json.loads(second.cursor)["beta"] == stored["beta"]


def test_moving_numbers_wait_for_the_interval_and_a_state_change_does_not(db, instance, alpha):
    """Steady edits move the counts at every tick: observed every 5 minutes, not at every
    tick; a failure that appears is observed at once."""
    first = tick(db, instance)
    insert_works(db.engine, [{"content_id": "another", "next_attempt_at": ago(1)}], **of(alpha))

    second = tick(db, instance, first.cursor)
    assert observations(second) == {}
    assert json.loads(second.cursor)["alpha"] == json.loads(first.cursor)["alpha"]

    stored = json.loads(second.cursor)
    stored["alpha"][1] = db_now(db.engine, -OBSERVE_AT_LEAST_EVERY_SECONDS - 1)
    third = tick(db, instance, json.dumps(stored))
    assert observations(third)["alpha"]["due"] == 3

    insert_works(db.engine, [{"content_id": "new-failure", **failed(CODE)}], **of(alpha))
    fourth = tick(db, instance, third.cursor)
    assert observations(fourth)["alpha"]["failed"] == 2


def test_a_cursor_the_sensor_did_not_write_observes_everything(db, instance, alpha):
    data = tick(db, instance, "not json")

    assert sorted(observations(data)) == ["alpha", "beta"]


def test_the_retry_config_in_the_table_reopens_the_item_and_the_check_passes(db, instance, alpha):
    first = tick(db, instance)
    [row] = table_rows(observations(first)["alpha"]["failed_items"])
    run_config = yaml.safe_load(row[4])

    result = jobs.retry_media_usage_work_job.execute_in_process(
        run_config=run_config, instance=instance, resources=resources(db)
    )

    assert result.success
    assert read_work(db.engine, alpha.id, "broken")["state"] == "pending"
    second = tick(db, instance, first.cursor)
    assert observations(second)["alpha"]["failed"] == 0
    assert observations(second)["alpha"]["due"] == 3
    assert evaluations(second)["alpha"].passed


@pytest.mark.parametrize(
    "content_id",
    ['quote " and \\ backslash', "pipe | and `tick`", "line\nbreak\ttab", "ünï ✓ 😀", "null"],
)
def test_the_retry_config_names_any_content_id_exactly(content_id):
    config = retry_run_config("yes", content_id)
    markdown_cell = table_rows(f"| a |\n| --- |\n| {_code(config)} |")[0][0]

    assert yaml.safe_load(markdown_cell) == {
        "ops": {"reopen_failed_work": {"config": {"collection": "yes", "content_id": content_id}}}
    }
    dg.validate_run_config(jobs.retry_media_usage_work_job, yaml.safe_load(markdown_cell))


def test_items_completed_by_the_collections_work_runs_are_counted(db, instance):
    active_collection(db.engine, "alpha")
    for index in range(3):
        insert_entry(db.engine, "alpha", f"entry-{index}")
    [request] = evaluate(media_usage_work_sensor, instance, resources(db)).run_requests
    execute_request(media_usage_work_sensor, request, instance, resources(db))

    numbers = observations(tick(db, instance))["alpha"]

    assert (numbers[COMPLETED_METADATA], numbers["due"]) == (3, 0)


def test_a_count_at_its_limit_is_named_inexact(db, instance):
    collection = make_collection(db.engine, "alpha")
    rows = [{"content_id": f"entry-{index:05d}"} for index in range(COUNT_LIMIT + 1)]
    insert_works(db.engine, rows, **of(collection))

    numbers = observations(tick(db, instance))["alpha"]

    assert (numbers["due"], numbers["inexact_counts"]) == (COUNT_LIMIT + 1, "due")


def test_a_deletion_request_wipes_the_collections_queue_asset(db, instance, alpha):
    tick(db, instance)
    assert queue_key("alpha") in instance.all_asset_keys()

    result = jobs.request_collection_deletion.execute_in_process(
        run_config={
            "ops": {"request_deletion": {"config": {"collection": "alpha", "force": True}}}
        },
        instance=instance,
        resources=resources(db),
    )

    assert result.success
    assert queue_key("alpha") not in instance.all_asset_keys()
    assert queue_key("beta") in instance.all_asset_keys()
    assert sorted(observations(tick(db, instance))) == ["beta"]


def test_a_database_without_the_schema_gets_the_setup_step(empty_db, instance):
    data = tick(empty_db, instance)

    assert data.asset_events == []
    assert "lacks the media usage schema" in data.skip_message


def test_no_live_collection_is_a_skip(db, instance):
    data = tick(db, instance)

    assert (data.asset_events, data.skip_message) == ([], "no live collection, no queue to observe")


def test_observing_the_queues_and_executing_the_check_read_the_database_now(db, instance, alpha):
    definitions = with_queue_assets(
        dg.Definitions(assets=coverage_history_specs(["alpha", "beta"]), resources=resources(db))
    )
    job = definitions.resolve_implicit_global_asset_job_def()

    result = job.execute_in_process(instance=instance)

    verdicts = {
        evaluation.asset_key.path[1]: evaluation.passed
        for evaluation in result.get_asset_check_evaluations()
    }
    assert verdicts == {"alpha": False, "beta": True}
    observed = {
        event.asset_key.path[1]: plain(event.event_specific_data.asset_observation.metadata)
        for event in result.all_events
        if event.event_type_value == "ASSET_OBSERVATION"
    }
    assert (observed["alpha"]["due"], observed["alpha"]["failed"]) == (2, 1)
    tags = instance.get_run_by_id(result.run_id).tags
    assert tags["media_usage/workflow"] == "check"


@pytest.fixture
def _restore_load_context():
    previous = DefinitionsLoadContext._instance
    yield
    DefinitionsLoadContext._instance = previous


def test_the_location_declares_a_queue_asset_and_its_check_per_collection(
    db, monkeypatch, _restore_load_context
):
    make_collection(db.engine, "alpha")
    make_collection(db.engine, "beta")
    monkeypatch.setenv(DATABASE_URL_ENV, db.url)

    repository = initialize_repository_def_from_pointer(LOCATION)

    graph = repository.asset_graph
    queues = {key for key in graph.get_all_asset_keys() if key.path[0] == QUEUE_GROUP}
    assert queues == {queue_key("alpha"), queue_key("beta")}
    assert {(key.asset_key, key.name) for key in graph.asset_check_keys} >= {
        (queue_key("alpha"), QUEUE_CHECK),
        (queue_key("beta"), QUEUE_CHECK),
    }
    alpha = graph.get(queue_key("alpha"))
    # An observable source: the UI shows when it was last observed, and "Observe" reads it.
    assert (alpha.group_name, alpha.partitions_def, alpha.is_observable) == (
        QUEUE_GROUP,
        None,
        True,
    )
    # Every job of `defs` still loads unchanged.
    assert {job.name for job in repository.get_all_jobs()} >= {
        job.name for job in defs.resolve_all_job_defs()
    }
