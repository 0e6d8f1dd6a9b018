"""Run leases (`_muo_run_leases`): which Dagster runs executing against this database are alive.

A run worker takes its run's lease when its run starts and renews it every few seconds while
its process lives (`processing/loop/run_heartbeat.py`); it gives it up when the run ends. A worker
that dies (SIGKILL, OOM, its container or its code server gone) stops renewing, and its lease
expires on the database clock. The run-health sensor reads the leases of the runs Dagster
still records in flight and fails those whose lease expired, so a dead run never holds its
collection's place in the run queue.

Every write names the lease by its run id and token, and a renewal also requires the lease to
be live: an expired lease is never revived, so a worker that stalled past its lease and woke
again cannot undo the verdict that its run is dead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, and_, delete, select, update
from ulid import ULID

from media_usage_orchestration.store.core.clock import (
    lease_live_at_clock,
    now,
    timestamp_offset,
    validate_duration,
)
from media_usage_orchestration.store.core.engine import read_transaction, single_statement
from media_usage_orchestration.store.core.id_lists import in_text_list
from media_usage_orchestration.store.core.schema import dialect_insert, run_leases

# Expired leases of dead runs are deleted this long after they expired (the sensor needs them
# only while Dagster still records the run in flight), a bounded batch at a time.
PRUNE_AFTER_SECONDS = 24 * 60 * 60
PRUNE_BATCH = 100


@dataclass(frozen=True)
class RunLease:
    """A run's lease as this worker holds it."""

    run_id: str
    lease_token: str


@dataclass(frozen=True)
class RunLeaseState:
    """A run's lease as the database holds it now: `live` on the database clock."""

    run_id: str
    job_name: str
    heartbeat_at: str
    lease_expires_at: str
    live: bool


def _validated(run_id: str, lease_seconds: int) -> None:
    if not isinstance(run_id, str) or not run_id.strip():
        raise ValueError("A run lease needs a run id")
    validate_duration(lease_seconds, "Run lease duration", allow_zero=False)


def begin_run_lease(
    engine: Engine, run_id: str, job_name: str, lease_seconds: int
) -> RunLease | None:
    """Take the run's lease for `lease_seconds`; None when the run already has one (a second
    worker of the same run: the first keeps it)."""
    _validated(run_id, lease_seconds)
    token = str(ULID())
    with single_statement(engine) as connection:
        statement = (
            dialect_insert(connection, run_leases)
            .values(
                run_id=run_id,
                job_name=job_name,
                lease_token=token,
                started_at=now(),
                heartbeat_at=now(),
                lease_expires_at=timestamp_offset(lease_seconds),
            )
            .on_conflict_do_nothing()
            .returning(run_leases.c.run_id)
        )
        taken = connection.execute(statement).first() is not None
    return RunLease(run_id, token) if taken else None


def _held(lease: RunLease):
    return and_(run_leases.c.run_id == lease.run_id, run_leases.c.lease_token == lease.lease_token)


def renew_run_lease(engine: Engine, lease: RunLease, lease_seconds: int) -> bool:
    """Extend the lease by `lease_seconds` from now, only while it is still live and ours."""
    _validated(lease.run_id, lease_seconds)
    with single_statement(engine) as connection:
        renewed = connection.execute(
            update(run_leases)
            .where(_held(lease), lease_live_at_clock(run_leases.c.lease_expires_at))
            .values(heartbeat_at=now(), lease_expires_at=timestamp_offset(lease_seconds))
            .returning(run_leases.c.run_id)
        ).first()
    return renewed is not None


def end_run_lease(engine: Engine, lease: RunLease) -> bool:
    """Give the lease up when the run ends (whether or not it is still live)."""
    with single_statement(engine) as connection:
        ended = connection.execute(
            delete(run_leases).where(_held(lease)).returning(run_leases.c.run_id)
        ).first()
    return ended is not None


def prune_expired_run_leases(engine: Engine, after_seconds: int = PRUNE_AFTER_SECONDS) -> int:
    """Delete at most `PRUNE_BATCH` leases that expired more than `after_seconds` ago (dead
    runs that were judged long since); how many were deleted."""
    validate_duration(after_seconds, "Run lease retention", allow_zero=True)
    stale = (
        select(run_leases.c.run_id)
        .where(run_leases.c.lease_expires_at < timestamp_offset(-after_seconds))
        .order_by(run_leases.c.lease_expires_at)
        .limit(PRUNE_BATCH)
    )
    with single_statement(engine) as connection:
        deleted = connection.execute(
            delete(run_leases)
            .where(
                run_leases.c.run_id.in_(stale.scalar_subquery()),
                run_leases.c.lease_expires_at < timestamp_offset(-after_seconds),
            )
            .returning(run_leases.c.run_id)
        ).all()
    return len(deleted)


def read_run_leases(engine: Engine, run_ids: Sequence[str]) -> dict[str, RunLeaseState]:
    """The leases of these runs (those that have one), each judged live or expired now."""
    if not run_ids:
        return {}
    statement = select(
        run_leases.c.run_id,
        run_leases.c.job_name,
        run_leases.c.heartbeat_at,
        run_leases.c.lease_expires_at,
        lease_live_at_clock(run_leases.c.lease_expires_at).label("live"),
    ).where(in_text_list(run_leases.c.run_id, "run_ids"))
    with read_transaction(engine) as connection:
        rows = connection.execute(statement, {"run_ids": list(run_ids)}).all()
    return {
        row.run_id: RunLeaseState(
            row.run_id, row.job_name, row.heartbeat_at, row.lease_expires_at, bool(row.live)
        )
        for row in rows
    }


def database_now(engine: Engine) -> str:
    """The database's clock as sortable text (what a lease is compared with)."""
    with read_transaction(engine) as connection:
        return connection.execute(select(now().label("now"))).scalar_one()


__all__ = [
    "PRUNE_AFTER_SECONDS",
    "RunLease",
    "RunLeaseState",
    "begin_run_lease",
    "database_now",
    "end_run_lease",
    "prune_expired_run_leases",
    "read_run_leases",
    "renew_run_lease",
]
