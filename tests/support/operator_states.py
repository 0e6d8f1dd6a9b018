"""States the operator verbs and jobs act on, built directly (leases are live or backdated,
never waited for). Shared by the command-line and the Dagster operator tests."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, update

from media_usage_orchestration.emdash_double.cms_writer import Collection
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.deletion.records import DeletionClaim, DeletionPhase
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from media_usage_orchestration.store.reconciliation.records import ReconciliationClaim
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from media_usage_orchestration.store.work.records import WorkRecord
from media_usage_orchestration.store.work.repository import WorkRepository
from tests.support.deletions import tombstone
from tests.support.factories import failed, insert_work, of
from tests.support.states import backdate, make_collection, one, set_activation
from tests.support.work import after_epoch_bump

LIVE_LEASE_SECONDS = 300
FAILED_CODE = "MEDIA_USAGE_SNAPSHOT_FAILED"


# --- work ---------------------------------------------------------------------------------------


def work_of(engine: Engine, collection: Collection, content_id: str, state: str, **values: Any):
    return insert_work(
        engine, **of(collection), content_id=content_id, change_epoch=0, state=state, **values
    )


def failed_work(engine: Engine, collection: Collection, content_id: str) -> dict[str, Any]:
    return work_of(engine, collection, content_id, **failed(FAILED_CODE))


def leased_work(engine: Engine, collection: Collection, content_id: str) -> WorkRecord:
    """Work a worker holds under a live lease."""
    work_of(engine, collection, content_id, "pending")
    claimed = WorkRepository(engine).claim_work(collection.id, content_id, 1, LIVE_LEASE_SECONDS)
    assert claimed is not None and claimed.lease_token
    return claimed


def expire_work_lease(engine: Engine, collection: Collection, content_id: str) -> None:
    table = schema.work
    assert backdate(
        engine, table, "lease_expires_at", 1, collection_id=collection.id, content_id=content_id
    )


def removed_during_retry(db, content_id: str) -> None:
    """A concurrent writer deletes the entry's work between the retry's coverage bump and its
    reopen: the retry reports conflict."""
    after_epoch_bump(
        db,
        "operator_retry_removal_race",
        "DELETE FROM _emdash_media_usage_work WHERE collection_id = NEW.collection_id "
        f"AND content_id = '{content_id}'",
    )


def work_row(engine: Engine, collection: Collection, content_id: str) -> dict[str, Any] | None:
    return one(engine, schema.work, collection_id=collection.id, content_id=content_id)


# --- collection deletions -----------------------------------------------------------------------


def failed_tombstone(
    engine: Engine, collection: Collection, phase: DeletionPhase = DeletionPhase.SOURCES
) -> None:
    tombstone(engine, collection, phase, force=True)
    table = schema.collection_deletions
    with engine.begin() as connection:
        connection.execute(
            update(table).where(table.c.collection_id == collection.id).values(**failed("X_FAILED"))
        )


def leased_tombstone(engine: Engine, collection: Collection) -> DeletionClaim:
    tombstone(engine, collection, DeletionPhase.WORK, force=True)
    claim = DeletionRepository(engine).claim(collection.id, DeletionPhase.WORK, LIVE_LEASE_SECONDS)
    assert claim is not None
    return claim


# --- reconciliations ----------------------------------------------------------------------------


def seeded_reconciliation(engine: Engine, slug: str = "articles") -> Collection:
    """A collection with untrusted coverage and its pending reconciliation, capture active."""
    collection = make_collection(engine, slug)
    set_activation(engine)
    assert ReconciliationRepository(engine).seed_collection(collection.id)
    return collection


def reconciliation_row(engine: Engine, collection: Collection) -> dict[str, Any]:
    row = one(engine, schema.reconciliations, collection_id=collection.id)
    assert row is not None
    return row


def leased_reconciliation(engine: Engine, collection: Collection) -> ReconciliationClaim:
    run_token = reconciliation_row(engine, collection)["run_token"]
    claim = ReconciliationRepository(engine).claim(collection.id, run_token, LIVE_LEASE_SECONDS)
    assert claim is not None
    return claim


def fail_reconciliation(engine: Engine, collection: Collection) -> None:
    table = schema.reconciliations
    with engine.begin() as connection:
        connection.execute(
            update(table)
            .where(table.c.collection_id == collection.id)
            .values(**failed("MEDIA_USAGE_RECONCILIATION_FAILED"))
        )
