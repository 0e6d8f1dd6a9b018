"""JavaScript-compatible JSON: EmDash's canonical stringify, `JSON.parse`, and string order.

EmDash fingerprints (`projection-fingerprint.ts`) hash `JSON.stringify(canonicalize(value))`
as UTF-8, so every byte here follows JavaScript rather than Python's `json` module: number
formatting (`2`, `1e+21`, `1e-7`), string escaping (only `"`, `\\`, controls and lone
surrogates), and ordering by UTF-16 code units.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from json.encoder import encode_basestring as _c_encode_basestring
from typing import Any

# Integers at or beyond 2**53 are not exact in a JS number; they print as the nearest double.
_MAX_SAFE_INTEGER = 2**53 - 1
# Keys that JS objects enumerate first, in numeric order (ES "array index": < 2**32 - 1).
_ARRAY_INDEX_RE = re.compile(r"0|[1-9][0-9]{0,9}")
_MAX_ARRAY_INDEX = 2**32 - 2

_SURROGATE_PAIR_RE = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_LONE_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_ESCAPED_RE = re.compile('["\\\\\x00-\x1f\ud800-\udfff]')
_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


# Python's C encoder prints what `JSON.stringify` does for objects whose keys are already in
# output order and whose values are plain (see `_is_plain`): the same escapes, lowercase hex,
# non-ASCII raw. It differs only for lone surrogates, floats and unsafe integers, never plain.
_encode_plain_object = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), check_circular=False, allow_nan=False
).encode


class CanonicalText(str):
    """A value already serialized by `canonical_json`, written back verbatim: a fingerprint
    payload reuses the text of parts it serialized (or cached) before."""


def canonical_json(value: Any) -> str:
    """EmDash's canonical JSON: sorted object keys, no whitespace, JS number and string output.

    `None` stands for both `null` and `undefined` (EmDash maps `undefined` to `null`);
    non-finite numbers become `null`, as `canonicalize` does before `JSON.stringify`.
    """
    return _dump(value)


def reference_canonical_json(value: Any) -> str:
    """`canonical_json` with every string escaped here rather than by the C escaper that
    `canonical_json` uses for ASCII text; the differential tests hold the two equal."""
    return _dump(value, fast=False)


def sha256_hex(text: str) -> str:
    """Lowercase hex SHA-256 of `text` encoded as `TextEncoder` would."""
    return hashlib.sha256(utf8_bytes(text)).hexdigest()


def utf8_bytes(text: str) -> bytes:
    """UTF-8 as `TextEncoder.encode`: lone surrogates become U+FFFD instead of failing."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        joined = _join_surrogate_pairs(text)
        return _LONE_SURROGATE_RE.sub("\ufffd", joined).encode("utf-8")


def utf16_key(text: str) -> bytes:
    """Sort key equal to JavaScript's default string order (`<`, `Array.prototype.sort`).

    JS compares UTF-16 code units, so a non-BMP character (a surrogate pair, 0xD8xx...) sorts
    before U+E000..U+FFFF, unlike Python's code-point order.
    """
    return text.encode("utf-16-be", "surrogatepass")


def js_trim(text: str) -> str:
    """`String.prototype.trim`: JS whitespace and line terminators only (not U+001C..U+001F or
    U+0085, which `str.strip` also removes; U+FEFF is trimmed by JS but not by Python)."""
    return text.strip(_JS_WHITESPACE)


_JS_WHITESPACE = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def _dump(value: Any, fast: bool = True) -> str:
    kind = type(value)
    if kind is str:
        return _js_string(value) if fast else _reference_js_string(value)
    if kind is dict:
        return _dump_object(value, fast)
    if kind is CanonicalText:
        return value
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _js_string(value) if fast else _reference_js_string(value)
    if isinstance(value, int | float):
        return js_number(value)
    if isinstance(value, Mapping):
        return _dump_object(value, fast)
    if isinstance(value, list | tuple):
        return "[" + ",".join([_dump(item, fast) for item in value]) + "]"
    raise TypeError(f"Cannot canonicalize {type(value).__name__}")


def _dump_object(value: Mapping, fast: bool = True) -> str:
    keys = tuple(value)
    if (
        fast
        and type(value) is dict
        and _in_output_order(keys)
        and all(map(_is_plain, value.values()))
    ):
        return _encode_plain_object(value)
    members = []
    for key, prefix in _member_prefixes(keys):
        item = value[key]
        # Fingerprint payloads are mostly flat text and nulls: spare those a call.
        if type(item) is str:
            members.append(prefix + (_js_string(item) if fast else _reference_js_string(item)))
        elif item is None:
            members.append(prefix + "null")
        else:
            members.append(prefix + _dump(item, fast))
    return "{" + ",".join(members) + "}"


@functools.lru_cache(maxsize=1024)
def _member_prefixes(keys: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Each key with its `"key":` text, in output order. The order depends only on the keys,
    and fingerprint payloads repeat a few key sets, so both are computed once per key set."""
    return tuple((key, _reference_js_string(key) + ":") for key in canonical_key_order(keys))


@functools.lru_cache(maxsize=1024)
def _in_output_order(keys: tuple[str, ...]) -> bool:
    """Whether a dict's own order is already the order `canonical_json` writes its keys in
    (fingerprint payloads are built that way), with keys the C encoder prints exactly."""
    return tuple(canonical_key_order(keys)) == keys and all(map(_is_plain, keys))


def _is_plain(value: Any) -> bool:
    """Text without surrogates, null, a boolean or a safe integer: what the C encoder prints
    exactly as `JSON.stringify` does."""
    kind = type(value)
    if kind is str:
        return value.isascii() or _LONE_SURROGATE_RE.search(value) is None
    if kind is int:
        return -_MAX_SAFE_INTEGER <= value <= _MAX_SAFE_INTEGER
    return value is None or kind is bool


def canonical_key_order(keys: tuple) -> list[str]:
    """The order `canonical_json` writes an object's keys in: sorted by code units, then
    re-enumerated as a JS object does (EmDash rebuilds the object in sorted order, and
    `JSON.stringify` still lists array-index keys first)."""
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"Object keys must be strings, not {type(key).__name__}")
    indexes = sorted((key for key in keys if _is_array_index(key)), key=int)
    others = sorted((key for key in keys if not _is_array_index(key)), key=utf16_key)
    return indexes + others


def _is_array_index(key: str) -> bool:
    return _ARRAY_INDEX_RE.fullmatch(key) is not None and int(key) <= _MAX_ARRAY_INDEX


def js_number(value: int | float) -> str:
    """`Number.prototype.toString()` as `JSON.stringify` prints it; non-finite → `null`."""
    if isinstance(value, int) and abs(value) <= _MAX_SAFE_INTEGER:
        return str(value)
    try:
        number = float(value)
    except OverflowError:
        return "null"
    if not math.isfinite(number):
        return "null"
    if number == 0:
        return "0"
    sign = "-" if number < 0 else ""
    return sign + _format_positive(abs(number))


def _format_positive(number: float) -> str:
    # repr() gives the shortest round-tripping digits, the same digits ECMAScript picks.
    decimal = Decimal(repr(number)).normalize()
    _, digit_tuple, exponent = decimal.as_tuple()
    digits = "".join(map(str, digit_tuple))
    k = len(digits)
    n = int(exponent) + k  # value = 0.<digits> * 10**n
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return f"{digits[:n]}.{digits[n:]}"
    if -6 < n <= 0:
        return f"0.{'0' * -n}{digits}"
    power = n - 1
    mantissa = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
    return f"{mantissa}e{'+' if power >= 0 else '-'}{abs(power)}"


def _js_string(text: str) -> str:
    if text.isascii():
        # ASCII has no surrogates: the C escaper writes what `JSON.stringify` does.
        return _c_encode_basestring(text)
    return _reference_js_string(text)


def _reference_js_string(text: str) -> str:
    if _ESCAPED_RE.search(text) is None:
        return f'"{text}"'
    return f'"{_ESCAPED_RE.sub(_escape, _join_surrogate_pairs(text))}"'


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _SHORT_ESCAPES.get(char) or f"\\u{ord(char):04x}"


def _join_surrogate_pairs(text: str) -> str:
    """A Python string may hold a high and low surrogate as two code points; to JS that is one
    well-formed character, printed raw rather than escaped."""
    return _SURROGATE_PAIR_RE.sub(_combine_pair, text)


def _combine_pair(match: re.Match[str]) -> str:
    high, low = (ord(char) for char in match.group())
    return chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
