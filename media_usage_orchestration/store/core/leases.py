"""Lease vocabulary shared by the three leased tables (work, reconciliations, deletion
tombstones): states, epochs, limits, and the expired-lease and claim conditions; and the due
candidates of the two tables with one row per collection (reconciliations, tombstones)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import TypeVar

from sqlalchemy import Select, and_, case, or_, select, union_all
from sqlalchemy.sql.elements import ColumnElement

from media_usage_orchestration.store.core.clock import is_due


class LeaseState(StrEnum):
    """`state` of a work, reconciliation or deletion row."""

    PENDING = "pending"
    RETRY = "retry"
    LEASED = "leased"
    FAILED = "failed"


Choice = TypeVar("Choice", bound=StrEnum)

_NON_NEGATIVE_DECIMAL = re.compile(r"^(?:0|[1-9][0-9]*)$")
_POSITIVE_DECIMAL = re.compile(r"^[1-9][0-9]*$")


def parse_choice(choices: type[Choice], value: object, label: str) -> Choice:
    """One of an enum's values, or `Invalid <label>: <value>`."""
    try:
        return choices(value)
    except ValueError:
        raise ValueError(f"Invalid {label}: {value!r}") from None


def parse_lease_state(value: object, label: str) -> LeaseState:
    return parse_choice(LeaseState, value, f"{label} state")


def require_flag(value: object, label: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{label} must be a boolean")
    return value


def non_negative_whole(value: int | str, label: str) -> int:
    """Epochs arrive as ints (or decimal strings, as bigint columns may); anything else is refused."""
    if isinstance(value, bool):
        raise ValueError(f"{label} must be a non-negative whole number")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and _NON_NEGATIVE_DECIMAL.fullmatch(value):
        return int(value)
    raise ValueError(f"{label} must be a non-negative whole number")


def positive_whole(value: int | str, label: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{label} must be a positive whole number")
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str) and _POSITIVE_DECIMAL.fullmatch(value):
        return int(value)
    raise ValueError(f"{label} must be a positive whole number")


def bounded_limit(value: int, lowest: int, highest: int, message: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= highest:
        raise ValueError(message)
    return value


# --- due and claim conditions -----------------------------------------------------------------


def due_candidates_statement(leased, limit: int) -> Select:
    """One statement: up to `limit` due pending, due retry and lease-expired rows of `leased`,
    each bounded, then merged (the seeds' three CTEs, so each branch walks its own index).
    `limit` is validated by the caller."""

    def candidates(name: str, state: LeaseState, due_column):
        return (
            select(leased)
            .where(leased.c.state == state.value, is_due(due_column))
            .order_by(due_column, leased.c.updated_at, leased.c.collection_id)
            .limit(limit)
            .cte(name)
        )

    pending = candidates("pending_candidates", LeaseState.PENDING, leased.c.next_attempt_at)
    retry = candidates("retry_candidates", LeaseState.RETRY, leased.c.next_attempt_at)
    expired = candidates("leased_candidates", LeaseState.LEASED, leased.c.lease_expires_at)
    merged = union_all(select(pending), select(retry), select(expired)).cte("candidates")
    return (
        select(merged)
        .order_by(due_time(merged), merged.c.updated_at, merged.c.collection_id)
        .limit(limit)
    )


def due_time(leased) -> ColumnElement[str]:
    """When a row became (or becomes) claimable: its lease expiry while leased, else its next
    attempt (the seeds' `dueTimestamp`)."""
    return case(
        (leased.c.state == LeaseState.LEASED.value, leased.c.lease_expires_at),
        else_=leased.c.next_attempt_at,
    )


def lease_has_expired(leased) -> ColumnElement[bool]:
    """An expired lease may be taken over; a NULL expiry is never treated as expired."""
    return and_(leased.c.lease_expires_at.is_not(None), is_due(leased.c.lease_expires_at))


def is_claimable(leased) -> ColumnElement[bool]:
    """Due pending or retry rows, or leased rows whose owner let the lease expire."""
    return or_(
        and_(
            leased.c.state.in_([LeaseState.PENDING.value, LeaseState.RETRY.value]),
            is_due(leased.c.next_attempt_at),
        ),
        and_(leased.c.state == LeaseState.LEASED.value, lease_has_expired(leased)),
    )


def is_reopenable_by_operator(leased) -> ColumnElement[bool]:
    """Failed or retrying rows, or leased rows whose lease expired: never a live lease."""
    return or_(
        leased.c.state.in_([LeaseState.FAILED.value, LeaseState.RETRY.value]),
        and_(leased.c.state == LeaseState.LEASED.value, lease_has_expired(leased)),
    )
