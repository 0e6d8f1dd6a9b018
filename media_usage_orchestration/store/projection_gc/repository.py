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

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    Delete,
    Engine,
    Integer,
    Select,
    Update,
    and_,
    bindparam,
    case,
    delete,
    exists,
    literal,
    or_,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import ColumnElement

from media_usage_orchestration.store.core.clock import (
    is_due_at_clock,
    lease_live_at_clock,
    timestamp_offset,
    validate_duration,
)
from media_usage_orchestration.store.core.engine import (
    is_postgres,
    read_transaction,
    single_statement,
)
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


# Every sweep statement is built once per dialect with bound parameters (the pass's lease
# token, cutoff, cursor, ids and limits), so a pass sends the same SQL text each time: nothing
# is rebuilt or re-keyed per pass (a backlog takes thousands of passes), and PostgreSQL can
# prepare each statement once per connection. Each statement is a transaction of its own
# (`single_statement`: on PostgreSQL without BEGIN and COMMIT round trips), atomic with its
# guards and the fence's triggers; no transaction spans two statements of a pass.
_HELD = cleanup.alias("cleanup_lease")
_WRITER = generation_writes.alias("writer")
_SOURCE = sources.alias("source")


def _lease_is_held(postgres: bool) -> ColumnElement[bool]:
    """EXISTS the task row under the pass's `lease_token` with a live lease; PostgreSQL locks
    it, so a GC statement and a source write (the fence's FOR SHARE) never interleave."""
    probe = select(literal(1)).where(
        _HELD.c.task_key == CLEANUP_TASK_KEY,
        _HELD.c.lease_token == bindparam("lease_token"),
        lease_live_at_clock(_HELD.c.lease_expires_at),
    )
    if postgres:
        probe = probe.with_for_update()
    return exists(probe)


def _no_live_write_lease() -> ColumnElement[bool]:
    return ~exists(
        select(literal(1)).where(
            _WRITER.c.source_key == occurrences.c.source_key,
            _WRITER.c.generation == occurrences.c.generation,
            lease_live_at_clock(_WRITER.c.expires_at),
        )
    )


def _target_predicate(target: GcTarget) -> ColumnElement[bool]:
    same_source = _SOURCE.c.source_key == occurrences.c.source_key
    if target is GcTarget.ORPHAN:
        return ~exists(select(literal(1)).where(same_source))
    age = (
        occurrences.c.created_at < _SOURCE.c.indexed_at
        if target is GcTarget.STALE
        else occurrences.c.created_at >= _SOURCE.c.indexed_at
    )
    return exists(
        select(literal(1)).where(
            same_source, _SOURCE.c.current_generation != occurrences.c.generation, age
        )
    )


def _after(created_at: ColumnElement[str], id_: ColumnElement[str]) -> ColumnElement[bool]:
    """Occurrences after the sweep's cursor in (created_at, id) order. A row-value comparison,
    so both dialects start the cleanup-scan index range at the cursor instead of reading (and
    filtering out) every row the sweep already passed, kept or reaped."""
    return tuple_(occurrences.c.created_at, occurrences.c.id) > tuple_(created_at, id_)


def _cursor_params(cursor: GcCursor | None) -> dict[str, str]:
    if cursor is None:
        return {}
    return {"cursor_created_at": cursor.created_at, "cursor_id": cursor.id}


@functools.cache
def _find_candidates_statement(postgres: bool, after_cursor: bool) -> Select:
    joined = occurrences.outerjoin(
        _SOURCE, _SOURCE.c.source_key == occurrences.c.source_key
    ).outerjoin(
        _WRITER,
        and_(
            _WRITER.c.source_key == occurrences.c.source_key,
            _WRITER.c.generation == occurrences.c.generation,
        ),
    )
    window = true()
    if after_cursor:
        window = _after(bindparam("cursor_created_at"), bindparam("cursor_id"))
    return (
        select(
            occurrences.c.id,
            occurrences.c.source_key,
            occurrences.c.generation,
            occurrences.c.created_at,
            _SOURCE.c.current_generation,
            _SOURCE.c.indexed_at,
            _WRITER.c.expires_at.label("write_lease_expires_at"),
        )
        .select_from(joined)
        .where(occurrences.c.created_at < bindparam("cutoff"), window, _lease_is_held(postgres))
        .order_by(occurrences.c.created_at, occurrences.c.id)
        .limit(bindparam("limit", type_=Integer))
    )


def _target_guard(postgres: bool, target: GcTarget) -> ColumnElement[bool]:
    return and_(
        occurrences.c.id.in_(bindparam("ids", expanding=True)),
        occurrences.c.created_at < bindparam("cutoff"),
        _target_predicate(target),
        _no_live_write_lease(),
        _lease_is_held(postgres),
    )


@functools.cache
def _mark_targets_statement(postgres: bool, target: GcTarget) -> Update:
    return (
        update(occurrences)
        .where(_target_guard(postgres, target))
        .values(cleanup_lease_token=bindparam("lease_token"))
    )


@functools.cache
def _delete_marked_targets_statement(postgres: bool, target: GcTarget) -> Delete:
    return delete(occurrences).where(
        _target_guard(postgres, target),
        occurrences.c.cleanup_lease_token == bindparam("lease_token"),
    )


@functools.cache
def _find_expired_write_leases_statement(postgres: bool) -> Select:
    return (
        select(generation_writes.c.lease_token)
        .where(is_due_at_clock(generation_writes.c.expires_at), _lease_is_held(postgres))
        .order_by(generation_writes.c.expires_at, generation_writes.c.lease_token)
        .limit(bindparam("limit", type_=Integer))
    )


@functools.cache
def _delete_expired_write_leases_statement(postgres: bool) -> Delete:
    return delete(generation_writes).where(
        generation_writes.c.lease_token.in_(bindparam("write_lease_tokens", expanding=True)),
        is_due_at_clock(generation_writes.c.expires_at),
        _lease_is_held(postgres),
    )


class ProjectionGcRepository:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._postgres = is_postgres(engine)

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
        with single_statement(self.engine) as connection:
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
        with single_statement(self.engine) as connection:
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
        statement = _find_candidates_statement(self._postgres, cursor is not None)
        params = {
            "lease_token": lease_token,
            "cutoff": cutoff,
            "limit": max(0, int(limit)),
            **_cursor_params(cursor),
        }
        with single_statement(self.engine) as connection:
            rows = connection.execute(statement, params).all()
        return [record_from_row(GcCandidate, row._mapping) for row in rows]

    def mark_targets(
        self, target: GcTarget, ids: Sequence[str], cutoff: str, lease_token: str
    ) -> int:
        """Stamp the lease token on those of `ids` that are still `target` rows."""
        return self._write(
            _mark_targets_statement(self._postgres, target),
            {"ids": list(ids), "cutoff": cutoff, "lease_token": lease_token},
        )

    def delete_marked_targets(
        self, target: GcTarget, ids: Sequence[str], cutoff: str, lease_token: str
    ) -> int:
        """Delete those of `ids` still `target` rows and still carrying this pass's mark (the
        fence trigger raises the floor for each)."""
        return self._write(
            _delete_marked_targets_statement(self._postgres, target),
            {"ids": list(ids), "cutoff": cutoff, "lease_token": lease_token},
        )

    def find_expired_write_leases(self, lease_token: str, limit: int) -> list[str]:
        statement = _find_expired_write_leases_statement(self._postgres)
        params = {"lease_token": lease_token, "limit": max(0, int(limit))}
        with single_statement(self.engine) as connection:
            return list(connection.execute(statement, params).scalars())

    def delete_expired_write_leases(self, lease_token: str, write_lease_tokens: list[str]) -> int:
        """Delete those of the given write leases that are still expired."""
        if not write_lease_tokens:
            return 0
        return self._write(
            _delete_expired_write_leases_statement(self._postgres),
            {"write_lease_tokens": list(write_lease_tokens), "lease_token": lease_token},
        )

    def _write(self, statement: Executable, params: dict) -> int:
        with single_statement(self.engine) as connection:
            return connection.execute(statement, params).rowcount


def scan_window_statement(cutoff: str, cursor: GcCursor | None, window: int):
    """The next `window` occurrences below the cutoff after the cursor, each flagged `target`
    when neither its source's current generation nor a live write lease keeps it (what a pass
    would look at next, without its lease)."""
    scanned = select(occurrences.c.id, occurrences.c.source_key, occurrences.c.generation).where(
        occurrences.c.created_at < cutoff
    )
    if cursor is not None:
        scanned = scanned.where(_after(literal(cursor.created_at), literal(cursor.id)))
    scanned = scanned.order_by(occurrences.c.created_at, occurrences.c.id).limit(window).subquery()
    current = select(literal(1)).where(
        _SOURCE.c.source_key == scanned.c.source_key,
        _SOURCE.c.current_generation == scanned.c.generation,
    )
    written = select(literal(1)).where(
        _WRITER.c.source_key == scanned.c.source_key,
        _WRITER.c.generation == scanned.c.generation,
        lease_live_at_clock(_WRITER.c.expires_at),
    )
    target = and_(~exists(current), ~exists(written))
    return select(scanned.c.id, case((target, 1), else_=0).label("target"))
