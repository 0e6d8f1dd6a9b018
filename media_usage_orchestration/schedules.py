"""The project's schedules, each launching a run only when it finds something for its job to
do, so an idle deployment launches no runs at all: the maintenance lane's (EmDash's
`*/2 * * * *`, after a bounded probe), and the daily pruning of the Dagster instance."""

import dagster as dg

from media_usage_orchestration.dagster_kit.default_status import automation_default_schedule_status
from media_usage_orchestration.jobs import media_usage_instance_pruning, media_usage_maintenance
from media_usage_orchestration.ops.instance_pruning import (
    ProjectGraph,
    PruneInstanceConfig,
    prunable_runs,
)
from media_usage_orchestration.partitions import partition_changes
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.common import database_not_ready
from media_usage_orchestration.store.host.registry import read_collection_slugs
from media_usage_orchestration.store.reads.probes import pending_settlements


def pending_maintenance(instance: dg.DagsterInstance, database: MediaUsageDatabase) -> list[str]:
    """What a maintenance run would change now: the settle loops with something to settle,
    and `partitions` when the collection partitions differ from the registry. A superset of
    what the job does: it never changes anything when this is empty."""
    pending = list(pending_settlements(database.engine))
    added, removed = partition_changes(instance, read_collection_slugs(database.engine))
    if added or removed:
        pending.append("partitions")
    return pending


@dg.schedule(
    name="media_usage_maintenance_schedule",
    job=media_usage_maintenance,
    cron_schedule="*/2 * * * *",
    execution_timezone="UTC",
    default_status=automation_default_schedule_status(),
    description="Every two minutes, when there is something to do: settle and seed "
    "reconciliations, sync collection partitions. Otherwise the tick is skipped.",
)
def media_usage_maintenance_schedule(
    context: dg.ScheduleEvaluationContext, database: MediaUsageDatabase
):
    if skip := database_not_ready(database):
        return skip
    pending = pending_maintenance(context.instance, database)
    if not pending:
        return dg.SkipReason("nothing to settle, seed or sync")
    return dg.RunRequest(tags={"media_usage/maintenance": ",".join(pending)})


@dg.schedule(
    name="media_usage_instance_pruning_schedule",
    job=media_usage_instance_pruning,
    cron_schedule="17 * * * *",
    execution_timezone="UTC",
    default_status=automation_default_schedule_status(),
    description="Hourly at :17, when a finished run of the project is past its age: prune the "
    "Dagster instance with the job's default ages (at most max_runs a run, so a busy "
    "deployment's day of runs goes in small steps). Otherwise the tick is skipped.",
)
def media_usage_instance_pruning_schedule(context: dg.ScheduleEvaluationContext):
    policy = PruneInstanceConfig(max_runs=1).policy()
    project = ProjectGraph.of(context.repository_def)
    now = context.scheduled_execution_time.timestamp()
    if not prunable_runs(context.instance, project, policy, now):
        return dg.SkipReason("no finished run of the project is past its age")
    return dg.RunRequest()
