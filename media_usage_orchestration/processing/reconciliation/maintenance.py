"""The maintenance half of the reconciliation tick, for every coordinator at once."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from media_usage_orchestration.processing.reconciliation import machine
from media_usage_orchestration.processing.reconciliation.model import ReconciliationOutcome
from media_usage_orchestration.processing.work.processor import capture_is_active
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository

SETTLE_LIMIT = 100
SETTLE_COUNTS = ("obsolete_deleted", "failed_published", "failed_reset", "stuck_pinned", "seeded")


@dataclass(frozen=True)
class SettleResult:
    counts: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(SETTLE_COUNTS, 0))
    inactive: bool = False


def settle_reconciliations(engine: Engine, limit: int = SETTLE_LIMIT) -> SettleResult:
    """The maintenance half of the tick, for every coordinator at once (each loop bounded by
    `limit`): delete obsolete coordinators, publish or reset failed ones, pin stuck failures,
    seed every collection that needs a run."""
    if not capture_is_active(engine):
        return SettleResult(inactive=True)
    repository = ReconciliationRepository(engine)
    counts = dict.fromkeys(SETTLE_COUNTS, 0)
    counts["obsolete_deleted"] = _repeat(repository.delete_one_obsolete, limit)
    for record in repository.find_failed(limit):
        outcome = machine.settle_failed(repository, record)
        if outcome is ReconciliationOutcome.FAILED:
            counts["failed_published"] += 1
        elif outcome is ReconciliationOutcome.ADVANCED:
            counts["failed_reset"] += 1
    for record in repository.find_stuck_failed(limit):
        if repository.pin_stuck_failed_epoch(record.collection_id, record.run_token) is not None:
            counts["stuck_pinned"] += 1
    counts["seeded"] = _repeat(repository.seed_next_candidate, limit)
    return SettleResult(counts)


def _repeat(action: Callable[[], bool], limit: int) -> int:
    done = 0
    while done < limit and action():
        done += 1
    return done
