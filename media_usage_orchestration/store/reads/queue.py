"""Each live collection's work queue as operators watch it (the queue sensor observes it): how
many items are due, backing off, leased, stuck and failed, how long the first due item has
waited, and the newest failed items.

One classification, the lease vocabulary's (`core/leases.py`), as the work sensor, the claim,
`media-usage status` and `work list` use it. A work row is exactly one of
- due: claimable now (`is_claimable`): a pending or retry row whose next attempt has come, or
  a leased row whose lease expired;
- backing off: a pending or retry row whose next attempt is still ahead;
- leased: held under a live lease (an expiry never set is never treated as expired);
- failed: failed for good, waiting for an operator's retry;
and `stuck` counts the due rows whose lease expired (the status verb's stuck work: nobody is
processing them until the next claim takes them over). Due is judged at statement time, as the
claim judges it.

The cost does not grow with the backlog. Every count reads at most `COUNT_LIMIT` + 1 entries of
one index range, index-only: a state's rows of the collection through the operator index
(collection, state, updated_at, content id), and the time splits through the due index (state,
next attempt, ..., collection) and the lease index (state, lease expiry, collection, ...),
whose ranges hold only the rows the claim takes next. A count that reaches the limit stops
there: the numbers built from it are not exact, and `inexact` names them. The age of the first
due item is the work sensor's (`probes.first_due_row`: the row the next claim takes first, per
due state), in database time. No statement writes; one read transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, exists, func, literal, select

from media_usage_orchestration.store.core.clock import is_due, seconds_between, statement_now
from media_usage_orchestration.store.core.engine import read_transaction
from media_usage_orchestration.store.core.leases import LeaseState, bounded_limit, lease_has_expired
from media_usage_orchestration.store.core.schema import collection_deletions, collections, work
from media_usage_orchestration.store.host.registry import RegisteredCollection
from media_usage_orchestration.store.reads.probes import first_due_row
from media_usage_orchestration.store.work.records import OperatorWorkItem, records_of
from media_usage_orchestration.store.work.statements import operator_rows_statement

COUNT_LIMIT = 500
MAX_QUEUE_COLLECTIONS = 100
FAILED_ITEMS_SHOWN = 20
QUEUE_COUNTS = ("due", "backing_off", "leased", "stuck", "failed")

_DUE_STATES = (LeaseState.PENDING, LeaseState.RETRY, LeaseState.LEASED)
# Each count's index order: the order of the index range it reads, so the planner walks that
# index and stops at the limit instead of collecting and sorting every matching row.
_OPERATOR_ORDER = (work.c.updated_at, work.c.content_id)
_DUE_ORDER = (work.c.next_attempt_at, work.c.updated_at, work.c.collection_id, work.c.content_id)
_LEASE_ORDER = (work.c.lease_expires_at, work.c.collection_id, work.c.content_id)
# What each queue count is made of: + and - raw counts (the raw counts are named below).
_FORMULAS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "due": (("pending", "retry_due", "stuck"), ("pending_ahead",)),
    "backing_off": (("pending_ahead", "retry"), ("retry_due",)),
    "leased": (("leased",), ("stuck",)),
    "stuck": (("stuck",), ()),
    "failed": (("failed",), ()),
}


@dataclass(frozen=True)
class WorkQueue:
    """One collection's queue. `first_due_at` is when the item the next claim takes first
    became due (None when nothing is due) and `lag_seconds` its age in database time;
    `failed_items` the newest failures (at most `FAILED_ITEMS_SHOWN`); `inexact` the counts
    built from a state with more than `COUNT_LIMIT` rows."""

    collection_id: str
    collection_slug: str
    due: int
    backing_off: int
    leased: int
    stuck: int
    failed: int
    first_due_at: str | None
    lag_seconds: float
    failed_items: tuple[OperatorWorkItem, ...] = ()
    inexact: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        """Nothing failed for good, nothing stuck behind an expired lease."""
        return self.failed == 0 and self.stuck == 0

    def counts(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in QUEUE_COUNTS}


@dataclass(frozen=True)
class QueueReading:
    """Every live collection's queue (the first `MAX_QUEUE_COLLECTIONS` by slug), read at
    `read_at` (database time)."""

    read_at: str
    queues: tuple[WorkQueue, ...]


def read_work_queues(engine: Engine, limit: int = MAX_QUEUE_COLLECTIONS) -> QueueReading:
    """The queues of the live collections (registered, no deletion tombstone), by slug: one
    statement for the counts, one more per collection with failed work for its newest items."""
    limit = bounded_limit(
        limit,
        1,
        MAX_QUEUE_COLLECTIONS,
        f"Queue collection limit must be from 1 to {MAX_QUEUE_COLLECTIONS}",
    )
    with read_transaction(engine) as connection:
        rows = connection.execute(_queue_statement(limit)).all()
        read_at = rows[0].read_at if rows else connection.execute(select(statement_now())).scalar()
        queues = tuple(_queue(connection, row) for row in rows)
    return QueueReading(read_at=read_at, queues=queues)


def _queue(connection: Connection, row) -> WorkQueue:
    raw = {name: getattr(row, name) for name in _RAW_COUNTS}
    firsts = [getattr(row, f"first_{state.value}") for state in _DUE_STATES]
    due_times = [first.split("|", 1)[0] for first in firsts if first is not None]
    first_due_at = min(due_times) if due_times else None
    lag = seconds_between(first_due_at, row.read_at) if first_due_at else None
    counts, inexact = _queue_counts(raw)
    failed_items = ()
    if counts["failed"]:
        collection = RegisteredCollection(row.collection_id, row.collection_slug)
        failed_items = _newest_failed(connection, collection)
    return WorkQueue(
        collection_id=row.collection_id,
        collection_slug=row.collection_slug,
        **counts,
        first_due_at=first_due_at,
        lag_seconds=round(max(lag or 0.0, 0.0), 3),
        failed_items=failed_items,
        inexact=inexact,
    )


def _queue_counts(raw: Mapping[str, int]) -> tuple[dict[str, int], tuple[str, ...]]:
    """The queue's counts from the raw (limited) ones, and which of them are not exact."""
    at_limit = {name for name, value in raw.items() if value > COUNT_LIMIT}
    counts, inexact = {}, []
    for name, (added, subtracted) in _FORMULAS.items():
        value = sum(raw[part] for part in added) - sum(raw[part] for part in subtracted)
        counts[name] = max(value, 0)
        if at_limit.intersection(added + subtracted):
            inexact.append(name)
    return counts, tuple(inexact)


def _newest_failed(
    connection: Connection, collection: RegisteredCollection
) -> tuple[OperatorWorkItem, ...]:
    """What `work list --state failed` shows first: the newest failures, through the operator
    index."""
    statement = operator_rows_statement(
        collection.id, collection.slug, LeaseState.FAILED, FAILED_ITEMS_SHOWN, None
    )
    records = records_of(connection.execute(statement))
    return tuple(OperatorWorkItem.from_record(record) for record in records[:FAILED_ITEMS_SHOWN])


# --- the statement ------------------------------------------------------------------------------


def _raw_counts(live) -> dict:
    """The limited counts of one collection (`live.c.id`), each one index range."""
    state = work.c.state
    return {
        "pending": _limited_count(live, _OPERATOR_ORDER, state == LeaseState.PENDING.value),
        "retry": _limited_count(live, _OPERATOR_ORDER, state == LeaseState.RETRY.value),
        "leased": _limited_count(live, _OPERATOR_ORDER, state == LeaseState.LEASED.value),
        "failed": _limited_count(live, _OPERATOR_ORDER, state == LeaseState.FAILED.value),
        # pending rows whose next attempt is still ahead (EmDash writes them due: normally none)
        "pending_ahead": _limited_count(
            live, _DUE_ORDER, state == LeaseState.PENDING.value, ~is_due(work.c.next_attempt_at)
        ),
        "retry_due": _limited_count(
            live, _DUE_ORDER, state == LeaseState.RETRY.value, is_due(work.c.next_attempt_at)
        ),
        "stuck": _limited_count(
            live, _LEASE_ORDER, state == LeaseState.LEASED.value, lease_has_expired(work)
        ),
    }


_RAW_COUNTS = ("pending", "retry", "leased", "failed", "pending_ahead", "retry_due", "stuck")


def _limited_count(live, order, *conditions):
    """How many of the collection's rows match, reading at most `COUNT_LIMIT` + 1 of them."""
    rows = (
        select(literal(1).label("found"))
        .where(work.c.collection_id == live.c.id, *conditions)
        .order_by(*order)
        .limit(COUNT_LIMIT + 1)
        .correlate(live)
        .subquery("limited")
    )
    return select(func.count()).select_from(rows).scalar_subquery()


@functools.lru_cache(maxsize=8)
def _queue_statement(limit: int):
    """Built once per limit (the sensor asks every tick; times are the database's, evaluated
    when it runs)."""
    tombstoned = exists().where(collection_deletions.c.collection_slug == collections.c.slug)
    live = (
        select(collections.c.id, collections.c.slug)
        .where(~tombstoned)
        .order_by(collections.c.slug)
        .limit(limit)
        .subquery("live")
    )
    raw = _raw_counts(live)
    return select(
        live.c.id.label("collection_id"),
        live.c.slug.label("collection_slug"),
        *(raw[name].label(name) for name in _RAW_COUNTS),
        *(first_due_row(state, live.c.id).label(f"first_{state.value}") for state in _DUE_STATES),
        statement_now().label("read_at"),
    ).order_by(live.c.slug)


__all__ = [
    "COUNT_LIMIT",
    "FAILED_ITEMS_SHOWN",
    "MAX_QUEUE_COLLECTIONS",
    "QUEUE_COUNTS",
    "QueueReading",
    "WorkQueue",
    "read_work_queues",
]
