"""What every op shares: retries for transient database errors only, fast failure otherwise."""

import contextlib
import os
from collections.abc import Iterator

import dagster as dg

from media_usage_orchestration.ops.run_tags import tag_run_outcome
from media_usage_orchestration.store.core.engine import is_transient_database_error

# Transient: the database was briefly unreachable, busy, or chose us as a deadlock victim.
# Re-running the step is safe because every write is lease-guarded and idempotent.
TRANSIENT_RETRY_POLICY = dg.RetryPolicy(
    max_retries=3, delay=2, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)


@contextlib.contextmanager
def retry_transient_errors_only(context: dg.OpExecutionContext | None = None) -> Iterator[None]:
    """Let transient database errors reach the op's RetryPolicy; fail everything else at once.
    With the op's `context`, a failure is also the run's final word: its outcome tag says why
    (the failure's `outcome`, else the error's stable code, else `failed`)."""
    try:
        yield
    except dg.Failure as failure:
        if context is not None:
            tag_run_outcome(context, failure_outcome(failure))
        raise
    except Exception as error:
        if is_transient_database_error(error):
            raise
        failure = dg.Failure(
            description=f"{type(error).__name__}: {error}",
            metadata={"outcome": error_outcome(error)},
            allow_retries=False,
        )
        if context is not None:
            tag_run_outcome(context, failure_outcome(failure))
        raise failure from error


def failure_outcome(failure: dg.Failure) -> str:
    outcome = failure.metadata.get("outcome")
    return str(getattr(outcome, "value", outcome)) if outcome is not None else "failed"


def error_outcome(error: BaseException) -> str:
    """An error's stable code as an outcome word (`COLLECTION_NOT_FOUND` → `collection_not_found`,
    `MEDIA_USAGE_INVALID_IDENTIFIER` → `invalid_identifier`); `failed` without one."""
    code = getattr(error, "code", None)
    if not isinstance(code, str) or not code:
        return "failed"
    return code.lower().removeprefix("media_usage_")


def automation_default_status() -> dg.DefaultSensorStatus:
    """Sensors and schedules run by default (the point is automatic execution);
    `MEDIA_USAGE_AUTOMATION=stopped` starts them stopped, e.g. for a maintenance window."""
    stopped = os.environ.get("MEDIA_USAGE_AUTOMATION", "").strip().lower() == "stopped"
    return dg.DefaultSensorStatus.STOPPED if stopped else dg.DefaultSensorStatus.RUNNING


def automation_default_schedule_status() -> dg.DefaultScheduleStatus:
    running = automation_default_status() is dg.DefaultSensorStatus.RUNNING
    return dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED
