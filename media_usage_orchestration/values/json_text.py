"""JSON text read as JavaScript's `JSON.parse` reads it, for every reader of stored JSON: the
PostgreSQL driver (json columns) and `media/` (JSON text columns, revision data, validation).

Python's decoder recurses per nesting level and gives up near the interpreter's recursion
limit, and refuses integer literals over 4300 digits; V8 parses both (a huge integer becomes
`Infinity`). A document the fast decoder refuses is therefore parsed again by an iterative
parser with the same grammar, so a deeply nested entry is read, not mistaken for plain text.
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring
from typing import Any

_WHITESPACE_RE = re.compile(r"[ \t\n\r]*")
# ASCII digits only, as the C scanner and JavaScript (`\d` would match other scripts' digits).
_NUMBER_RE = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_LITERALS = (("null", None), ("true", True), ("false", False))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# `json.loads` with options builds a decoder per call; this one is shared (it keeps no state).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def parse_json(text: str | bytes) -> Any:
    """`JSON.parse`: Python's parser minus the `NaN`/`Infinity` literals JS rejects, with no
    limit on nesting depth or integer length. Invalid JSON raises `ValueError`."""
    if isinstance(text, bytes | bytearray | memoryview):
        # As `json.loads` decodes driver bytes: lone surrogates pass through.
        text = bytes(text).decode("utf-8", "surrogatepass")
    try:
        return _DECODER.decode(text)
    except (RecursionError, ValueError):
        # Too deep or a huge integer for the fast decoder, or invalid: the grammar decides.
        return _parse_iteratively(text)


def _parse_iteratively(text: str) -> Any:
    # Open containers, innermost last, each with the key its next value is stored under.
    stack: list[tuple[Any, str | None]] = []
    position = _skip(text, 0)
    while True:
        opened = _open_container(text, position)
        if opened is not None:
            container, key, position, complete = opened
            if not complete:
                stack.append((container, key))
                continue
            value = container
        else:
            value, position = _scalar(text, position)
        while True:
            if not stack:
                return _finish(text, value, position)
            container, key = stack[-1]
            if key is None:
                container.append(value)
            else:
                container[key] = value
            position = _skip(text, position)
            separator = text[position : position + 1]
            if separator == ",":
                position = _skip(text, position + 1)
                if key is not None:
                    key, position = _member_key(text, position)
                    stack[-1] = (container, key)
                break
            if separator != ("]" if key is None else "}"):
                raise json.JSONDecodeError("Expecting ',' delimiter", text, position)
            stack.pop()
            value, position = container, position + 1


def _open_container(text: str, position: int) -> tuple[Any, str | None, int, bool] | None:
    """A container starting at `position`: (container, first key, next position, already
    closed), or None when no container starts there."""
    char = text[position : position + 1]
    if char not in ("[", "{"):
        return None
    position = _skip(text, position + 1)
    closer = "]" if char == "[" else "}"
    container: Any = [] if char == "[" else {}
    if text[position : position + 1] == closer:
        return container, None, position + 1, True
    if char == "[":
        return container, None, position, False
    key, position = _member_key(text, position)
    return container, key, position, False


def _member_key(text: str, position: int) -> tuple[str, int]:
    if text[position : position + 1] != '"':
        raise json.JSONDecodeError(
            "Expecting property name enclosed in double quotes", text, position
        )
    key, position = scanstring(text, position + 1, True)
    position = _skip(text, position)
    if text[position : position + 1] != ":":
        raise json.JSONDecodeError("Expecting ':' delimiter", text, position)
    return key, _skip(text, position + 1)


def _scalar(text: str, position: int) -> tuple[Any, int]:
    if text[position : position + 1] == '"':
        return scanstring(text, position + 1, True)
    number = _NUMBER_RE.match(text, position)
    if number is not None:
        return _number(*number.groups()), number.end()
    for literal, value in _LITERALS:
        if text.startswith(literal, position):
            return value, position + len(literal)
    raise json.JSONDecodeError("Expecting value", text, position)


def _number(integer: str, fraction: str | None, exponent: str | None) -> int | float:
    if fraction or exponent:
        return float(integer + (fraction or "") + (exponent or ""))
    try:
        return int(integer)
    except ValueError:
        # Past Python's integer-string limit: the double JS reads (`Infinity` when that large).
        return float(integer)


def _finish(text: str, value: Any, position: int) -> Any:
    position = _skip(text, position)
    if position != len(text):
        raise json.JSONDecodeError("Extra data", text, position)
    return value


def _skip(text: str, position: int) -> int:
    return _WHITESPACE_RE.match(text, position).end()


__all__ = ["parse_json"]
