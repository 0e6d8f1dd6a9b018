"""Sensors, one bounded probe each. The work, reconciliation, deletion and projection-GC sensors
ask for runs (whose run keys change every time a row becomes due again) and write nothing to the
database; the alert, run-health, scrubber and queue sensors ask for none: they post alerts, fail
dead runs, heal drift through the operator's work retry, and record check evaluations and
observations.

A run queued, in flight or about to be crash-retried for the same collection and workflow
holds the sensor back: one queued run per collection and workflow, whatever happens to the
runs before it. A run whose worker died does not hold it back for long: the run-health sensor
(`run_health.py`) fails it once its run lease expires.

The alert sensor (`alerts.py`) asks for no runs: it reads check evaluations from the instance
and posts to a webhook when one turns failing or recovers."""

from media_usage_orchestration.sensors.alerts import media_usage_alert_sensor
from media_usage_orchestration.sensors.deletion import media_usage_collection_deletion_sensor
from media_usage_orchestration.sensors.projection_gc import media_usage_projection_gc_sensor
from media_usage_orchestration.sensors.queue import media_usage_queue_sensor
from media_usage_orchestration.sensors.reconciliation import media_usage_reconciliation_sensor
from media_usage_orchestration.sensors.run_health import media_usage_run_health_sensor
from media_usage_orchestration.sensors.scrubber import media_usage_scrubber_sensor
from media_usage_orchestration.sensors.work import media_usage_work_sensor

__all__ = [
    "media_usage_alert_sensor",
    "media_usage_collection_deletion_sensor",
    "media_usage_projection_gc_sensor",
    "media_usage_queue_sensor",
    "media_usage_reconciliation_sensor",
    "media_usage_run_health_sensor",
    "media_usage_scrubber_sensor",
    "media_usage_work_sensor",
]
