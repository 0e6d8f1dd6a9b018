"""Operator actions from the Launchpad: retry work, a stalled deletion, a failed
reconciliation. Each is EmDash's guarded operator retry (`processing/operator/actions.py`); none
steals a live lease.

The outcome is the `outcome` output's metadata and the run's `media_usage/outcome` tag, as for
every op that ends its run. Refusals that are not bad input (lease_active, conflict, not_found) end the
run successfully with that outcome: nothing was wrong with the request, the row was simply not
reopenable. Bad input fails the run at once (no retry) and changes nothing.
"""

import contextlib
from collections.abc import Iterator

import dagster as dg
from pydantic import Field

from media_usage_orchestration.assets.index import record_collection_by_slug
from media_usage_orchestration.dagster_kit.leased import StepReport, emit
from media_usage_orchestration.dagster_kit.outcomes import error_outcome
from media_usage_orchestration.dagster_kit.retries import (
    retries_transient_errors,
    retry_transient_errors_only,
)
from media_usage_orchestration.dagster_kit.run_tags import tag_run_collection
from media_usage_orchestration.ops.deletion import tombstone_slug
from media_usage_orchestration.processing.operator.actions import (
    MAX_LIMIT,
    RetryReport,
    retry_deletion,
    retry_failed_work,
    retry_reconciliation,
    retry_work_item,
)
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.values.errors import OperatorInputError

_OUTCOME_OUT = {"outcome": dg.Out(dg.Nothing, description="What the retry did (see metadata).")}


@contextlib.contextmanager
def _refusing_bad_input(context: dg.OpExecutionContext) -> Iterator[None]:
    """Bad input fails the run without retries (its outcome tag says why, e.g.
    `collection_not_found`); transient database errors are retried."""
    with retry_transient_errors_only(context):
        try:
            yield
        except OperatorInputError as error:
            raise dg.Failure(
                description=str(error),
                metadata={"code": error.code, "outcome": error_outcome(error)},
                allow_retries=False,
            ) from None


def _single_report(report: RetryReport, **identity: str) -> StepReport:
    metadata: dict = {**identity, "changed": report.changed}
    if report.lease_expires_at is not None:
        metadata["lease_expires_at"] = report.lease_expires_at
    return StepReport(report.outcome.value, None, metadata)


class RetryFailedWorkConfig(dg.Config):
    collection: str = Field(description="Slug of the collection whose work to retry.")
    content_id: str | None = Field(
        default=None,
        description="The one entry to retry (its work is reopened, or created if absent). "
        "Leave unset to retry every failed entry of the collection, at most `limit`.",
    )
    limit: int = Field(
        default=MAX_LIMIT,
        description=f"Without content_id: failed entries retried by this run, 1 to {MAX_LIMIT} "
        "(the newest failures first; the metadata says whether more remain).",
    )


@dg.op(
    out=_OUTCOME_OUT,
    description="Reopen an entry's work, or every failed entry's, as pending at a new coverage "
    "epoch (version + 1, attempts cleared) so it is processed again.",
)
@retries_transient_errors
def reopen_failed_work(
    context: dg.OpExecutionContext, config: RetryFailedWorkConfig, database: MediaUsageDatabase
):
    tag_run_collection(context, config.collection)
    with _refusing_bad_input(context):
        if config.content_id is None:
            bulk = retry_failed_work(database.engine, config.collection, limit=config.limit)
            metadata = {**bulk.counts, "changed": bulk.changed, "more_failed": bulk.more_failed}
            report = StepReport(bulk.outcome, None, {"collection": config.collection, **metadata})
        else:
            single = retry_work_item(database.engine, config.collection, config.content_id)
            report = _single_report(
                single, collection=config.collection, content_id=config.content_id
            )
        record_collection_by_slug(
            context, database.engine, config.collection, operator_retry="work"
        )
    yield from emit(context, report)


class RetryDeletionConfig(dg.Config):
    collection_id: str | None = Field(
        default=None,
        description="Immutable id of the collection being deleted (set this or `collection`).",
    )
    collection: str | None = Field(
        default=None,
        description="Slug of the collection being deleted (set this or `collection_id`).",
    )


@dg.op(
    out=_OUTCOME_OUT,
    description="Reopen a failed, backing-off or abandoned deletion tombstone in its phase.",
)
@retries_transient_errors
def reopen_collection_deletion(
    context: dg.OpExecutionContext, config: RetryDeletionConfig, database: MediaUsageDatabase
):
    with _refusing_bad_input(context):
        slug = config.collection or tombstone_slug(database.engine, config.collection_id)
        tag_run_collection(context, slug)
        result = retry_deletion(
            database.engine, collection_id=config.collection_id, collection=config.collection
        )
    named = {"collection_id": config.collection_id, "collection": config.collection}
    identity = {key: value for key, value in named.items() if value is not None}
    yield from emit(context, _single_report(result, **identity))


class RetryReconciliationConfig(dg.Config):
    collection: str = Field(description="Slug of the collection whose reconciliation to retry.")


@dg.op(
    out=_OUTCOME_OUT,
    description="Reopen a failed (or backing-off, or abandoned) reconciliation as a fresh scan.",
)
@retries_transient_errors
def reopen_reconciliation(
    context: dg.OpExecutionContext, config: RetryReconciliationConfig, database: MediaUsageDatabase
):
    tag_run_collection(context, config.collection)
    with _refusing_bad_input(context):
        result = retry_reconciliation(database.engine, config.collection)
        record_collection_by_slug(
            context, database.engine, config.collection, operator_retry="reconciliation"
        )
    yield from emit(context, _single_report(result, collection=config.collection))
