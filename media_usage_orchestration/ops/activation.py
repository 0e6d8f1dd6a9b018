"""The activation op: `expanded -> activating -> active`, one lease-guarded step per collection."""

import dagster as dg

from media_usage_orchestration.assets.index import record_collection_by_slug
from media_usage_orchestration.dagster_kit.retries import (
    retries_transient_errors,
    retry_transient_errors_only,
)
from media_usage_orchestration.dagster_kit.run_tags import tag_run_outcome
from media_usage_orchestration.processing.activation.capture import ActivationOutcome, activate_step
from media_usage_orchestration.resources.database import MediaUsageDatabase

MAX_ACTIVATION_STEPS = 100_000


@dg.op(
    out=dg.Out(dg.Nothing),
    description="Install capture on every collection, one lease-guarded step per collection, "
    "then mark capture active.",
)
@retries_transient_errors
def activate_capture(context: dg.OpExecutionContext, database: MediaUsageDatabase):
    activated: list[str] = []
    with retry_transient_errors_only(context):
        for _ in range(MAX_ACTIVATION_STEPS):
            result = activate_step(database.engine)
            for slug in result.processed_collections:
                activated.append(slug)
                context.log.info(f"capture active for collection {slug!r}")
            if result.outcome is ActivationOutcome.LEASE_ACTIVE:
                raise dg.Failure(
                    f"Another activation holds the lease until {result.lease_expires_at}",
                    metadata={"outcome": result.outcome.value},
                    allow_retries=False,
                )
            if result.outcome is ActivationOutcome.CONFLICT:
                raise dg.Failure(
                    "Activation lost its lease to another owner",
                    metadata={"outcome": result.outcome.value},
                    allow_retries=False,
                )
            if result.outcome is ActivationOutcome.ACTIVE:
                break
        else:
            raise dg.Failure(
                "Activation did not finish within its step budget",
                metadata={"outcome": "step_budget_exhausted"},
            )
        for slug in activated:
            record_collection_by_slug(context, database.engine, slug, activation="active")
    tag_run_outcome(context, ActivationOutcome.ACTIVE.value)
    yield dg.Output(
        None,
        metadata={
            "outcome": ActivationOutcome.ACTIVE.value,
            "collections_activated": len(activated),
            "collections": ", ".join(activated) or "-",
        },
    )
