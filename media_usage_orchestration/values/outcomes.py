"""What an operator retry did: one vocabulary for the work, reconciliation and deletion rows."""

from __future__ import annotations

from enum import StrEnum


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
