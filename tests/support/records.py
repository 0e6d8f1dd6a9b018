"""Claimed records built without a database, as the repositories return them: the unit tier
hands them to repository methods whose bad input must be refused before any SQL."""

from __future__ import annotations

from typing import Any

from media_usage_orchestration.store.core.schema import collection_deletions, reconciliations
from media_usage_orchestration.store.deletion.records import DeletionClaim
from media_usage_orchestration.store.reconciliation.records import ReconciliationClaim
from tests.support.factories import FUTURE, PAST, deletion_row, reconciliation_row

STAMP = "2026-08-06T12:00:00.000Z"


def _all_columns(table, row: dict[str, Any]) -> dict[str, Any]:
    """Every column of `table`: the row's values, NULL for the others, a fixed time for the
    timestamps the database would have set."""
    values = dict.fromkeys(table.c.keys())
    values.update(created_at=STAMP, updated_at=STAMP, attempt_count=0)
    values.update(row)
    return values


def reconciliation_claim(**overrides: Any) -> ReconciliationClaim:
    """A reconciliation claimed in its scan phase under a live lease."""
    row = reconciliation_row(
        state="leased",
        target_epoch=1,
        lease_token="reconciliation-lease",
        lease_expires_at=FUTURE,
        next_attempt_at=PAST,
        **overrides,
    )
    return ReconciliationClaim.from_row(_all_columns(reconciliations, row))


def deletion_claim(**overrides: Any) -> DeletionClaim:
    """A collection-deletion tombstone claimed under a live lease."""
    row = deletion_row(
        state="leased",
        lease_token="deletion-lease",
        lease_expires_at=FUTURE,
        next_attempt_at=PAST,
        **overrides,
    )
    return DeletionClaim.from_row(_all_columns(collection_deletions, row))
