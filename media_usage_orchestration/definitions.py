"""The project's Dagster definitions: `defs` (everything but the per-collection coverage
history assets, for code that imports it) and `media_usage_definitions`, what the code location
loads: `defs` with those assets."""

import dagster as dg

from media_usage_orchestration import jobs, schedules, sensors
from media_usage_orchestration.assets.coverage_history import with_coverage_history
from media_usage_orchestration.assets.index import media_usage_index
from media_usage_orchestration.assets.media_library import media_usage_media_library
from media_usage_orchestration.assets.projection_cleanup import media_usage_projection_cleanup
from media_usage_orchestration.assets.queue import with_queue_assets
from media_usage_orchestration.dagster_kit.claim_io import claim_io_manager
from media_usage_orchestration.previews import SENSOR_OWNERS, accepting
from media_usage_orchestration.resources.automation import (
    MediaUsageAutomation,
    work_linger_from_environment,
)
from media_usage_orchestration.resources.database import MediaUsageDatabase


def resolved(definitions: dg.Definitions) -> dg.Definitions:
    """`definitions` with its repository built now (Dagster caches it), where binding the sensors
    to their jobs' resources warns of a beta parameter Dagster itself passes."""
    with accepting(SENSOR_OWNERS):
        definitions.get_repository_def()
    return definitions


# A bad MEDIA_USAGE_WORK_LINGER_SECONDS stops the location from loading, saying why.
work_linger_from_environment()

defs = resolved(
    dg.Definitions(
        assets=[media_usage_index, media_usage_projection_cleanup, media_usage_media_library],
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
            jobs.media_usage_instance_pruning,
        ],
        sensors=[
            sensors.media_usage_work_sensor,
            sensors.media_usage_reconciliation_sensor,
            sensors.media_usage_collection_deletion_sensor,
            sensors.media_usage_projection_gc_sensor,
            sensors.media_usage_alert_sensor,
            sensors.media_usage_scrubber_sensor,
            sensors.media_usage_queue_sensor,
            sensors.media_usage_run_health_sensor,
        ],
        schedules=[
            schedules.media_usage_maintenance_schedule,
            schedules.media_usage_instance_pruning_schedule,
        ],
        resources={
            "database": MediaUsageDatabase(),
            "automation": MediaUsageAutomation(),
            # Only the lease-guarded graphs' claims go through an IO manager (dagster_kit/claim_io.py).
            "io_manager": claim_io_manager,
        },
        executor=dg.in_process_executor,
    )
)


@dg.definitions
def media_usage_definitions() -> dg.Definitions:
    """What the code location loads (Dagster prefers this to `defs`): `defs` with one coverage
    history asset per live collection, read from the registry once per load, and a queue asset
    with its check beside each."""
    return resolved(with_queue_assets(with_coverage_history(defs, MediaUsageDatabase())))
