"""The projection-GC sensor: a run when the task row is due and a pass has work."""

import dagster as dg

from media_usage_orchestration.dagster_kit.default_status import automation_default_status
from media_usage_orchestration.jobs import media_usage_projection_gc
from media_usage_orchestration.processing.projection_gc.passes import GcLimits
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.common import (
    last_unsuccessful_run_id,
    probe_when_ready,
    run_key,
    runs_in_flight,
)
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.reads.probes import due_projection_gc


def _due_projection_gc(engine: Engine):
    limits = GcLimits()
    return due_projection_gc(engine, limits.candidate_limit, limits.safety_window_seconds)


@dg.sensor(
    job=media_usage_projection_gc,
    minimum_interval_seconds=60,
    default_status=automation_default_status(),
    description="A projection-GC run when the projection_gc task row is due and a pass has "
    "something to do (expired write leases, obsolete occurrences in the next scan window, or "
    "a sweep to advance); one probe reading at most one scan window through the index.",
)
def media_usage_projection_gc_sensor(
    context: dg.SensorEvaluationContext, database: MediaUsageDatabase
):
    due = probe_when_ready(database, _due_projection_gc)
    if isinstance(due, dg.SkipReason):
        return due
    if due is None:
        return dg.SkipReason("the projection GC is not due (or a pass holds its lease)")
    if not due.has_work:
        return dg.SkipReason("no projection GC candidates")
    if runs_in_flight(context.instance, media_usage_projection_gc.name):
        return dg.SkipReason("a projection GC run is already queued or running")
    return dg.RunRequest(
        run_key=run_key(
            "gc",
            "projection_gc",
            due.due_at,
            due.updated_at,
            last_unsuccessful_run_id(context.instance, media_usage_projection_gc.name),
        ),
        tags={"media_usage/workflow": "projection_gc"},
    )
