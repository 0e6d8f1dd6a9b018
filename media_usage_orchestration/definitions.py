"""The one Dagster `Definitions` object of the project."""

import dagster as dg

from . import jobs, schedules, sensors
from .ops.coverage import coverage_complete, media_usage_index
from .ops.media_library import media_usage_media_library
from .ops.projection_gc import media_usage_projection_cleanup
from .resources.automation import MediaUsageAutomation
from .resources.database import MediaUsageDatabase

defs = dg.Definitions(
    assets=[media_usage_index, media_usage_projection_cleanup, media_usage_media_library],
    asset_checks=[coverage_complete],
    jobs=[
        jobs.media_usage_work,
        jobs.media_usage_reconciliation,
        jobs.media_usage_maintenance,
        jobs.media_usage_activation,
        jobs.request_collection_deletion,
        jobs.media_usage_collection_deletion,
        jobs.retry_media_usage_work_job,
        jobs.retry_collection_deletion_job,
        jobs.retry_media_usage_reconciliation_job,
        jobs.media_usage_projection_gc,
        jobs.media_usage_coverage_check,
    ],
    sensors=[
        sensors.media_usage_work_sensor,
        sensors.media_usage_reconciliation_sensor,
        sensors.media_usage_collection_deletion_sensor,
        sensors.media_usage_projection_gc_sensor,
    ],
    schedules=[schedules.media_usage_maintenance_schedule],
    resources={"database": MediaUsageDatabase(), "automation": MediaUsageAutomation()},
    executor=dg.in_process_executor,
)
