"""Operator actions from the Launchpad: retry failed work, a stalled deletion, a failed
reconciliation. Each is EmDash's guarded operator retry; none steals a live lease."""

import dagster as dg
from pydantic import Field

from ..ops.reconciliation import collection_id_for
from ..resources.database import MediaUsageDatabase
from ..store.deletions import DeletionRepository
from ..store.deletions import RetryOutcome as DeletionRetryOutcome
from ..store.identifiers import validate_identifier
from ..store.reconciliations import OperatorRetryOutcome as ReconciliationRetryOutcome
from ..store.reconciliations import ReconciliationRepository
from ..store.records import LeaseState
from ..store.work import OperatorRetryOutcome as WorkRetryOutcome
from ..store.work import WorkRepository
from .common import TRANSIENT_RETRY_POLICY, retry_transient_errors_only


class RetryFailedWorkConfig(dg.Config):
    collection: str = Field(description="Slug of the collection whose failed work to retry.")
    content_ids: list[str] = Field(
        default_factory=list, description="Entries to retry; empty means every failed entry."
    )
    limit: int = Field(default=100, ge=1, le=100, description="Failed entries per run.")


def _refuse(message: str, **metadata) -> dg.Failure:
    return dg.Failure(message, metadata=metadata, allow_retries=False)


@dg.op(
    out=dg.Out(dg.Nothing),
    retry_policy=TRANSIENT_RETRY_POLICY,
    description="Reopen failed work (version + 1, coverage invalidated) so it is processed again.",
)
def reopen_failed_work(
    context: dg.OpExecutionContext, config: RetryFailedWorkConfig, database: MediaUsageDatabase
):
    validate_identifier(config.collection, "collection slug")
    repository = WorkRepository(database.engine)
    with retry_transient_errors_only():
        collection_id = collection_id_for(database.engine, config.collection)
        if collection_id is None:
            raise _refuse(f"Collection {config.collection!r} does not exist")
        content_ids = config.content_ids or _failed_content_ids(repository, config)
        counts: dict[str, int] = {}
        for content_id in content_ids:
            result = repository.retry_operator_work(collection_id, content_id)
            key = _work_outcome(result.outcome, result.changed)
            counts[key] = counts.get(key, 0) + 1
    context.log.info(f"retried {len(content_ids)} work items of {config.collection!r}: {counts}")
    yield dg.Output(None, metadata={"collection": config.collection, **counts})


def _failed_content_ids(repository: WorkRepository, config: RetryFailedWorkConfig) -> list[str]:
    page = repository.find_operator_page(
        config.collection, state=LeaseState.FAILED, limit=config.limit
    )
    return [item.content_id for item in page.items] if page else []


def _work_outcome(outcome: WorkRetryOutcome, changed: bool) -> str:
    if outcome is WorkRetryOutcome.PENDING:
        return "reopened" if changed else "already_pending"
    return outcome.value


class RetryDeletionConfig(dg.Config):
    collection_id: str = Field(description="Immutable id of the collection being deleted.")


@dg.op(
    out=dg.Out(dg.Nothing),
    retry_policy=TRANSIENT_RETRY_POLICY,
    description="Reopen a failed, backing-off or abandoned deletion tombstone in its phase.",
)
def reopen_collection_deletion(
    context: dg.OpExecutionContext, config: RetryDeletionConfig, database: MediaUsageDatabase
):
    with retry_transient_errors_only():
        result = DeletionRepository(database.engine).retry_operator_deletion(config.collection_id)
    metadata = {"outcome": result.outcome.value, "collection_id": config.collection_id}
    if result.outcome is DeletionRetryOutcome.NOT_FOUND:
        raise _refuse(f"No deletion tombstone for collection {config.collection_id!r}", **metadata)
    if result.outcome is DeletionRetryOutcome.LEASE_ACTIVE:
        metadata["lease_expires_at"] = result.lease_expires_at
    context.log.info(f"deletion retry: {result.outcome.value}")
    yield dg.Output(None, metadata=metadata)


class RetryReconciliationConfig(dg.Config):
    collection: str = Field(description="Slug of the collection whose reconciliation to retry.")


@dg.op(
    out=dg.Out(dg.Nothing),
    retry_policy=TRANSIENT_RETRY_POLICY,
    description="Reopen a failed (or backing-off, or abandoned) reconciliation as a fresh scan.",
)
def reopen_reconciliation(
    context: dg.OpExecutionContext, config: RetryReconciliationConfig, database: MediaUsageDatabase
):
    with retry_transient_errors_only():
        collection_id = collection_id_for(database.engine, config.collection)
        if collection_id is None:
            raise _refuse(f"Collection {config.collection!r} does not exist")
        result = ReconciliationRepository(database.engine).retry_failed_by_operator(collection_id)
    metadata = {"outcome": result.outcome.value, "collection": config.collection}
    if result.outcome is ReconciliationRetryOutcome.LEASE_ACTIVE:
        metadata["lease_expires_at"] = result.lease_expires_at
    context.log.info(f"reconciliation retry of {config.collection!r}: {result.outcome.value}")
    yield dg.Output(None, metadata=metadata)
