"""Long ops log their progress: done (of a total when known) and the rate, throttled to at
most one line per interval, plus a final line with the total once a line was written; an op
over within the interval writes no line."""

from __future__ import annotations

import dagster as dg

from media_usage_orchestration import jobs
from media_usage_orchestration.dagster_kit import progress as progress_module
from media_usage_orchestration.dagster_kit.progress import ProgressLog
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from tests.support.projection_gc import make_gc_due, orphans
from tests.support.reconciliation_steps import captured_collection, image_entry
from tests.support.sensor_loop import resources
from tests.unit.processing.test_run_loop import Clock as FakeClock


def test_lines_are_throttled_and_the_last_reports_the_total():
    clock, lines = FakeClock(), []
    progress = ProgressLog(lines.append, "scan", "items", total=500, interval=1.0, clock=clock)
    for _ in range(100):  # 100 batches of 5 items over 10 s: one every 0.1 s
        clock.now += 0.1
        progress.add(5)
    progress.finish()

    assert 9 <= len(lines) - 1 <= 10  # about one a second
    assert lines[-1] == "scan: finished, 500 of at most 500 items in 10.0 s (50.0 items/s)"


def test_an_interval_of_zero_logs_every_batch_and_a_large_one_no_line():
    clock, every, final_only = FakeClock(), [], []
    eager = ProgressLog(every.append, "w", "rows", interval=0, clock=clock)
    lazy = ProgressLog(final_only.append, "w", "rows", interval=3600, clock=clock)
    for _ in range(7):
        clock.now += 0.5
        eager.add(2)
        lazy.add(2)
    eager.finish()
    lazy.finish()

    assert len(every) == 8
    assert every[0] == "w: 2 rows in 0.5 s (4.0 rows/s)"
    assert every[-1] == "w: finished, 14 rows in 3.5 s (4.0 rows/s)"
    assert final_only == []


def test_counting_adds_what_each_result_is_worth():
    lines = []
    progress = ProgressLog(lines.append, "drain", "items", interval=3600, clock=FakeClock())
    count = progress.counting(len)
    count([1, 2, 3])
    count([])
    assert progress.done == 3


def _work_log_lines(db, instance, *, entries: int, batch_size: int) -> list[str]:
    captured_collection(db.engine, "articles", [])
    CmsWriter(db.engine).insert_entries(
        "articles", [image_entry(f"entry-{n}") for n in range(entries)]
    )
    run_config = {"ops": {"drain_due_work": {"config": {"batch_size": batch_size}}}}
    result = jobs.media_usage_work.execute_in_process(
        run_config=run_config, instance=instance, resources=resources(db)
    )
    assert result.success
    return [
        entry.user_message
        for entry in instance.all_logs(result.run_id)
        if entry.user_message.startswith("work: ") and "items" in entry.user_message
    ]


def test_the_work_op_logs_bounded_progress_and_the_total(db, monkeypatch):
    monkeypatch.setattr(progress_module, "WORK_PROGRESS_INTERVAL_SECONDS", 0)
    with dg.DagsterInstance.ephemeral() as instance:
        lines = _work_log_lines(db, instance, entries=6, batch_size=2)

    # one line per batch (three of two items, then the empty one) and the final
    assert len(lines) == 4 + 1, lines
    assert lines[-1].startswith("work: finished, 6 of at most 5000 items in ")


def test_a_work_op_over_within_the_interval_logs_no_progress_line(db, monkeypatch):
    # The work op keeps its own, longer interval: a line a second would be one per batch.
    monkeypatch.setattr(progress_module, "PROGRESS_INTERVAL_SECONDS", 0)
    monkeypatch.setattr(progress_module, "WORK_PROGRESS_INTERVAL_SECONDS", 3600)
    with dg.DagsterInstance.ephemeral() as instance:
        lines = _work_log_lines(db, instance, entries=6, batch_size=2)

    assert lines == []


def test_the_projection_gc_op_logs_each_pass_with_its_counters(activated, monkeypatch):
    monkeypatch.setattr(progress_module, "PROGRESS_INTERVAL_SECONDS", 0)
    orphans(activated.engine, 120)
    make_gc_due(activated.engine)
    with dg.DagsterInstance.ephemeral() as instance:
        result = jobs.media_usage_projection_gc.execute_in_process(
            instance=instance, resources={"database": resources(activated)["database"]}
        )
        assert result.success
        lines = [
            entry.user_message
            for entry in instance.all_logs(result.run_id)
            if entry.user_message.startswith("collect_projection_garbage: ")
        ]

    # passes of 50, 50 and 20 (not full: the run ends), then the final line
    assert len(lines) == 3 + 1, lines
    assert lines[0].startswith("collect_projection_garbage: 50 rows deleted in ")
    assert lines[0].endswith(
        "; pass 1 completed: 120 candidates, deleted 50 orphans, 0 stale, "
        "0 abandoned, 0 write leases"
    )
    assert "pass 3 completed: 20 candidates, deleted 20 orphans" in lines[2]
    assert lines[-1].startswith("collect_projection_garbage: finished, 120 rows deleted in ")
