"""Retries for transient database errors only, fast failure otherwise: what every op shares.

No op carries a Dagster `RetryPolicy`: Dagster turns an interrupt (Terminate) into a step
retry for any op that has one, so a terminated run would restart its step and run on. A
transient database error is retried instead by the op itself asking for it
(`dg.RetryRequested`, with the delays of `TRANSIENT_RETRY_POLICY`), and an interrupt reaches
Dagster as it is: the step fails and the run ends CANCELED.
"""

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TypeVar

import dagster as dg

from media_usage_orchestration.dagster_kit.outcomes import error_outcome, failure_outcome
from media_usage_orchestration.dagster_kit.run_tags import tag_run_outcome
from media_usage_orchestration.store.core.engine import is_transient_database_error

# Transient: the database was briefly unreachable, busy, or chose us as a deadlock victim.
# Re-running the step is safe because every write is lease-guarded and idempotent. The policy
# is never attached to an op (see above): it states the retries and delays ops ask for.
TRANSIENT_RETRY_POLICY = dg.RetryPolicy(
    max_retries=3, delay=2, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)


def transient_retry(context: dg.OpExecutionContext) -> dg.RetryRequested:
    """The step retry a transient database error asks for: its attempt's delay of
    `TRANSIENT_RETRY_POLICY`, at most its `max_retries` (then the step fails)."""
    try:
        attempt = context.retry_number + 1
    except AttributeError:  # an op invoked directly has no retry number
        attempt = 1
    return dg.RetryRequested(
        max_retries=TRANSIENT_RETRY_POLICY.max_retries,
        seconds_to_wait=TRANSIENT_RETRY_POLICY.calculate_delay(attempt),
    )


@contextlib.contextmanager
def transient_errors_retried(context: dg.OpExecutionContext) -> Iterator[None]:
    """A transient database error becomes a step retry; everything else (an interrupt
    included) passes as it is."""
    try:
        yield
    except dg.RetryRequested:
        raise
    except Exception as error:
        if is_transient_database_error(error):
            raise transient_retry(context) from error
        raise


Compute = TypeVar("Compute", bound=Callable[..., Iterator])


def retries_transient_errors(compute: Compute) -> Compute:
    """For an op's compute function (a generator taking the context first): the whole body
    under `transient_errors_retried`, resource access and lease renewals included."""

    @functools.wraps(compute)
    def retried(context: dg.OpExecutionContext, *args, **kwargs):
        with transient_errors_retried(context):
            yield from compute(context, *args, **kwargs)

    return retried  # type: ignore[return-value]


@contextlib.contextmanager
def retry_transient_errors_only(context: dg.OpExecutionContext | None = None) -> Iterator[None]:
    """Retry the step on a transient database error; fail everything else at once. With the
    op's `context`, a failure is also the run's final word: its outcome tag says why (the
    failure's `outcome`, else the error's stable code, else `failed`). Without one (outside an
    op), a transient error passes as it is."""
    try:
        yield
    except dg.Failure as failure:
        if context is not None:
            tag_run_outcome(context, failure_outcome(failure))
        raise
    except dg.RetryRequested:
        raise
    except Exception as error:
        if is_transient_database_error(error):
            if context is not None:
                raise transient_retry(context) from error
            raise
        failure = dg.Failure(
            description=f"{type(error).__name__}: {error}",
            metadata={"outcome": error_outcome(error)},
            allow_retries=False,
        )
        if context is not None:
            tag_run_outcome(context, failure_outcome(failure))
        raise failure from error
