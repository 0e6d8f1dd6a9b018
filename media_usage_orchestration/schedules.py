"""The maintenance lane's schedule: EmDash's `*/2 * * * *`."""

import dagster as dg

from .jobs import media_usage_maintenance
from .ops.common import automation_default_schedule_status

media_usage_maintenance_schedule = dg.ScheduleDefinition(
    name="media_usage_maintenance_schedule",
    job=media_usage_maintenance,
    cron_schedule="*/2 * * * *",
    execution_timezone="UTC",
    default_status=automation_default_schedule_status(),
    description="Every two minutes: settle and seed reconciliations, sync collection partitions.",
)
