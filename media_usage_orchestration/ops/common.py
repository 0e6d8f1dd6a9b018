"""What every op shares: retries for transient database errors only, fast failure otherwise."""

import contextlib
import os
from collections.abc import Iterator

import dagster as dg

from media_usage_orchestration.store.core.engine import is_transient_database_error

# Transient: the database was briefly unreachable, busy, or chose us as a deadlock victim.
# Re-running the step is safe because every write is lease-guarded and idempotent.
TRANSIENT_RETRY_POLICY = dg.RetryPolicy(
    max_retries=3, delay=2, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)


@contextlib.contextmanager
def retry_transient_errors_only() -> Iterator[None]:
    """Let transient database errors reach the op's RetryPolicy; fail everything else at once."""
    try:
        yield
    except dg.Failure:
        raise
    except Exception as error:
        if is_transient_database_error(error):
            raise
        raise dg.Failure(
            description=f"{type(error).__name__}: {error}", allow_retries=False
        ) from error


def automation_default_status() -> dg.DefaultSensorStatus:
    """Sensors and schedules run by default (the point is automatic execution);
    `MEDIA_USAGE_AUTOMATION=stopped` starts them stopped, e.g. for a maintenance window."""
    stopped = os.environ.get("MEDIA_USAGE_AUTOMATION", "").strip().lower() == "stopped"
    return dg.DefaultSensorStatus.STOPPED if stopped else dg.DefaultSensorStatus.RUNNING


def automation_default_schedule_status() -> dg.DefaultScheduleStatus:
    running = automation_default_status() is dg.DefaultSensorStatus.RUNNING
    return dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED
