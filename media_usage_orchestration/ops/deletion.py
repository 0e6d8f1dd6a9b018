"""Collection deletion ops: the operator's request and the background tombstone graph.

The background graph has one op per phase (fence, registry, table, work, sources, status,
finalize). An op whose phase is already past hands the claim on untouched; a batch op loops
batches while its lease is live, renewing it between batches, within its budget.
"""

from collections.abc import Callable
from dataclasses import dataclass

import dagster as dg
from pydantic import Field

from media_usage_orchestration.assets.index import forget_deleted_collection
from media_usage_orchestration.dagster_kit.leased import (
    StepReport,
    StepStopped,
    emit,
    is_reexecution,
    leased_outs,
    stop_unless_done,
)
from media_usage_orchestration.dagster_kit.progress import ProgressLog, logged_progress
from media_usage_orchestration.dagster_kit.retries import (
    retries_transient_errors,
    retry_transient_errors_only,
)
from media_usage_orchestration.dagster_kit.run_tags import tag_run_collection, tag_run_outcome
from media_usage_orchestration.ops.leased_op import Step, leased_op
from media_usage_orchestration.processing.deletion import processor as processing
from media_usage_orchestration.processing.deletion.processor import (
    PhaseStepOutcome,
    PhaseStepResult,
)
from media_usage_orchestration.processing.loop.run_loop import Budget, Page, page_until_done
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.deletion.records import (
    DeletionLease,
    DeletionPhase,
    DeletionRecord,
)
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from media_usage_orchestration.store.host.registry import read_collection_id
from media_usage_orchestration.values.errors import DeletionLeaseLost
from media_usage_orchestration.values.identifiers import validate_identifier

PHASE_ORDER = tuple(DeletionPhase)


@dataclass(frozen=True)
class DeletionWorkflow:
    name: str = "collection deletion"
    lost_errors: tuple[type[BaseException], ...] = (DeletionLeaseLost,)

    def renew(self, engine: Engine, lease: DeletionLease) -> DeletionLease | None:
        return lease if processing.renew_deletion_lease(engine, lease) else None

    def reclaim(
        self, engine: Engine, lease: DeletionLease, *, reopen: bool
    ) -> DeletionLease | None:
        return claim_tombstone(engine, lease.collection_id, reopen=reopen)

    def current(self, engine: Engine, lease: DeletionLease) -> DeletionRecord | None:
        return DeletionRepository(engine).find(lease.collection_id)

    def release(self, engine: Engine, lease: DeletionLease, delay_seconds: int = 0) -> bool:
        return processing.release_deletion_lease(engine, lease)

    def record_failure(self, engine: Engine, lease: DeletionLease, error: BaseException) -> str:
        return processing.record_phase_failure(engine, lease, error).value

    def report_failure(self, context, engine: Engine, lease: DeletionLease, recorded: str) -> None:
        """A deleted collection has no coverage left to report; the run shows the failure."""


WORKFLOW = DeletionWorkflow()


def claim_tombstone(engine: Engine, collection_id: str, *, reopen: bool) -> DeletionLease | None:
    """Claim the tombstone in its current phase; an operator's re-execution first reopens a
    failed or backing-off tombstone (EmDash's operator retry: phase kept, attempts reset)."""
    if reopen:
        DeletionRepository(engine).retry_operator_deletion(collection_id)
    claim = processing.claim_due_deletion(engine, collection_id)
    return DeletionLease(claim.collection_id, claim.lease_token) if claim else None


def tombstone_slug(engine: Engine, collection_id: str | None) -> str | None:
    """The slug the tombstone of `collection_id` keeps (the registry row may be gone)."""
    if not collection_id:
        return None
    record = DeletionRepository(engine).find(collection_id)
    return record.collection_slug if record is not None else None


# --- background graph ---------------------------------------------------------------------------


class ClaimDeletionConfig(dg.Config):
    collection_id: str = Field(description="Immutable id of the collection being deleted.")


class DeletionBatchBudget(dg.Config):
    max_batches: int = Field(default=2000, ge=1, description="Batches of 50 rows per op.")
    max_seconds: float = Field(default=300.0, gt=0, le=3600, description="Time budget per op.")


@dg.op(
    out=leased_outs(DeletionLease),
    description="Claim the collection's tombstone (300 s lease) in whatever phase it is in.",
)
@retries_transient_errors
def claim_deletion(
    context: dg.OpExecutionContext, config: ClaimDeletionConfig, database: MediaUsageDatabase
):
    with retry_transient_errors_only(context):
        tag_run_collection(context, tombstone_slug(database.engine, config.collection_id))
        lease = claim_tombstone(
            database.engine, config.collection_id, reopen=is_reexecution(context)
        )
    if lease is None:
        yield from emit(
            context, StepReport("not_due", None, {"collection_id": config.collection_id})
        )
        return
    yield from emit(context, StepReport("claimed", lease, {"collection_id": config.collection_id}))


def _phase_body(
    engine: Engine,
    phase: DeletionPhase,
    step: Callable[[Engine, DeletionLease], PhaseStepResult],
    budget: DeletionBatchBudget | None,
    progress: ProgressLog | None = None,
) -> Callable[[DeletionLease], StepReport]:
    def body(lease: DeletionLease) -> StepReport:
        paging = page_until_done(
            lease,
            lambda held: _batch(engine, step, held),
            budget=_budget(budget),
            renew=lambda held: WORKFLOW.renew(engine, held),
            release_now=lambda held: WORKFLOW.release(engine, held),
            progress=progress.counting(_rows_deleted) if progress is not None else None,
        )
        metadata = {
            "phase": phase.value,
            "batches": len(paging.results),
            "rows_deleted": sum(result.deleted for result in paging.results),
        }
        stop_unless_done(paging, **metadata)
        return _report(phase, paging.last, lease, metadata)

    return body


def _rows_deleted(result: PhaseStepResult) -> int:
    return result.deleted


def _batch(
    engine: Engine, step: Callable[[Engine, DeletionLease], PhaseStepResult], lease: DeletionLease
) -> Page[DeletionLease, PhaseStepResult]:
    result = step(engine, lease)
    return Page(result, lease, more=result.outcome is PhaseStepOutcome.REPEAT)


def _budget(budget: DeletionBatchBudget | None) -> Budget:
    """A batch op runs its first batch whatever the clock says; a single-step op hands its
    row back after one step that left rows to remove."""
    if budget is None:
        return Budget(max_steps=1)
    return Budget(budget.max_batches, budget.max_seconds, guaranteed_steps=1)


def _report(phase: DeletionPhase, result: PhaseStepResult, lease, metadata) -> StepReport:
    if result.outcome is PhaseStepOutcome.HAS_CONTENT:
        raise StepStopped("has_content", **metadata)
    if result.outcome is PhaseStepOutcome.FINALIZED:
        return StepReport("finalized", None, metadata)
    if result.outcome is PhaseStepOutcome.SKIPPED:
        if result.phase is None:
            raise StepStopped("gone", **metadata)
        if PHASE_ORDER.index(result.phase) < PHASE_ORDER.index(phase):
            raise StepStopped("out_of_order", tombstone_phase=result.phase.value, **metadata)
        return StepReport(
            "already_past", lease, {**metadata, "tombstone_phase": result.phase.value}
        )
    return StepReport("advanced", lease, {**metadata, "next_phase": _phase_name(result.phase)})


def _phase_name(phase: DeletionPhase | None) -> str:
    return phase.value if phase else "-"


def _phase_op(
    name: str,
    phase: DeletionPhase,
    step: Callable[[Engine, DeletionLease], PhaseStepResult],
    description: str,
    *,
    batched: bool = False,
) -> dg.OpDefinition:
    declare = leased_op(
        WORKFLOW,
        DeletionLease,
        description=description,
        config=DeletionBatchBudget if batched else None,
        name=name,
    )
    if not batched:
        return declare(lambda context, engine: _phase_body(engine, phase, step, None))

    def batched_body(
        context: dg.OpExecutionContext, engine: Engine, config: DeletionBatchBudget
    ) -> Step:
        def body(lease: DeletionLease) -> StepReport:
            with logged_progress(context, name, "rows deleted") as progress:
                return _phase_body(engine, phase, step, config, progress)(lease)

        return body

    return declare(batched_body)


fence = _phase_op(
    "fence",
    DeletionPhase.FENCE,
    processing.fence_step,
    "Fence capture (capture_state deleting) after the has-content check; keeps the collection "
    "and cancels the tombstone when it has content and deletion is not forced.",
)
remove_registry = _phase_op(
    "remove_registry",
    DeletionPhase.REGISTRY,
    processing.registry_step,
    "Delete the registry row and its fields under the deletion lease.",
)
drop_table = _phase_op(
    "drop_table",
    DeletionPhase.TABLE,
    processing.table_step,
    "Drop the search table and ec_<slug> (its capture triggers go with it).",
)
delete_work = _phase_op(
    "delete_work",
    DeletionPhase.WORK,
    processing.delete_work_step,
    "Delete the collection's work rows, 50 per batch, with a cursor.",
    batched=True,
)
delete_sources = _phase_op(
    "delete_sources",
    DeletionPhase.SOURCES,
    processing.delete_sources_step,
    "Delete the collection's canonical sources and their occurrences, 50 rows per batch.",
    batched=True,
)
delete_status = _phase_op(
    "delete_status",
    DeletionPhase.STATUS,
    processing.delete_status_step,
    "Remove the reconciliation and status rows once no work or sources remain.",
)
finalize_deletion = _phase_op(
    "finalize_deletion",
    DeletionPhase.FINALIZE,
    processing.finalize_step,
    "Check nothing is left, then delete the tombstone: the slug is free again.",
)


# --- operator request ----------------------------------------------------------------------


class RequestDeletionConfig(dg.Config):
    collection: str = Field(description="Slug of the collection to delete.")
    force: bool = Field(default=False, description="Delete even when it still has live entries.")


@dg.op(
    out=dg.Out(dg.Nothing),
    description="Request a collection deletion: tombstone, fence, registry and table now; "
    "the background job removes the rest.",
)
@retries_transient_errors
def request_deletion(
    context: dg.OpExecutionContext, config: RequestDeletionConfig, database: MediaUsageDatabase
):
    tag_run_collection(context, config.collection)
    with retry_transient_errors_only(context):
        # Inside: bad input fails the step at once instead of going to the RetryPolicy.
        validate_identifier(config.collection, "collection slug")
        outcome, detail = _request(database.engine, config.collection, config.force)
        forget_deleted_collection(context, database.engine, config.collection)
    context.log.info(f"deletion of {config.collection!r}: {outcome} ({detail})")
    tag_run_outcome(context, outcome)
    yield dg.Output(
        None,
        metadata={"outcome": outcome, "collection": config.collection, "detail": detail},
    )


def _request(engine: Engine, slug: str, force: bool) -> tuple[str, str]:
    collection_id = read_collection_id(engine, slug)
    if collection_id is not None and not force and processing.has_live_content(engine, slug):
        raise _refused(slug)
    outcome = processing.delete_activated_collection(
        engine, slug, collection_id=collection_id, force_delete=force
    )
    if outcome is processing.FrontPhaseOutcome.HAS_CONTENT:
        raise _refused(slug)
    if outcome is processing.FrontPhaseOutcome.NOT_FOUND:
        raise _not_found(slug)
    if outcome is processing.FrontPhaseOutcome.INACTIVE:
        if collection_id is None:
            raise _not_found(slug)
        processing.request_collection_deletion(engine, slug, force=force)
        return outcome.value, "capture is not activated: deleted synchronously"
    if outcome is processing.FrontPhaseOutcome.IN_PROGRESS:
        return outcome.value, "another owner holds the tombstone; the background job continues"
    return outcome.value, "registry and table removed; the background job removes the rest"


def _not_found(slug: str) -> dg.Failure:
    return dg.Failure(
        f"Collection {slug!r} does not exist",
        metadata={"outcome": processing.FrontPhaseOutcome.NOT_FOUND.value, "collection": slug},
        allow_retries=False,
    )


def _refused(slug: str) -> dg.Failure:
    return dg.Failure(
        f"Collection {slug!r} still has entries; nothing was changed. Delete or trash its "
        "entries first, or request the deletion again with force: true.",
        metadata={"outcome": "has_content", "collection": slug},
        allow_retries=False,
    )
