"""What an operator retry did: one vocabulary for the work, reconciliation and deletion rows."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

Row = TypeVar("Row")


class OperatorRetryOutcome(StrEnum):
    """The seeds' operator retry outcomes (the reconciliation retry, beyond the seeds, uses the
    same ones)."""

    PENDING = "pending"  # the row is pending and due; `changed` says whether the retry did it
    LEASE_ACTIVE = "lease_active"  # a live lease holds the row: never taken, only its expiry shown
    CONFLICT = "conflict"  # the row exists but is not in a state a retry reopens
    NOT_FOUND = "not_found"  # no such row
    # The work seed's own outcome: the collection is registered but its capture is not active.
    COLLECTION_NOT_FOUND = "collection_not_found"

    @property
    def reported(self) -> OperatorRetryOutcome:
        """The outcome operators see: the work seed's `collection_not_found` is `not_found`."""
        if self is OperatorRetryOutcome.COLLECTION_NOT_FOUND:
            return OperatorRetryOutcome.NOT_FOUND
        return self


# Every outcome an operator retry reports (`reported` never gives another).
REPORTED_RETRY_OUTCOMES = (
    OperatorRetryOutcome.PENDING,
    OperatorRetryOutcome.LEASE_ACTIVE,
    OperatorRetryOutcome.CONFLICT,
    OperatorRetryOutcome.NOT_FOUND,
)


@dataclass(frozen=True)
class OperatorRetryResult(Generic[Row]):
    """What one operator retry did, for a work item, a reconciliation or a tombstone alike.

    `changed`: whether this retry reopened the row (a `pending` row it found already queued is
    unchanged); `row`: the row as the retry left it or found it, where the workflow reports
    one; `lease_expires_at`: the live lease's expiry when `lease_active` (never taken)."""

    outcome: OperatorRetryOutcome
    changed: bool = False
    row: Row | None = None
    lease_expires_at: str | None = None
