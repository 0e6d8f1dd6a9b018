"""Sensors read, ops write: each sensor runs one bounded, indexed query for due rows and asks
for runs whose run key changes every time a row becomes due again.

A run in flight for the same row holds the sensor back (load shaping), except when the row is
due because its lease expired: the run that held it died or stalled, Dagster may not know yet
(until run monitoring marks it failed), and the database guards make the stale run harmless.

The alert sensor (`alerts.py`) asks for no runs: it reads check evaluations from the instance
and posts to a webhook when one turns failing or recovers."""

from media_usage_orchestration.sensors.alerts import media_usage_alert_sensor
from media_usage_orchestration.sensors.deletion import media_usage_collection_deletion_sensor
from media_usage_orchestration.sensors.projection_gc import media_usage_projection_gc_sensor
from media_usage_orchestration.sensors.queue import media_usage_queue_sensor
from media_usage_orchestration.sensors.reconciliation import media_usage_reconciliation_sensor
from media_usage_orchestration.sensors.scrubber import media_usage_scrubber_sensor
from media_usage_orchestration.sensors.work import media_usage_work_sensor

__all__ = [
    "media_usage_alert_sensor",
    "media_usage_collection_deletion_sensor",
    "media_usage_projection_gc_sensor",
    "media_usage_queue_sensor",
    "media_usage_reconciliation_sensor",
    "media_usage_scrubber_sensor",
    "media_usage_work_sensor",
]
