"""Opaque operator cursors: standard base64 of `{"orderValue": <updated_at>, "id": <id>}`."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from media_usage_orchestration.values.errors import InvalidCursorError

MAX_CURSOR_LENGTH = 2048


@dataclass(frozen=True)
class PageCursor:
    order_value: str
    id: str


def encode_cursor(order_value: str, id_: str) -> str:
    payload = json.dumps({"orderValue": order_value, "id": id_}, separators=(",", ":"))
    return base64.b64encode(payload.encode("utf-8")).decode("ascii")


def decode_cursor(cursor: str) -> PageCursor:
    if not isinstance(cursor, str) or not cursor or len(cursor) > MAX_CURSOR_LENGTH:
        raise InvalidCursorError("Invalid cursor")
    try:
        payload = json.loads(base64.b64decode(cursor, validate=True).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError, ValueError):
        raise InvalidCursorError("Invalid cursor") from None
    if (
        not isinstance(payload, dict)
        or not isinstance(payload.get("orderValue"), str)
        or not isinstance(payload.get("id"), str)
    ):
        raise InvalidCursorError("Invalid cursor")
    return PageCursor(payload["orderValue"], payload["id"])
