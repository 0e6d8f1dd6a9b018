"""The default status of every sensor and schedule: running, unless `MEDIA_USAGE_AUTOMATION=stopped`."""

import os

import dagster as dg

# `stopped` gives the sensors and the schedule a default status of STOPPED.
AUTOMATION_ENV = "MEDIA_USAGE_AUTOMATION"


def automation_default_status() -> dg.DefaultSensorStatus:
    """Sensors and schedules run by default (the point is automatic execution);
    `MEDIA_USAGE_AUTOMATION=stopped` starts them stopped, e.g. for a maintenance window."""
    stopped = os.environ.get(AUTOMATION_ENV, "").strip().lower() == "stopped"
    return dg.DefaultSensorStatus.STOPPED if stopped else dg.DefaultSensorStatus.RUNNING


def automation_default_schedule_status() -> dg.DefaultScheduleStatus:
    running = automation_default_status() is dg.DefaultSensorStatus.RUNNING
    return dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED
