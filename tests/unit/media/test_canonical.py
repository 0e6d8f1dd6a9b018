"""Canonical JSON byte-for-byte as EmDash's `JSON.stringify(canonicalize(value))`.

Expected strings and digests below were produced by Node's `JSON.stringify` and `crypto`.
"""

from __future__ import annotations

import hashlib

import pytest

from media_usage_orchestration.media.canonical import (
    canonical_json,
    js_number,
    js_trim,
    sha256_hex,
    utf8_bytes,
    utf16_key,
)
from media_usage_orchestration.values.json_text import parse_json

GRINNING = "\U0001f600"  # non-BMP: a surrogate pair in UTF-16 (0xD83D 0xDE00)
PRIVATE_USE = "\ue000"  # BMP, above the surrogate range


def test_integers_print_without_fraction_and_nothing_has_whitespace():
    payload = {
        "version": 2.0,
        "count": 10,
        "nested": {"z": None, "y": True},
        "list": [3, 1.5, -0.0, 1e21, 1e-7],
    }
    expected = '{"count":10,"list":[3,1.5,0,1e+21,1e-7],"nested":{"y":true,"z":null},"version":2}'
    assert canonical_json(payload) == expected
    assert sha256_hex(expected) == (
        "1a85d1512a10413146ec8ac4c28b0b9fd28768888f7436175b53722454a2c783"
    )


def test_keys_sort_by_utf16_code_units_and_non_ascii_is_kept():
    payload = {GRINNING: 2, PRIVATE_USE: 3, "a": 1, "title": "Café ☕", "bé": "日本"}
    # Code-point order would put U+E000 before U+1F600; code-unit order puts it after.
    expected = f'{{"a":1,"bé":"日本","title":"Café ☕","{GRINNING}":2,"{PRIVATE_USE}":3}}'
    assert sorted([GRINNING, PRIVATE_USE]) == [PRIVATE_USE, GRINNING]
    assert canonical_json(payload) == expected
    assert len(utf8_bytes(expected)) == 59
    assert sha256_hex(expected) == (
        "53f3abe4cb44ad80e4cd608a8491e664409bab5457f58fb1d6f488878295af60"
    )


def test_sha256_hex_is_lowercase_hex_of_utf8():
    assert sha256_hex("é") == hashlib.sha256("é".encode()).hexdigest()


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (0, "0"),
        (-0.0, "0"),
        (2.0, "2"),
        (-7, "-7"),
        (0.1 + 0.2, "0.30000000000000004"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (123456789012345680000.0, "123456789012345680000"),
        (1.5e300, "1.5e+300"),
        (0.000001, "0.000001"),
        (1e-7, "1e-7"),
        (1.23e-18, "1.23e-18"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (2**53 - 1, "9007199254740991"),
        (2**53 + 2, "9007199254740994"),
        (2**64, "18446744073709552000"),
        (10**400, "null"),
        (float("nan"), "null"),
        (float("inf"), "null"),
        (float("-inf"), "null"),
    ],
)
def test_numbers_print_as_javascript_does(number, text):
    assert js_number(number) == text
    assert canonical_json([number]) == f"[{text}]"


def test_string_escaping_matches_json_stringify():
    # Only `"`, `\`, controls below 0x20 and lone surrogates are escaped; U+2028/U+2029,
    # DEL and `/` stay raw.
    value = '\u2028\u2029\ud800x\udc00\U0001f600\x7f\x1f\x00\b\f\n\r\t"\\/'
    expected = '"\u2028\u2029\\ud800x\\udc00\U0001f600\x7f\\u001f\\u0000\\b\\f\\n\\r\\t\\"\\\\/"'
    assert canonical_json(value) == expected


def test_surrogate_code_points_forming_a_pair_are_one_character():
    assert canonical_json("\ud83d\ude00") == f'"{GRINNING}"'
    assert utf8_bytes("\ud83d\ude00") == GRINNING.encode()
    # TextEncoder replaces what cannot be paired.
    assert utf8_bytes("a\ud800b") == "a\ufffdb".encode()


def test_array_index_keys_come_first_in_numeric_order():
    payload = {"b": 1, "10": 2, "2": 3, "a": 4, "01": 5, "4294967294": 6, "4294967295": 7}
    assert canonical_json(payload) == (
        '{"2":3,"10":2,"4294967294":6,"01":5,"4294967295":7,"a":4,"b":1}'
    )


def test_values_canonicalize_recursively_and_tuples_are_arrays():
    payload = {"outer": [{"b": 1, "a": (2, {"d": None, "c": False})}]}
    assert canonical_json(payload) == '{"outer":[{"a":[2,{"c":false,"d":null}],"b":1}]}'


def test_unsupported_values_are_refused():
    with pytest.raises(TypeError):
        canonical_json({"when": object()})
    with pytest.raises(TypeError):
        canonical_json({1: "non-string key"})


def test_utf16_key_orders_like_javascript_strings():
    words = [PRIVATE_USE, GRINNING, "b", "a", "ab", ""]
    assert sorted(words, key=utf16_key) == ["", "a", "ab", "b", GRINNING, PRIVATE_USE]


def test_parse_json_rejects_what_json_parse_rejects():
    assert parse_json('{"a":[1,2.5,"x"]}') == {"a": [1, 2.5, "x"]}
    for text in ("NaN", "[Infinity]", '{"a":-Infinity}', "{'a':1}", "[1,]"):
        with pytest.raises(ValueError):
            parse_json(text)


def test_js_trim_uses_javascript_whitespace():
    assert js_trim("\ufeff\u00a0\u3000 id \u2028\n") == "id"
    # Python's str.strip() would remove these; JavaScript's trim() does not.
    assert js_trim("\x1cid\x85") == "\x1cid\x85"
    assert js_trim("\u180eid") == "\u180eid"
