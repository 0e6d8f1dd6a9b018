"""The run-health sensor: a run whose process is gone never holds its collection.

Dagster learns that a run worker died only from its run launcher: the Docker and Kubernetes
launchers answer run monitoring's health check, Dagster's default launcher answers nothing once
the code server that started the worker is gone too, so such a run stays STARTED (holding its
place in the run queue and in the sensors' counts) until `max_runtime_seconds` ends it.

The database knows better. Every run of this code location holds a run lease
(`_muo_run_leases`), renewed every few seconds by its worker while the process lives
(`processing/loop/run_heartbeat.py`). Each tick this sensor reads the leases of the location's runs
that Dagster records STARTED or CANCELING and

- fails a STARTED run whose lease expired on the database clock (its crash retry, if run
  retries allow one, resumes from the database), tagging it `media_usage/outcome=worker_lost`;
- marks a CANCELING run canceled once its lease expired (a Terminate whose worker could not
  be reached: the code server was gone);
- gives a run without any lease one lease's length of database time to take one (a worker
  that was just starting, or waiting for the database), remembered in the cursor, and then
  fails it the same way.

It launches no runs and writes nothing to the CMS database: the sensors that ask for runs see
the collection free on their next tick. Which launcher runs the workers does not matter."""

from __future__ import annotations

import json

import dagster as dg

from media_usage_orchestration.dagster_kit.default_status import automation_default_status
from media_usage_orchestration.dagster_kit.run_tags import OUTCOME_TAG
from media_usage_orchestration.processing.loop.run_heartbeat import (
    HEARTBEAT_SECONDS,
    RUN_LEASE_SECONDS,
)
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.common import probe_when_ready
from media_usage_orchestration.store.core.clock import seconds_between
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.core.schema import PROJECT_TABLES, missing_tables
from media_usage_orchestration.store.runs.run_leases import (
    RunLeaseState,
    database_now,
    read_run_leases,
)

RUN_HEALTH_INTERVAL_SECONDS = 10
WORKER_LOST = "worker_lost"
JUDGED_STATUSES = [dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
# A run without a lease is judged dead once it went this long (database time) without one.
MISSING_LEASE_GRACE_SECONDS = RUN_LEASE_SECONDS + HEARTBEAT_SECONDS


def _location_name(context: dg.SensorEvaluationContext) -> str | None:
    origin = context.code_location_origin
    return origin.location_name if origin is not None else None


def _run_location(run: dg.DagsterRun) -> str | None:
    origin = run.remote_job_origin
    return origin.repository_origin.code_location_origin.location_name if origin else None


def _uses_database(context: dg.SensorEvaluationContext, job_name: str) -> bool:
    """Whether runs of the job hold run leases: every job that opens the CMS database."""
    repository = context.repository_def
    if repository is None or not repository.has_job(job_name):
        return False
    return "database" in repository.get_job(job_name).required_resource_keys


def judged_runs(context: dg.SensorEvaluationContext) -> list[dg.DagsterRun]:
    """This location's runs that Dagster records running or canceling and that hold run
    leases (runs executed in process elsewhere, or of another location, are not ours)."""
    location = _location_name(context)
    runs = context.instance.get_runs(filters=dg.RunsFilter(statuses=JUDGED_STATUSES))
    return [
        run
        for run in runs
        if (location is None or _run_location(run) == location)
        and _uses_database(context, run.job_name)
    ]


def _parse_cursor(cursor: str | None) -> dict[str, str]:
    """Run id -> database time it was first seen without a lease."""
    try:
        value = json.loads(cursor or "{}")
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(key): str(seen) for key, seen in value.items() if isinstance(seen, str)}


def dead_runs(
    runs: list[dg.DagsterRun],
    leases: dict[str, RunLeaseState],
    now: str,
    missing_since: dict[str, str],
) -> tuple[list[tuple[dg.DagsterRun, str]], dict[str, str]]:
    """The runs judged dead (each with why), and who is still without a lease since when."""
    dead: list[tuple[dg.DagsterRun, str]] = []
    still_missing: dict[str, str] = {}
    for run in runs:
        lease = leases.get(run.run_id)
        if lease is not None:
            if not lease.live:
                dead.append(
                    (
                        run,
                        f"its run lease expired at {lease.lease_expires_at} (last heartbeat "
                        f"{lease.heartbeat_at}, database time {now})",
                    )
                )
            continue
        since = missing_since.get(run.run_id, now)
        waited = seconds_between(since, now) or 0.0
        if waited >= MISSING_LEASE_GRACE_SECONDS:
            dead.append((run, f"it took no run lease in {waited:.0f} s (database time)"))
        else:
            still_missing[run.run_id] = since
    return dead, still_missing


def _mark_dead(instance: dg.DagsterInstance, run: dg.DagsterRun, why: str) -> str | None:
    """Fail (or, for a Terminate that could not reach it, cancel) a run still in flight."""
    current = instance.get_run_by_id(run.run_id)
    if current is None or current.status not in JUDGED_STATUSES:
        return None  # it ended on its own since it was read
    message = f"The run's worker is gone: {why}. Marked by media_usage_run_health_sensor."
    if current.status is dg.DagsterRunStatus.CANCELING:
        instance.report_run_canceled(current, message)
        return f"{run.run_id} canceled"
    instance.add_run_tags(run.run_id, {OUTCOME_TAG: WORKER_LOST})
    instance.report_run_failed(current, message)
    return f"{run.run_id} failed"


def _leases(
    engine: Engine, run_ids: list[str]
) -> tuple[dict[str, RunLeaseState], str] | dg.SkipReason:
    if missing := missing_tables(engine, PROJECT_TABLES):
        # A database EmDash created: its runs cannot take leases, so none is judged.
        return dg.SkipReason(
            f"this database has no {missing[0]} table yet: run `media-usage init`; until then "
            "dead runs are not detected (run monitoring's max_runtime_seconds still ends them)"
        )
    return read_run_leases(engine, run_ids), database_now(engine)


@dg.sensor(
    minimum_interval_seconds=RUN_HEALTH_INTERVAL_SECONDS,
    default_status=automation_default_status(),
    description="Fails a run of this location whose worker is gone (its run lease, renewed "
    f"every {HEARTBEAT_SECONDS:g} s while the process lives, expired {RUN_LEASE_SECONDS} s "
    "after the last renewal), and cancels a canceling one, so a dead run never holds its "
    "collection; works with every run launcher. Launches no runs.",
)
def media_usage_run_health_sensor(
    context: dg.SensorEvaluationContext, database: MediaUsageDatabase
):
    runs = judged_runs(context)
    if not runs:
        context.update_cursor(None)
        return dg.SkipReason("no run in flight")
    read = probe_when_ready(database, lambda engine: _leases(engine, [r.run_id for r in runs]))
    if isinstance(read, dg.SkipReason):
        context.update_cursor(None)
        return read
    leases, now = read
    dead, missing = dead_runs(runs, leases, now, _parse_cursor(context.cursor))
    context.update_cursor(json.dumps(missing, sort_keys=True) if missing else None)
    marked = []
    for run, why in dead:
        done = _mark_dead(context.instance, run, why)
        if done is not None:  # a run that ended on its own meanwhile is no one's warning
            marked.append(done)
            context.log.warning(f"run {run.run_id} ({run.job_name}): worker gone, {why}")
    if marked:
        return dg.SkipReason(f"worker gone: {', '.join(marked)}")
    waiting = f", {len(missing)} still taking its lease" if missing else ""
    return dg.SkipReason(f"{len(runs)} run(s) in flight, all alive{waiting}")


__all__ = ["WORKER_LOST", "dead_runs", "media_usage_run_health_sensor"]
