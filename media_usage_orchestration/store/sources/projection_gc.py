"""The projection GC's statements (EmDash's `claimMediaUsageCleanup` and `delete*OlderThan`).

One task row, `_emdash_media_usage_cleanup.projection_gc`, makes a GC pass single-flight: a pass
claims it with a lease token, and every later statement of the pass re-asserts that token and a
live lease in its own WHERE clause (on PostgreSQL holding the row `FOR UPDATE`, which source
writes wait for through the fence's `FOR SHARE` triggers). Occurrences are reaped in three
kinds, each only below the sweep's cutoff (claim time minus the safety window) and only while
no live generation-write lease covers their generation:

- orphan: no source row with its source key;
- stale: not its source's current generation and created before the source was last indexed;
- abandoned: not current and created at or after that (a publication that never landed).

Rows are first marked with the lease token and then deleted by id with the same guards plus
the mark, so the fence trigger raises the generation floor for exactly what the GC removed.
Database time only: every timestamp is computed by the statement that uses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    Engine,
    and_,
    case,
    delete,
    exists,
    literal,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from media_usage_orchestration.store.core.clock import (
    is_due_at_clock,
    lease_live_at_clock,
    timestamp_offset,
    validate_duration,
)
from media_usage_orchestration.store.core.engine import is_postgres, read_transaction
from media_usage_orchestration.store.core.schema import (
    CLEANUP_TASK_KEY,
    cleanup,
    generation_writes,
    occurrences,
    sources,
)
from media_usage_orchestration.values.records import record_from_row

# EmDash binds at most 50 values a statement; the lease guard takes three of them.
DELETE_BATCH_SIZE = 47


class GcTarget(StrEnum):
    ORPHAN = "orphan"
    STALE = "stale"
    ABANDONED = "abandoned"


@dataclass(frozen=True)
class GcCursor:
    created_at: str
    id: str


@dataclass(frozen=True)
class GcClaim:
    lease_token: str
    cursor: GcCursor | None
    claimed_at: str
    scan_before_at: str
    consecutive_failures: int


@dataclass(frozen=True)
class GcCandidate:
    id: str
    source_key: str
    generation: str
    created_at: str
    current_generation: str | None
    indexed_at: str | None
    write_lease_expires_at: str | None


@dataclass(frozen=True)
class GcCounters:
    candidate_count: int = 0
    deleted_orphans: int = 0
    deleted_stale: int = 0
    deleted_abandoned: int = 0
    deleted_write_leases: int = 0
    backlog_lower_bound: int = 0
    scan_has_more: bool = False
    duration_ms: int = 0


@dataclass(frozen=True)
class GcTaskRow:
    """The task row as operators see it (never its lease token)."""

    leased: bool
    lease_expires_at: str | None
    next_eligible_at: str
    cursor: GcCursor | None
    scan_before_at: str | None
    consecutive_failures: int
    last_started_at: str | None
    last_completed_at: str | None
    last_candidate_count: int
    last_deleted_orphans: int
    last_deleted_stale: int
    last_deleted_abandoned: int
    last_deleted_write_leases: int
    last_backlog_lower_bound: int
    last_scan_has_more: bool
    last_duration_ms: int
    last_error_code: str | None
    updated_at: str


_TASK_ROW_CONVERTERS = {
    **dict.fromkeys(
        (
            "consecutive_failures",
            "last_candidate_count",
            "last_deleted_orphans",
            "last_deleted_stale",
            "last_deleted_abandoned",
            "last_deleted_write_leases",
            "last_backlog_lower_bound",
            "last_duration_ms",
        ),
        int,
    ),
    "last_scan_has_more": bool,
}


def _cursor_of(row: Mapping[str, Any]) -> GcCursor | None:
    """The sweep's cursor as the task row holds it (None between sweeps)."""
    if row["cursor_created_at"] and row["cursor_id"]:
        return GcCursor(row["cursor_created_at"], row["cursor_id"])
    return None


def _task_row() -> ColumnElement[bool]:
    return cleanup.c.task_key == CLEANUP_TASK_KEY


def task_is_claimable() -> ColumnElement[bool]:
    """The task row is due and no pass holds it: never leased, or its lease expired."""
    return and_(
        _task_row(),
        is_due_at_clock(cleanup.c.next_eligible_at),
        or_(cleanup.c.lease_token.is_(None), is_due_at_clock(cleanup.c.lease_expires_at)),
    )


def _lease_is_held(engine_or_dialect_is_postgres: bool, lease_token: str) -> ColumnElement[bool]:
    """EXISTS the task row under this token with a live lease; PostgreSQL locks it, so a GC
    statement and a source write (the fence's FOR SHARE) never interleave."""
    held = cleanup.alias("cleanup_lease")
    probe = select(literal(1)).where(
        held.c.task_key == CLEANUP_TASK_KEY,
        held.c.lease_token == lease_token,
        lease_live_at_clock(held.c.lease_expires_at),
    )
    if engine_or_dialect_is_postgres:
        probe = probe.with_for_update()
    return exists(probe)


def _no_live_write_lease() -> ColumnElement[bool]:
    writer = generation_writes.alias("writer")
    return ~exists(
        select(literal(1)).where(
            writer.c.source_key == occurrences.c.source_key,
            writer.c.generation == occurrences.c.generation,
            lease_live_at_clock(writer.c.expires_at),
        )
    )


def _target_predicate(target: GcTarget) -> ColumnElement[bool]:
    source = sources.alias("source")
    same_source = source.c.source_key == occurrences.c.source_key
    if target is GcTarget.ORPHAN:
        return ~exists(select(literal(1)).where(same_source))
    age = (
        occurrences.c.created_at < source.c.indexed_at
        if target is GcTarget.STALE
        else occurrences.c.created_at >= source.c.indexed_at
    )
    return exists(
        select(literal(1)).where(
            same_source, source.c.current_generation != occurrences.c.generation, age
        )
    )


def _chunks(ids: Sequence[str], size: int) -> list[list[str]]:
    return [list(ids[start : start + size]) for start in range(0, len(ids), size)]


class ProjectionGcRepository:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._postgres = is_postgres(engine)

    def _held(self, lease_token: str) -> ColumnElement[bool]:
        return _lease_is_held(self._postgres, lease_token)

    # -- the task row -------------------------------------------------------------------------

    def claim(
        self,
        lease_token: str,
        *,
        lease_seconds: int,
        interval_seconds: int,
        safety_window_seconds: int,
    ) -> GcClaim | None:
        """Take the task row when it is due and not leased (or its lease lapsed); a new sweep
        fixes its cutoff now, a sweep in progress keeps the one it started with."""
        validate_duration(lease_seconds, "cleanup lease duration", allow_zero=True)
        validate_duration(interval_seconds, "cleanup interval", allow_zero=True)
        validate_duration(safety_window_seconds, "cleanup safety window", allow_zero=True)
        claimed_at = timestamp_offset(0)
        statement = (
            update(cleanup)
            .where(task_is_claimable())
            .values(
                lease_token=lease_token,
                lease_expires_at=timestamp_offset(lease_seconds),
                next_eligible_at=timestamp_offset(interval_seconds),
                last_started_at=claimed_at,
                updated_at=claimed_at,
                scan_before_at=case(
                    (cleanup.c.scan_before_at.is_(None), timestamp_offset(-safety_window_seconds)),
                    else_=cleanup.c.scan_before_at,
                ),
            )
            .returning(
                cleanup.c.cursor_created_at,
                cleanup.c.cursor_id,
                cleanup.c.last_started_at.label("claimed_at"),
                cleanup.c.scan_before_at,
                cleanup.c.consecutive_failures,
            )
        )
        with self.engine.begin() as connection:
            row = connection.execute(statement).mappings().first()
        if row is None:
            return None
        if not row["claimed_at"] or not row["scan_before_at"]:
            raise RuntimeError("the cleanup claim did not persist its database timestamps")
        claim = {**row, "lease_token": lease_token, "cursor": _cursor_of(row)}
        return record_from_row(GcClaim, claim, consecutive_failures=int)

    def complete(
        self,
        lease_token: str,
        counters: GcCounters,
        next_cursor: GcCursor | None,
        swept: bool,
        *,
        due_now: bool = False,
    ) -> bool:
        """Release the lease with the pass's counters; a finished sweep forgets its cursor and
        cutoff so the next one starts over with a fresh cutoff. `due_now` makes the row due at
        once (a full pass: more is right behind it); otherwise it stays due when the claim set
        it, EmDash's interval after the claim."""
        values = {
            "lease_token": None,
            "lease_expires_at": None,
            "cursor_created_at": None if swept or next_cursor is None else next_cursor.created_at,
            "cursor_id": None if swept or next_cursor is None else next_cursor.id,
            "consecutive_failures": 0,
            "last_completed_at": timestamp_offset(0),
            "last_candidate_count": counters.candidate_count,
            "last_deleted_orphans": counters.deleted_orphans,
            "last_deleted_stale": counters.deleted_stale,
            "last_deleted_abandoned": counters.deleted_abandoned,
            "last_deleted_write_leases": counters.deleted_write_leases,
            "last_backlog_lower_bound": counters.backlog_lower_bound,
            "last_scan_has_more": 1 if counters.scan_has_more else 0,
            "last_duration_ms": counters.duration_ms,
            "last_error_code": None,
            "updated_at": timestamp_offset(0),
        }
        if swept:
            values["scan_before_at"] = None
        if due_now:
            values["next_eligible_at"] = timestamp_offset(0)
        return self._release(lease_token, values)

    def fail(
        self,
        lease_token: str,
        *,
        retry_delay_seconds: int,
        consecutive_failures: int,
        duration_ms: int,
        error_code: str,
    ) -> bool:
        """Release the lease with the error code; the task is due again after the delay. The
        cursor stays, so the retry resumes the sweep."""
        validate_duration(retry_delay_seconds, "cleanup retry delay", allow_zero=True)
        return self._release(
            lease_token,
            {
                "lease_token": None,
                "lease_expires_at": None,
                "next_eligible_at": timestamp_offset(retry_delay_seconds),
                "consecutive_failures": consecutive_failures,
                "last_completed_at": timestamp_offset(0),
                "last_duration_ms": duration_ms,
                "last_error_code": error_code,
                "updated_at": timestamp_offset(0),
            },
        )

    def _release(self, lease_token: str, values: dict) -> bool:
        statement = (
            update(cleanup)
            .where(
                _task_row(),
                cleanup.c.lease_token == lease_token,
                lease_live_at_clock(cleanup.c.lease_expires_at),
            )
            .values(values)
        )
        with self.engine.begin() as connection:
            return connection.execute(statement).rowcount > 0

    def read_task(self) -> GcTaskRow | None:
        with read_transaction(self.engine) as connection:
            row = connection.execute(select(cleanup).where(_task_row())).mappings().first()
        if row is None:
            return None
        task = {**row, "leased": row["lease_token"] is not None, "cursor": _cursor_of(row)}
        return record_from_row(GcTaskRow, task, **_TASK_ROW_CONVERTERS)

    # -- the sweep ----------------------------------------------------------------------------

    def find_candidates(
        self, lease_token: str, cutoff: str, cursor: GcCursor | None, limit: int
    ) -> list[GcCandidate]:
        """The next `limit` occurrences below the cutoff after the cursor, with what decides
        their fate: their source's current generation and indexed_at, and any write lease."""
        source = sources.alias("s")
        writer = generation_writes.alias("writer")
        joined = occurrences.outerjoin(
            source, source.c.source_key == occurrences.c.source_key
        ).outerjoin(
            writer,
            and_(
                writer.c.source_key == occurrences.c.source_key,
                writer.c.generation == occurrences.c.generation,
            ),
        )
        after_cursor = true()
        if cursor is not None:
            after_cursor = or_(
                occurrences.c.created_at > cursor.created_at,
                and_(occurrences.c.created_at == cursor.created_at, occurrences.c.id > cursor.id),
            )
        statement = (
            select(
                occurrences.c.id,
                occurrences.c.source_key,
                occurrences.c.generation,
                occurrences.c.created_at,
                source.c.current_generation,
                source.c.indexed_at,
                writer.c.expires_at.label("write_lease_expires_at"),
            )
            .select_from(joined)
            .where(occurrences.c.created_at < cutoff, after_cursor, self._held(lease_token))
            .order_by(occurrences.c.created_at, occurrences.c.id)
            .limit(max(0, int(limit)))
        )
        with self.engine.begin() as connection:
            rows = connection.execute(statement).all()
        return [record_from_row(GcCandidate, row._mapping) for row in rows]

    def _target_guard(
        self, target: GcTarget, ids: Sequence[str], cutoff: str, lease_token: str
    ) -> ColumnElement[bool]:
        return and_(
            occurrences.c.id.in_(list(ids)),
            occurrences.c.created_at < cutoff,
            _target_predicate(target),
            _no_live_write_lease(),
            self._held(lease_token),
        )

    def mark_targets(
        self, target: GcTarget, ids: Sequence[str], cutoff: str, lease_token: str
    ) -> int:
        """Stamp the lease token on those of `ids` that are still `target` rows."""
        statement = (
            update(occurrences)
            .where(self._target_guard(target, ids, cutoff, lease_token))
            .values(cleanup_lease_token=lease_token)
        )
        with self.engine.begin() as connection:
            return connection.execute(statement).rowcount

    def delete_marked_targets(
        self, target: GcTarget, ids: Sequence[str], cutoff: str, lease_token: str
    ) -> int:
        """Delete those of `ids` still `target` rows and still carrying this pass's mark (the
        fence trigger raises the floor for each)."""
        statement = delete(occurrences).where(
            self._target_guard(target, ids, cutoff, lease_token),
            occurrences.c.cleanup_lease_token == lease_token,
        )
        with self.engine.begin() as connection:
            return connection.execute(statement).rowcount

    def find_expired_write_leases(self, lease_token: str, limit: int) -> list[str]:
        statement = (
            select(generation_writes.c.lease_token)
            .where(is_due_at_clock(generation_writes.c.expires_at), self._held(lease_token))
            .order_by(generation_writes.c.expires_at, generation_writes.c.lease_token)
            .limit(max(0, int(limit)))
        )
        with self.engine.begin() as connection:
            return list(connection.execute(statement).scalars())

    def delete_expired_write_leases(self, lease_token: str, write_lease_tokens: list[str]) -> int:
        """Delete those of the given write leases that are still expired."""
        if not write_lease_tokens:
            return 0
        statement = delete(generation_writes).where(
            generation_writes.c.lease_token.in_(write_lease_tokens),
            is_due_at_clock(generation_writes.c.expires_at),
            self._held(lease_token),
        )
        with self.engine.begin() as connection:
            return connection.execute(statement).rowcount


def scan_window_statement(cutoff: str, cursor: GcCursor | None, window: int):
    """The next `window` occurrences below the cutoff after the cursor, each flagged `target`
    when neither its source's current generation nor a live write lease keeps it (what a pass
    would look at next, without its lease)."""
    scanned = select(occurrences.c.id, occurrences.c.source_key, occurrences.c.generation).where(
        occurrences.c.created_at < cutoff
    )
    if cursor is not None:
        scanned = scanned.where(
            or_(
                occurrences.c.created_at > cursor.created_at,
                and_(occurrences.c.created_at == cursor.created_at, occurrences.c.id > cursor.id),
            )
        )
    scanned = scanned.order_by(occurrences.c.created_at, occurrences.c.id).limit(window).subquery()
    source = sources.alias("s")
    current = select(literal(1)).where(
        source.c.source_key == scanned.c.source_key,
        source.c.current_generation == scanned.c.generation,
    )
    writer = generation_writes.alias("writer")
    written = select(literal(1)).where(
        writer.c.source_key == scanned.c.source_key,
        writer.c.generation == scanned.c.generation,
        lease_live_at_clock(writer.c.expires_at),
    )
    target = and_(~exists(current), ~exists(written))
    return select(scanned.c.id, case((target, 1), else_=0).label("target"))
