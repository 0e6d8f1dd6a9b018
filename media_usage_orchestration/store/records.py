"""Vocabulary shared by the three leased tables: states, epochs, limits."""

from __future__ import annotations

import re
from enum import StrEnum


class LeaseState(StrEnum):
    """`state` of a work, reconciliation or deletion row."""

    PENDING = "pending"
    RETRY = "retry"
    LEASED = "leased"
    FAILED = "failed"


_NON_NEGATIVE_DECIMAL = re.compile(r"^(?:0|[1-9][0-9]*)$")
_POSITIVE_DECIMAL = re.compile(r"^[1-9][0-9]*$")


def parse_lease_state(value: str, label: str) -> LeaseState:
    try:
        return LeaseState(value)
    except ValueError:
        raise ValueError(f"Invalid {label} state: {value!r}") from None


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
