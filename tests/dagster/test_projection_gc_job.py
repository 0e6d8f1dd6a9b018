"""The projection GC in Dagster: the sensor asks for a run only when the task row is due and a
pass has something to do; each run's counters are in its metadata and on the asset
`media_usage_projection_cleanup`, so the backlog is seen shrinking; the media library summary
is recorded on `media_usage_media_library`."""

import dagster as dg

from media_usage_orchestration.assets.media_library import MEDIA_USAGE_MEDIA_LIBRARY
from media_usage_orchestration.assets.projection_cleanup import MEDIA_USAGE_PROJECTION_CLEANUP
from media_usage_orchestration.jobs import media_usage_projection_gc
from media_usage_orchestration.sensors.projection_gc import media_usage_projection_gc_sensor
from media_usage_orchestration.store.core import schema
from tests.support.media_library import add_media, create_media_table
from tests.support.projection_gc import (
    HOUR,
    edit_storm,
    make_gc_due,
    non_current_occurrences,
    one_task,
    orphans,
)
from tests.support.sensor_loop import evaluate, execute_request, output_metadata, plain, resources
from tests.support.states import backdate, count, set_status


def _materializations(instance, key) -> list[dict]:
    records = instance.fetch_materializations(key, limit=100, ascending=True)
    return [plain(record.asset_materialization.metadata) for record in records.records]


def test_the_sensor_skips_without_candidates_and_while_not_due(activated):
    with dg.DagsterInstance.ephemeral() as instance:
        data = evaluate(media_usage_projection_gc_sensor, instance, resources(activated))
        assert data.skip_message == "no projection GC candidates"
        assert not data.run_requests
        orphans(activated.engine, 3)
        backdate(activated.engine, schema.cleanup, "next_eligible_at", -60)  # due in a minute
        data = evaluate(media_usage_projection_gc_sensor, instance, resources(activated))
        assert data.skip_message == "the projection GC is not due (or a pass holds its lease)"


def test_one_run_reaps_the_backlog_pass_after_pass_and_records_its_totals(activated):
    engine = activated.engine
    edit_storm(engine, "posts", entries=2, rounds=1)
    backdate(engine, schema.occurrences, "created_at", 2 * HOUR)
    orphans(engine, 110)
    with dg.DagsterInstance.ephemeral() as instance:
        make_gc_due(engine)
        data = evaluate(media_usage_projection_gc_sensor, instance, resources(activated))
        [request] = data.run_requests
        assert request.run_key.startswith("gc:projection_gc:")
        result = execute_request(
            media_usage_projection_gc_sensor, request, instance, resources(activated)
        )
        assert result.success
        metadata = output_metadata(result, "collect_projection_garbage")
        # the pass that was not full ended the run; the row is due 60 s after its claim
        data = evaluate(media_usage_projection_gc_sensor, instance, resources(activated))
        assert data.skip_message == "the projection GC is not due (or a pass holds its lease)"
        make_gc_due(engine)
        data = evaluate(media_usage_projection_gc_sensor, instance, resources(activated))
        assert data.skip_message == "no projection GC candidates"
        [recorded] = _materializations(instance, MEDIA_USAGE_PROJECTION_CLEANUP)
        assert _materializations(instance, MEDIA_USAGE_MEDIA_LIBRARY) == []  # no media table
        [run] = instance.get_runs()
        assert run.tags["media_usage/outcome"] == "completed"

    # 110 orphans and 2 superseded heroes, at most 50 a pass: 50, 50, then 12 ends the run
    assert recorded == metadata
    assert {k: metadata[k] for k in ("outcome", "passes", "stopped_by", "deleted_rows")} == {
        "outcome": "completed",
        "passes": 3,
        "stopped_by": "not_full",
        "deleted_rows": 112,
    }
    assert metadata["deleted_orphans"] + metadata["deleted_stale"] == 112
    assert (metadata["backlog_lower_bound"], metadata["scan_has_more"]) == (12, False)
    assert non_current_occurrences(engine) == 0
    task = one_task(engine)
    assert task["last_deleted_orphans"] + task["last_deleted_stale"] == 12  # the last pass's


def test_a_run_stops_at_its_time_budget_and_leaves_the_row_due(activated):
    engine = activated.engine
    orphans(engine, 120)
    make_gc_due(engine)
    with dg.DagsterInstance.ephemeral() as instance:
        result = media_usage_projection_gc.execute_in_process(
            instance=instance,
            resources={"database": resources(activated)["database"]},
            run_config={"ops": {"collect_projection_garbage": {"config": {"max_seconds": 1e-6}}}},
        )
        assert result.success
        metadata = output_metadata(result, "collect_projection_garbage")
        assert (metadata["passes"], metadata["stopped_by"]) == (1, "time_budget")
        assert metadata["deleted_rows"] == 50
        # due at once: the sensor asks for the next run without waiting for EmDash's minute
        data = evaluate(media_usage_projection_gc_sensor, instance, resources(activated))
        assert len(data.run_requests) == 1
    assert count(engine, schema.occurrences) == 70


def test_a_failed_pass_fails_the_run_with_the_error_code(activated, monkeypatch):
    from media_usage_orchestration.store.projection_gc.repository import ProjectionGcRepository

    def broken(*_args, **_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(ProjectionGcRepository, "find_candidates", broken)
    make_gc_due(activated.engine)
    with dg.DagsterInstance.ephemeral() as instance:
        result = media_usage_projection_gc.execute_in_process(
            instance=instance,
            resources={"database": resources(activated)["database"]},
            raise_on_error=False,
        )
    assert not result.success
    failure = result.failure_data_for_node("collect_projection_garbage")
    assert failure.user_failure_data.metadata["error_code"].value == "MEDIA_USAGE_CLEANUP_FAILED"
    assert one_task(activated.engine)["last_error_code"] == "MEDIA_USAGE_CLEANUP_FAILED"


def test_the_media_library_summary_is_recorded_only_under_complete_coverage(activated):
    engine = activated.engine
    edit_storm(engine, "posts", entries=2, rounds=0)  # heroes posts-000-0, posts-001-0
    create_media_table(engine)
    add_media(engine, ("posts-000-0", 100), ("posts-001-0", 200), ("spare", 300), ("nosize", None))
    with dg.DagsterInstance.ephemeral() as instance:
        run = lambda: media_usage_projection_gc.execute_in_process(  # noqa: E731
            instance=instance, resources={"database": resources(activated)["database"]}
        )
        assert run().success
        [summary] = _materializations(instance, MEDIA_USAGE_MEDIA_LIBRARY)
        assert {k: summary[k] for k in ("media", "used", "unused", "reclaimable_bytes")} == {
            "media": 4,
            "used": 2,
            "unused": 2,
            "reclaimable_bytes": 300,
        }
        set_status(engine, "posts", status="partial")
        assert run().success
        assert len(_materializations(instance, MEDIA_USAGE_MEDIA_LIBRARY)) == 1
        records = instance.fetch_observations(MEDIA_USAGE_MEDIA_LIBRARY, limit=10)
        [observed] = [plain(r.asset_observation.metadata) for r in records.records]
        assert observed["incomplete"] == "posts" and "unused" not in observed
    assert count(engine, schema.occurrences) == 2


def test_a_summary_past_its_time_limit_is_observed_as_not_counted_and_the_run_succeeds(
    activated, monkeypatch
):
    """The summary is one bounded read: cancelled at its limit it holds nothing up, the GC
    run succeeds and the asset says why the library was not counted."""
    from media_usage_orchestration.store.core.engine import StatementTimedOut
    from media_usage_orchestration.store.sources.usage import UsageRepository

    def too_slow(*_args, **_kwargs):
        raise StatementTimedOut("a read took longer than 60 s and was cancelled")

    engine = activated.engine
    create_media_table(engine)
    monkeypatch.setattr(UsageRepository, "media_summary", too_slow)
    with dg.DagsterInstance.ephemeral() as instance:
        result = media_usage_projection_gc.execute_in_process(
            instance=instance, resources={"database": resources(activated)["database"]}
        )
        assert result.success
        assert _materializations(instance, MEDIA_USAGE_MEDIA_LIBRARY) == []
        [record] = instance.fetch_observations(MEDIA_USAGE_MEDIA_LIBRARY, limit=10).records
        observed = plain(record.asset_observation.metadata)
        assert observed == {"not_counted": "a read took longer than 60 s and was cancelled"}
