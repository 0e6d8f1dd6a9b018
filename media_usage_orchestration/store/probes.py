"""Bounded, indexed probes for sensors: does anything need a run, and what identifies it?

Each probe is one statement with small LIMITs over the due/lease indexes, so a sensor tick
stays far below Dagster's evaluation timeout whatever the table sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, select, union_all

from .clock import is_due
from .engine import read_transaction
from .schema import work


@dataclass(frozen=True)
class DueWork:
    """The earliest due work item: its identity changes whenever the due set moves on."""

    collection_id: str
    content_id: str
    work_version: int
    due_at: str


def _work_due_branch(state: str, column):
    return (
        select(
            work.c.collection_id,
            work.c.content_id,
            work.c.work_version,
            column.label("due_at"),
        )
        .where(work.c.state == state, column.is_not(None), is_due(column))
        .order_by(column, work.c.collection_id, work.c.content_id)
        .limit(1)
    )


def earliest_due_work(engine: Engine) -> DueWork | None:
    branches = [
        _work_due_branch("pending", work.c.next_attempt_at).subquery("pending_due"),
        _work_due_branch("retry", work.c.next_attempt_at).subquery("retry_due"),
        _work_due_branch("leased", work.c.lease_expires_at).subquery("lease_expired"),
    ]
    candidates = union_all(*(select(branch) for branch in branches)).subquery("candidates")
    statement = (
        select(candidates)
        .order_by(candidates.c.due_at, candidates.c.collection_id, candidates.c.content_id)
        .limit(1)
    )
    with read_transaction(engine) as connection:
        row = connection.execute(statement).first()
    return DueWork(row.collection_id, row.content_id, int(row.work_version), row.due_at) if row else None
