"""The projection GC pass (EmDash's `cleanupMediaUsage`) and the fence it raises, on both
dialects. The safety window is passed by backdating rows, never by sleeping."""

from __future__ import annotations

import pytest
from sqlalchemy import insert, select, update
from ulid import ULID

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.projection_gc import passes as projection_gc
from media_usage_orchestration.processing.projection_gc.passes import (
    CLEANUP_FAILED,
    GcLimits,
    GcOutcome,
    run_projection_gc,
)
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.projection_gc.repository import ProjectionGcRepository
from tests.support.projection_gc import (
    HOUR,
    age_occurrences,
    drain,
    edit_storm,
    gc_until_quiet,
    make_gc_due,
    non_current_occurrences,
    one_task,
)
from tests.support.states import backdate, count, db_now, one

SMALL = GcLimits(candidate_limit=10, delete_limit=5)


def _occurrence(source_key: str, generation: str, index: int = 0) -> dict:
    return {
        "id": str(ULID()),
        "source_key": source_key,
        "generation": generation,
        "field_slug": "hero",
        "field_path": "hero",
        "occurrence_index": index,
        "reference_type": "image_field",
        "media_id": f"m-{generation[-4:]}-{index}",
        "provider": "local",
        "provider_asset_id": f"m-{generation[-4:]}-{index}",
    }


def _insert(engine, table, rows) -> None:
    with engine.begin() as connection:
        connection.execute(insert(table), rows)


def _source_key(engine, content_id: str) -> str:
    with engine.connect() as connection:
        return connection.execute(
            select(schema.sources.c.source_key).where(schema.sources.c.content_id == content_id)
        ).scalar_one()


def _totals(results) -> dict[str, int]:
    names = ("deleted_orphans", "deleted_stale", "deleted_abandoned", "deleted_write_leases")
    return {name: sum(getattr(r.counters, name) for r in results) for name in names}


@pytest.mark.parametrize("limits", [GcLimits(), SMALL], ids=["emdash-limits", "small-windows"])
def test_edit_storm_then_gc_keeps_exactly_the_current_generations(activated, limits):
    engine = activated.engine
    ids = edit_storm(engine, "posts", entries=6, rounds=4)
    assert non_current_occurrences(engine) == 24  # 6 entries x 4 superseded heroes
    age_occurrences(engine)
    # one source was indexed before its leftovers were written: they are abandoned, not stale
    abandoned_key = _source_key(engine, ids[0])
    backdate(engine, schema.sources, "indexed_at", 3 * HOUR, source_key=abandoned_key)
    orphan_generation = str(ULID())
    _insert(
        engine, schema.occurrences, [_occurrence("gone", orphan_generation, i) for i in range(3)]
    )
    backdate(engine, schema.occurrences, "created_at", 2 * HOUR, source_key="gone")
    _insert(
        engine,
        schema.generation_writes,
        [
            {
                "source_key": "gone",
                "generation": "g-x",
                "lease_token": str(ULID()),
                "expires_at": db_now(engine, -1),
                "created_at": db_now(engine, -HOUR),
            }
        ],
    )
    current_before = count(engine, schema.occurrences) - 27

    results = gc_until_quiet(engine, limits)

    assert non_current_occurrences(engine) == 0
    assert count(engine, schema.occurrences) == current_before == 6
    assert count(engine, schema.generation_writes) == 0
    assert _totals(results) == {
        "deleted_orphans": 3,
        "deleted_stale": 20,
        "deleted_abandoned": 4,
        "deleted_write_leases": 1,
    }
    report = verify_index(engine)
    assert not report.has_drift and report.abandoned_occurrence_count == 0
    task, last = one_task(engine), results[-1].counters
    assert task["lease_token"] is None and task["last_error_code"] is None
    assert (task["cursor_id"], task["scan_before_at"], task["consecutive_failures"]) == (
        None,
        None,
        0,
    )
    assert task["last_candidate_count"] == last.candidate_count == 6
    assert (task["last_deleted_stale"], task["last_backlog_lower_bound"]) == (0, 0)
    assert task["last_scan_has_more"] == 0
    if limits is SMALL:
        assert len(results) > 3  # the sweep took several windows
        assert max(r.deleted_rows for r in results) <= 5
        assert any(r.counters.scan_has_more for r in results)
    # the floor is the greatest generation the GC deleted
    floor = one(engine, schema.cleanup_fence, task_key="projection_gc")
    assert floor is not None and floor["generation_floor"] >= orphan_generation


def test_rows_younger_than_the_safety_window_are_kept(activated):
    engine = activated.engine
    edit_storm(engine, "posts", entries=2, rounds=2)
    make_gc_due(engine)
    result = run_projection_gc(engine)
    assert result.outcome is GcOutcome.COMPLETED
    assert (result.deleted_rows, result.counters.candidate_count) == (0, 0)
    assert non_current_occurrences(engine) == 4


def test_a_live_write_lease_protects_its_generation_until_it_expires(activated):
    engine = activated.engine
    generation = str(ULID())
    _insert(engine, schema.occurrences, [_occurrence("in-flight", generation)])
    backdate(engine, schema.occurrences, "created_at", 2 * HOUR)
    token = str(ULID())
    _insert(
        engine,
        schema.generation_writes,
        [
            {
                "source_key": "in-flight",
                "generation": generation,
                "lease_token": token,
                "expires_at": db_now(engine, HOUR),
                "created_at": db_now(engine, -2 * HOUR),
            }
        ],
    )
    results = gc_until_quiet(engine)
    assert count(engine, schema.occurrences) == 1
    assert results[0].counters.backlog_lower_bound == 0  # a leased row is not a target
    assert one(engine, schema.cleanup_fence, task_key="projection_gc") is None

    backdate(engine, schema.generation_writes, "expires_at", 1, lease_token=token)
    results = gc_until_quiet(engine)
    assert count(engine, schema.occurrences) == 0
    assert _totals(results)["deleted_orphans"] == 1
    assert _totals(results)["deleted_write_leases"] == 1
    fence = one(engine, schema.cleanup_fence, task_key="projection_gc")
    assert fence["generation_floor"] == generation


def _raw_source(key: str, generation: str) -> dict:
    return {
        "source_key": key,
        "source_type": "content",
        "source_variant": "columns",
        "current_generation": generation,
    }


def _current_generation(engine, key: str) -> str | None:
    row = one(engine, schema.sources, source_key=key)
    return None if row is None else row["current_generation"]


def test_the_fence_drops_a_late_publish_at_or_below_the_floor(activated):
    engine = activated.engine
    reaped = str(ULID())
    _insert(engine, schema.occurrences, [_occurrence("late", reaped)])
    backdate(engine, schema.occurrences, "created_at", 2 * HOUR)
    gc_until_quiet(engine)
    assert one(engine, schema.cleanup_fence, task_key="projection_gc")["generation_floor"] == reaped

    # a publication of the reaped generation without a live write lease is ignored
    _insert(engine, schema.sources, [_raw_source("late", reaped)])
    assert _current_generation(engine, "late") is None
    # with a live lease on (source, generation) the same write lands
    _insert(
        engine,
        schema.generation_writes,
        [
            {
                "source_key": "late",
                "generation": reaped,
                "lease_token": str(ULID()),
                "expires_at": db_now(engine, HOUR),
                "created_at": db_now(engine),
            }
        ],
    )
    _insert(engine, schema.sources, [_raw_source("late", reaped)])
    assert _current_generation(engine, "late") == reaped

    older, newer = "0" * 26, str(ULID())
    with engine.begin() as connection:
        table = schema.sources
        connection.execute(
            update(table).where(table.c.source_key == "late").values(current_generation=older)
        )
    assert _current_generation(engine, "late") == reaped  # below the floor: ignored
    with engine.begin() as connection:
        connection.execute(
            update(table).where(table.c.source_key == "late").values(current_generation=newer)
        )
    assert _current_generation(engine, "late") == newer


def test_a_pass_is_single_flight_and_waits_for_its_interval(activated):
    engine = activated.engine
    repo = ProjectionGcRepository(engine)
    make_gc_due(engine)
    claim = repo.claim("held", lease_seconds=300, interval_seconds=60, safety_window_seconds=HOUR)
    assert claim is not None and claim.cursor is None
    make_gc_due(engine)
    assert run_projection_gc(engine).outcome is GcOutcome.SKIPPED  # leased by another pass
    backdate(engine, schema.cleanup, "lease_expires_at", 1)
    assert run_projection_gc(engine).outcome is GcOutcome.COMPLETED  # the lapsed lease is taken
    assert not repo.complete("held", projection_gc.GcCounters(), None, True)  # lost its lease
    assert run_projection_gc(engine).outcome is GcOutcome.SKIPPED  # not due for 60 s
    task = one_task(engine)
    assert task["next_eligible_at"] > db_now(engine, 30)


def test_a_failed_pass_records_its_error_code_and_backs_off(activated, monkeypatch):
    engine = activated.engine

    def broken(*_args, **_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(ProjectionGcRepository, "find_candidates", broken)
    for failures, delay in ((1, 60), (2, 120)):
        make_gc_due(engine)
        assert run_projection_gc(engine).outcome is GcOutcome.FAILED
        task = one_task(engine)
        assert (task["last_error_code"], task["consecutive_failures"]) == (CLEANUP_FAILED, failures)
        assert task["lease_token"] is None and task["lease_expires_at"] is None
        assert db_now(engine, delay - 30) < task["next_eligible_at"] <= db_now(engine, delay)
    monkeypatch.undo()
    make_gc_due(engine)
    assert run_projection_gc(engine).outcome is GcOutcome.COMPLETED
    task = one_task(engine)
    assert (task["last_error_code"], task["consecutive_failures"]) == (None, 0)


def test_a_spent_time_budget_issues_no_further_statement(activated):
    engine = activated.engine
    _insert(engine, schema.occurrences, [_occurrence("gone", str(ULID()), i) for i in range(2)])
    backdate(engine, schema.occurrences, "created_at", 2 * HOUR)
    ticks = iter([0.0] + [10.0] * 20)
    make_gc_due(engine)
    result = run_projection_gc(engine, clock=lambda: next(ticks))
    assert result.outcome is GcOutcome.COMPLETED
    assert (result.deleted_rows, result.counters.candidate_count) == (0, 0)
    assert count(engine, schema.occurrences) == 2
    task = one_task(engine)
    assert task["scan_before_at"] is not None and task["cursor_id"] is None  # sweep not finished
    assert task["last_duration_ms"] == 10_000


def test_source_deletes_by_the_projection_do_not_raise_the_floor(activated):
    engine = activated.engine
    edit_storm(engine, "posts", entries=2, rounds=1)
    CmsWriter(engine).delete_entry("posts", "posts-000")
    drain(engine)
    assert one(engine, schema.cleanup_fence, task_key="projection_gc") is None
    age_occurrences(engine)
    gc_until_quiet(engine)
    assert non_current_occurrences(engine) == 0
    assert not verify_index(engine).has_drift


def test_claim_validates_its_durations(db):
    repo = ProjectionGcRepository(db.engine)
    with pytest.raises(ValueError):
        repo.claim("t", lease_seconds=-1, interval_seconds=60, safety_window_seconds=HOUR)
    assert one_task(db.engine)["lease_token"] is None


def test_timestamps_come_from_the_database(activated):
    engine = activated.engine
    make_gc_due(engine)
    before = db_now(engine)
    run_projection_gc(engine)
    task = one_task(engine)
    after = db_now(engine)
    assert before <= task["last_started_at"] <= task["last_completed_at"] <= after
    assert task["last_started_at"].endswith("Z")
