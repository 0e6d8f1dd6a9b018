"""Database time, exactly as the seeds write it.

Every timestamp the project compares is TEXT `YYYY-MM-DDTHH:MM:SS.sssZ` produced by the
database. The constructs below compile to the seeds' SQL on each dialect, so repositories
stay dialect-free and the Python clock never decides a lease or a due time.

Two notions of "now" exist in the seeds and both are kept:
- statement time (`statement_timestamp()` on PostgreSQL) for due checks and for the
  reconciliation / enqueue lease checks;
- clock time (`clock_timestamp()`) for writes and for the work and deletion lease checks,
  which compare `lease_expires_at::timestamptz > clock_timestamp()`.
SQLite has one clock (`'now'` is stable within a statement).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Integer, String, literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

MAX_PORTABLE_DURATION_SECONDS = 365 * 24 * 60 * 60
# The sortable text as Python reads it back (`%f` takes the milliseconds).
TIMESTAMP_TEXT_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"

SQLITE_FORMAT = "%Y-%m-%dT%H:%M:%fZ"
POSTGRES_FORMAT = 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'
POSTGRES_CLOCK_UTC = "clock_timestamp() AT TIME ZONE 'UTC'"
POSTGRES_STATEMENT_UTC = "statement_timestamp() AT TIME ZONE 'UTC'"


def sqlite_time_text(*modifiers: str) -> str:
    """SQLite's `now` (shifted by `modifiers`, SQL string literals) as sortable text."""
    arguments = ", ".join((f"'{SQLITE_FORMAT}'", "'now'", *modifiers))
    return f"strftime({arguments})"


def postgres_time_text(timestamp: str, *, one_argument_per_line: bool = False) -> str:
    """A PostgreSQL UTC timestamp expression as sortable text. The trigger function is laid
    out as EmDash writes it (one argument per line), since its DDL is compared with EmDash's."""
    if one_argument_per_line:
        return f"to_char(\n{timestamp},\n'{POSTGRES_FORMAT}'\n)"
    return f"to_char({timestamp}, '{POSTGRES_FORMAT}')"


def validate_duration(seconds: int, label: str, *, allow_zero: bool) -> int:
    """Durations must be whole seconds in 0 (or 1) .. one year, like the seeds' portable range."""
    lowest = 0 if allow_zero else 1
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise ValueError(f"{label} must be a whole number of seconds")
    if seconds < lowest or seconds > MAX_PORTABLE_DURATION_SECONDS:
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(
            f"{label} must be a {kind} whole number of seconds no greater than one year"
        )
    return seconds


class timestamp_offset(FunctionElement):
    """Clock time plus `seconds`, as sortable text (the seeds' `timestampOffset`)."""

    type = String()
    inherit_cache = True
    name = "timestamp_offset"

    def __init__(self, seconds: int = 0) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int):
            raise ValueError("timestamp offset must be a whole number of seconds")
        modifier = f"{'+' if seconds >= 0 else ''}{seconds} seconds"
        super().__init__(literal(seconds, Integer), literal(modifier, String))


@compiles(timestamp_offset, "postgresql")
def _timestamp_offset_postgres(element, compiler, **kw):
    seconds = compiler.process(element.clauses.clauses[0], **kw)
    return postgres_time_text(f"({POSTGRES_CLOCK_UTC}) + ({seconds} * INTERVAL '1 second')")


@compiles(timestamp_offset, "sqlite")
def _timestamp_offset_sqlite(element, compiler, **kw):
    modifier = compiler.process(element.clauses.clauses[1], **kw)
    return sqlite_time_text(modifier)


def now() -> timestamp_offset:
    return timestamp_offset(0)


class statement_now(FunctionElement):
    """Statement time as sortable text: the right-hand side of every due check."""

    type = String()
    inherit_cache = True
    name = "statement_now"


@compiles(statement_now, "postgresql")
def _statement_now_postgres(element, compiler, **kw):
    return postgres_time_text(POSTGRES_STATEMENT_UTC)


@compiles(statement_now, "sqlite")
def _statement_now_sqlite(element, compiler, **kw):
    return sqlite_time_text()


class _clock_lease_live(FunctionElement):
    """`column > now` on the wall clock (PostgreSQL: `column::timestamptz > clock_timestamp()`)."""

    type = Boolean()
    inherit_cache = True
    name = "clock_lease_live"

    def __init__(self, column: ColumnElement) -> None:
        super().__init__(column)


@compiles(_clock_lease_live, "postgresql")
def _clock_lease_live_postgres(element, compiler, **kw):
    column = compiler.process(element.clauses.clauses[0], **kw)
    return f"CAST({column} AS TIMESTAMP WITH TIME ZONE) > clock_timestamp()"


@compiles(_clock_lease_live, "sqlite")
def _clock_lease_live_sqlite(element, compiler, **kw):
    column = compiler.process(element.clauses.clauses[0], **kw)
    return f"{column} > {sqlite_time_text()}"


def is_due(column: ColumnElement) -> ColumnElement[bool]:
    """`column <= statement now`: eligibility of next_attempt_at / an expired lease."""
    return column <= statement_now()


def lease_live_at_statement(column: ColumnElement) -> ColumnElement[bool]:
    """Reconciliation and enqueue guards: `column > statement now` (text comparison)."""
    return column > statement_now()


def lease_live_at_clock(column: ColumnElement) -> ColumnElement[bool]:
    """Work, deletion and generation-write guards: compared with the wall clock."""
    return _clock_lease_live(column)


def is_due_at_clock(column: ColumnElement) -> ColumnElement[bool]:
    """`column <= now` on the wall clock (the activation lease's takeover check)."""
    return ~_clock_lease_live(column)


def seconds_between(earlier: str, later: str) -> float | None:
    """How many seconds separate two timestamps the database wrote (both read from it, so the
    difference is database time); None when either is not the sortable text (a legacy
    `CURRENT_TIMESTAMP` default)."""
    try:
        start, end = (datetime.strptime(value, TIMESTAMP_TEXT_FORMAT) for value in (earlier, later))
    except (TypeError, ValueError):
        return None
    return (end - start).total_seconds()
