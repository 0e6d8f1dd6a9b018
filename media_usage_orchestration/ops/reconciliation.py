"""Reconciliation ops: claim, prepare, scan pages, drain work, source pages, finalize.

Each op is one lease-guarded step of EmDash's reconciliation (spec 6.3) for the partition's
collection. Paging ops loop pages while the lease is live, renewing it between pages, until
their budget is spent; then they hand the row back due at once (`budget_exhausted`) and the
sensor starts the next run from the checkpoint. An op that must wait releases with the seed's
30 s delay and yields no claim, so the rest of the run is skipped and the run succeeds.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

import dagster as dg
from pydantic import Field

from media_usage_orchestration.assets.index import record_coverage, record_failed_coverage
from media_usage_orchestration.dagster_kit.leased import (
    StepReport,
    StepStopped,
    emit,
    is_reexecution,
    leased_outs,
    stop_unless_done,
)
from media_usage_orchestration.dagster_kit.progress import logged_progress
from media_usage_orchestration.dagster_kit.retries import (
    retries_transient_errors,
    retry_transient_errors_only,
)
from media_usage_orchestration.dagster_kit.run_tags import tag_run_collection
from media_usage_orchestration.ops.leased_op import Step, leased_op
from media_usage_orchestration.processing.loop.run_loop import Budget
from media_usage_orchestration.processing.reconciliation import steps, walks
from media_usage_orchestration.processing.reconciliation.model import (
    CONTINUE_DELAY_SECONDS,
    DRAIN_BATCH_SIZE,
    ReconciliationOutcome,
    ScanOutcome,
    StepResult,
)
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.host.registry import read_collection_id
from media_usage_orchestration.store.reconciliation.records import (
    ReconciliationClaim,
    ReconciliationRecord,
)
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from media_usage_orchestration.values.identifiers import validate_identifier


@dataclass(frozen=True)
class ReconciliationWorkflow:
    name: str = "reconciliation"
    lost_errors: tuple[type[BaseException], ...] = ()

    def renew(self, engine: Engine, claim: ReconciliationClaim) -> ReconciliationClaim | None:
        return steps.renew(engine, claim)

    def reclaim(
        self, engine: Engine, claim: ReconciliationClaim, *, reopen: bool
    ) -> ReconciliationClaim | None:
        # Resume the run's row, never seed a new one mid-graph: with no row left (another run
        # completed it) the step has nothing to resume.
        if self.current(engine, claim) is None:
            return None
        attempt = steps.reclaim(engine, claim, reopen=reopen)
        return attempt.claim if attempt.outcome is ReconciliationOutcome.ADVANCED else None

    def current(self, engine: Engine, claim: ReconciliationClaim) -> ReconciliationRecord | None:
        return ReconciliationRepository(engine).find_by_collection(claim.collection_id)

    def release(self, engine: Engine, claim: ReconciliationClaim, delay_seconds: int) -> bool:
        return steps.release(engine, claim, delay_seconds)

    def record_failure(
        self, engine: Engine, claim: ReconciliationClaim, error: BaseException
    ) -> str:
        # Pages checkpointed before the failure reset the row's attempt count: judge the
        # failure on the row, as EmDash's tick does with the claim it took for its one step.
        return steps.record_step_failure(engine, steps.reload(engine, claim) or claim).value

    def report_failure(
        self,
        context: dg.OpExecutionContext,
        engine: Engine,
        claim: ReconciliationClaim,
        recorded: str,
    ) -> None:
        if recorded == ReconciliationOutcome.FAILED:
            record_failed_coverage(context, engine, claim.collection_id, claim.collection_slug)


WORKFLOW = ReconciliationWorkflow()


class ClaimReconciliationConfig(dg.Config):
    force: bool = Field(
        default=False,
        description="Reconcile even when coverage is complete (requests a full reconciliation); "
        "the run tag media_usage/force=true does the same where no config can be given.",
    )


class PageBudget(dg.Config):
    max_pages: int = Field(default=100_000, ge=1, description="Pages of 50 per op.")
    max_seconds: float = Field(default=600.0, gt=0, le=3600, description="Time budget per op.")


class DrainBudget(dg.Config):
    batch_size: int = Field(
        default=DRAIN_BATCH_SIZE, ge=1, le=100, description="Work items claimed per batch."
    )
    max_seconds: float = Field(default=600.0, gt=0, le=3600, description="Time budget per op.")


# --- claim ----------------------------------------------------------------------------------

# A run tag, because the UI's backfill dialog takes tags but no run config: a backfill tagged
# `media_usage/force=true` re-reconciles complete collections as config `force: true` does.
FORCE_TAG = "media_usage/force"
FORCE_TAG_VALUES = {"true": True, "false": False}


def forced(config: ClaimReconciliationConfig, tags: Mapping[str, str]) -> bool:
    """Whether the run forces a full reconciliation: config `force` or the force tag.

    A tag value other than `true`/`false`, or `false` against config `force: true`, fails the
    run before anything is written."""
    if FORCE_TAG not in tags:
        return config.force
    value = tags[FORCE_TAG]
    if value not in FORCE_TAG_VALUES:
        raise dg.Failure(
            f"Run tag {FORCE_TAG}={value!r} is not 'true' or 'false'; nothing was changed. "
            f"Launch again with {FORCE_TAG}=true to re-reconcile a complete collection.",
            metadata={"outcome": "invalid_force_tag", FORCE_TAG: value},
            allow_retries=False,
        )
    if config.force and not FORCE_TAG_VALUES[value]:
        raise dg.Failure(
            f"Run tag {FORCE_TAG}=false contradicts config force: true; nothing was changed. "
            "Drop one of the two.",
            metadata={"outcome": "invalid_force_tag", FORCE_TAG: value},
            allow_retries=False,
        )
    return FORCE_TAG_VALUES[value]


@dg.op(
    out=leased_outs(ReconciliationClaim),
    description="Claim the partition's reconciliation (60 s lease), seeding it when the "
    "collection needs one; with config force or the run tag media_usage/force=true, request "
    "a full reconciliation of complete coverage (otherwise such a run says already_complete).",
)
@retries_transient_errors
def claim_reconciliation(
    context: dg.OpExecutionContext,
    config: ClaimReconciliationConfig,
    database: MediaUsageDatabase,
):
    slug = context.partition_key
    tag_run_collection(context, slug)
    engine = database.engine
    with retry_transient_errors_only(context):
        force = forced(config, context.run_tags)
        validate_identifier(slug, "collection slug")
        collection_id = read_collection_id(engine, slug)
        if collection_id is None:
            yield from emit(context, StepReport("not_found", None, {"collection": slug}))
            return
        attempt = steps.claim_collection(
            engine, collection_id, force=force, reopen=is_reexecution(context)
        )
    metadata = {
        "collection": slug,
        "collection_id": collection_id,
        "forced": force,
        "reason": attempt.reason,
    }
    claimed = attempt.outcome is ReconciliationOutcome.ADVANCED
    outcome = "claimed" if claimed else attempt.outcome.value
    yield from emit(context, StepReport(outcome, attempt.claim if claimed else None, metadata))


# --- prepare --------------------------------------------------------------------------------


def _advanced(step: StepResult, what: str, **metadata) -> StepReport:
    if step.outcome is ReconciliationOutcome.ADVANCED and step.claim is not None:
        return StepReport(what, step.claim, metadata)
    raise StepStopped(step.outcome.value, **metadata)


@leased_op(
    WORKFLOW,
    ReconciliationClaim,
    description="Begin the run (or restart it when the epoch or the media fields moved).",
)
def prepare_run(context: dg.OpExecutionContext, engine: Engine) -> Step:
    def step(claim: ReconciliationClaim) -> StepReport:
        prepared = steps.prepare_run(engine, claim)
        return _advanced(prepared, "prepared", restarted=prepared.restarted)

    return step


# --- scan pages -----------------------------------------------------------------------------


@leased_op(
    WORKFLOW,
    ReconciliationClaim,
    description="Enqueue work for every content id up to the captured upper bound, 50 per "
    "page, checkpointing each page and renewing the lease between pages.",
    config=PageBudget,
)
def scan_pages(context: dg.OpExecutionContext, engine: Engine, config: PageBudget) -> Step:
    def step(claim: ReconciliationClaim) -> StepReport:
        budget = Budget(config.max_pages, config.max_seconds)
        with logged_progress(context, "scan_pages", "pages") as progress:
            paging = walks.scan_pages(engine, claim, budget, progress=progress.counting(_paged))
        metadata = {
            "pages": paging.count(ScanOutcome.ADVANCED),
            "restarts": paging.count(ScanOutcome.RESTART_REQUIRED),
        }
        stop_unless_done(paging, **metadata)
        if paging.last is ScanOutcome.EXHAUSTED:
            return StepReport("exhausted", paging.lease, metadata)
        raise StepStopped(paging.last.value, **metadata)

    return step


def _paged(outcome) -> int:
    return 1 if outcome is ScanOutcome.ADVANCED else 0


# --- drain this collection's work -----------------------------------------------------------


@leased_op(
    WORKFLOW,
    ReconciliationClaim,
    description="Process this collection's due work so the work barrier clears within the run.",
    config=DrainBudget,
)
def drain_collection_work(
    context: dg.OpExecutionContext, engine: Engine, config: DrainBudget
) -> Step:
    def step(claim: ReconciliationClaim) -> StepReport:
        budget = Budget(max_seconds=config.max_seconds)
        with logged_progress(context, "drain_collection_work", "items") as progress:
            paging = walks.drain_collection_work(
                engine, claim, budget, config.batch_size, progress=progress.counting(_claimed)
            )
        counts = {
            "batches": len(paging.results),
            "completed": sum(batch.counts.completed for batch in paging.results),
        }
        stop_unless_done(paging, **counts)
        return StepReport("drained", paging.lease, counts)

    return step


# --- sources --------------------------------------------------------------------------------


@leased_op(
    WORKFLOW,
    ReconciliationClaim,
    description="Pass the work barrier into the sources phase, then enqueue work for canonical "
    "sources whose content is gone, 50 per page.",
    config=PageBudget,
)
def scan_sources(context: dg.OpExecutionContext, engine: Engine, config: PageBudget) -> Step:
    def step(claim: ReconciliationClaim) -> StepReport:
        entered = steps.enter_sources(engine, claim)
        if entered.restarted:
            _restart_later(engine, entered.claim)
        claim = _advanced(entered, "entered").lease
        budget = Budget(config.max_pages, config.max_seconds)
        with logged_progress(context, "scan_sources", "pages") as progress:
            paging = walks.source_pages(engine, claim, budget, progress=progress.counting(_paged))
        metadata = {"pages": paging.count(ScanOutcome.ADVANCED)}
        stop_unless_done(paging, **metadata)
        if paging.last is ScanOutcome.EXHAUSTED:
            return StepReport("exhausted", paging.lease, metadata)
        if paging.last is ScanOutcome.RESTART_REQUIRED:
            _restart_later(engine, paging.lease)
        raise StepStopped(paging.last.value, **metadata)

    return step


def _claimed(batch) -> int:
    return batch.counts.claimed


def _restart_later(engine: Engine, claim: ReconciliationClaim | None) -> NoReturn:
    """The epoch or the fields moved after the scan: the run restarted from a fresh scan, which
    an earlier op of the next run performs; hand the row back due at once."""
    if claim is not None:
        steps.release(engine, claim, CONTINUE_DELAY_SECONDS)
    raise StepStopped("restarted")


# --- finalize -------------------------------------------------------------------------------


@leased_op(
    WORKFLOW,
    ReconciliationClaim,
    description="Mark coverage complete (guarded by epoch, fingerprint, lease and an empty "
    "work barrier) and delete the coordinator row.",
)
def finalize_coverage(context: dg.OpExecutionContext, engine: Engine) -> Step:
    def step(claim: ReconciliationClaim) -> StepReport:
        finalized = steps.finalize(engine, claim)
        if finalized.restarted:
            _restart_later(engine, finalized.claim)
        if finalized.outcome is ReconciliationOutcome.COMPLETED:
            record_coverage(context, engine, claim.collection_id, claim.collection_slug)
            return StepReport("completed", None, {"collection": claim.collection_slug})
        raise StepStopped(finalized.outcome.value)

    return step
