"""The shape shared by every lease-guarded op of the reconciliation and deletion graphs.

An op receives the claim identity from the previous op (or, on re-execution from failure, from
the failed run's stored output), makes sure the lease is still ours (renew it; if it lapsed or
a failure was recorded, claim again), runs its step, and then either hands the claim on or
yields nothing so the rest of the run is skipped. What the step did (`outcome` and its counts) is
the metadata of the output it yields: the `lease` it hands on, or, when it stops the run there,
its `outcome` output. The run's `media_usage/outcome` tag (the Runs list filters on it) is
written only where it is the run's final word: by the op that stops the run, by an op that
fails, and by the last op of the run (no step of the run takes its `lease`).

Failures: a transient database error is re-raised for the op's RetryPolicy (the lease is still
ours and the step is idempotent); any other exception is recorded on the row exactly as
EmDash's tick records it (retry with backoff, or failed at the 5th attempt), then fails the op.
"""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import dagster as dg

from media_usage_orchestration.dagster_kit.claim_io import IDENTITY_KEY
from media_usage_orchestration.dagster_kit.dagster_internals import (
    is_direct_invocation,
    output_consumed_in_run,
)
from media_usage_orchestration.dagster_kit.run_tags import (
    AUTOMATIC_RETRY_TAG,
    launched_run,
    tag_run_outcome,
)
from media_usage_orchestration.processing.loop.run_loop import Paging, PagingEnd
from media_usage_orchestration.store.core.engine import Engine, is_transient_database_error
from media_usage_orchestration.store.core.leases import LeaseState

L = TypeVar("L")


class LeasedRow(Protocol):
    """What a coordinator row and a tombstone share: the lease's state."""

    state: LeaseState
    lease_expires_at: str | None
    next_attempt_at: str
    last_error_code: str | None


def why_not_regained(row: LeasedRow | None) -> tuple[str, str]:
    """The outcome, and the reason, of an op that could not claim its row again."""
    if row is None:
        return "gone", "the row is gone: another run finished it"
    if row.state is LeaseState.LEASED:
        return "lease_active", f"another run holds the lease until {row.lease_expires_at}"
    if row.state is LeaseState.FAILED:
        return "failed", f"the row failed ({row.last_error_code}); an operator retry reopens it"
    return "not_due", f"its next attempt is at {row.next_attempt_at}"


class LeasedWorkflow(Protocol[L]):
    """How a workflow's lease is kept, regained, released and charged with a failure."""

    name: str
    lost_errors: tuple[type[BaseException], ...]

    def renew(self, engine: Engine, lease: L) -> L | None: ...

    def reclaim(self, engine: Engine, lease: L, *, reopen: bool) -> L | None: ...

    def current(self, engine: Engine, lease: L) -> LeasedRow | None:
        """The row as the database holds it now (None once it is gone)."""

    def release(self, engine: Engine, lease: L, delay_seconds: int) -> bool: ...

    def record_failure(self, engine: Engine, lease: L, error: BaseException) -> str: ...

    def report_failure(
        self, context: dg.OpExecutionContext, engine: Engine, lease: L, recorded: str
    ) -> None:
        """Tell the UI about a recorded failure (for example, failed coverage)."""


@dataclass(frozen=True)
class StepReport(Generic[L]):
    """What a step did: `lease` is handed to the next op, or None to stop the run here."""

    outcome: str
    lease: L | None
    metadata: Mapping[str, Any] = field(default_factory=dict)


class StepStopped(Exception):
    """Raised inside a step when it must stop without handing the claim on."""

    def __init__(self, outcome: str, **metadata: Any) -> None:
        super().__init__(outcome)
        self.outcome = outcome
        self.metadata = metadata


def stop_unless_done(paging: Paging, **metadata: Any) -> None:
    """A paging loop whose lease was lost, or whose budget is spent (the row is already handed
    back due at once), stops the step; one that ended on its own is the caller's to judge."""
    if paging.end is PagingEnd.CLAIM_LOST:
        raise StepStopped("claim_lost", **metadata)
    if paging.end is PagingEnd.BUDGET_SPENT:
        raise StepStopped("budget_exhausted", **metadata)


def is_reexecution(context: dg.OpExecutionContext) -> bool:
    """A run an operator re-executed (all steps or from failure) may reopen a failed row.

    A run the run-retry daemon launched (it tags it with the retry number) may not: reopening
    there would reset the attempt count and skip the recorded backoff on every retry."""
    run = launched_run(context)
    return run is not None and run.parent_run_id is not None and AUTOMATIC_RETRY_TAG not in run.tags


def ensure_lease(
    context: dg.OpExecutionContext, workflow: LeasedWorkflow[L], engine: Engine, lease: L
) -> L | None:
    # A claim resumed from the database (dagster_kit/claim_io.py) holds no lease to renew.
    renewed = workflow.renew(engine, lease) if lease.lease_token else None
    if renewed is not None:
        return renewed
    regained = workflow.reclaim(engine, lease, reopen=is_reexecution(context))
    if regained is not None:
        context.log.info(f"{workflow.name}: lease regained after it lapsed or was released")
    return regained


def run_leased_step(
    context: dg.OpExecutionContext,
    workflow: LeasedWorkflow[L],
    engine: Engine,
    lease: L,
    step: Callable[[L], StepReport[L]],
) -> Iterator[dg.Output]:
    """Drive one op: keep the lease, run the step, emit the outputs."""
    held = ensure_lease(context, workflow, engine, lease)
    if held is None:
        outcome, reason = why_not_regained(workflow.current(engine, lease))
        yield from emit(context, StepReport(outcome, None, {"reason": reason}))
        return
    try:
        report = step(held)
    except StepStopped as stopped:
        report = StepReport(stopped.outcome, None, stopped.metadata)
    except workflow.lost_errors as lost:
        report = StepReport("claim_lost", None, {"reason": str(lost)})
    except Exception as error:
        if is_transient_database_error(error):
            raise
        recorded = workflow.record_failure(engine, held, error)
        workflow.report_failure(context, engine, held, recorded)
        tag_run_outcome(context, recorded)
        raise dg.Failure(
            description=f"{workflow.name} step failed ({recorded}): {type(error).__name__}: {error}",
            metadata={"outcome": recorded},
            allow_retries=False,
        ) from error
    yield from emit(context, report)


def emit(context: dg.OpExecutionContext, report: StepReport) -> Iterator[dg.Output]:
    """The step's one output, with what it did as metadata: the `lease` handed on, or the
    `outcome` output when the run stops here; the run is tagged when this is its final word."""
    metadata = {"outcome": report.outcome, **dict(report.metadata)}
    handed_on = hands_on_in_run(context)
    if report.lease is not None:
        # Which collection the claim is for (never its token): what a re-execution resumes.
        metadata[IDENTITY_KEY] = report.lease.collection_id
        yield dg.Output(report.lease, output_name="lease", metadata=metadata)
        if not handed_on:
            tag_run_outcome(context, report.outcome)
        return
    yield dg.Output(None, output_name="outcome", metadata=metadata)
    if handed_on:  # the run's later ops are skipped: say why in the run log
        context.log.info(f"stopping here: {report.outcome}")
    tag_run_outcome(context, report.outcome)


def hands_on_in_run(context: dg.OpExecutionContext) -> bool:
    """Whether a step of this run takes the op's `lease` output. Not for the graph's last op,
    nor for the last op of a re-execution of selected steps, nor for an op invoked directly."""
    return not is_direct_invocation(context) and output_consumed_in_run(context, "lease")


def leased_outs(lease_type: type) -> dict[str, dg.Out]:
    return {
        "lease": dg.Out(
            lease_type,
            is_required=False,
            description="The claim, handed on; its metadata says what this step did.",
        ),
        "outcome": dg.Out(
            dg.Nothing,
            is_required=False,
            description="Yielded instead of the claim when the run stops here: what this step "
            "did (see metadata).",
        ),
    }
