"""`parse_json` reads what `JSON.parse` reads: the same values as Python's decoder for
ordinary documents, and documents too deep or with integers too long for it."""

from __future__ import annotations

import json
import math
import random

import pytest

from media_usage_orchestration.values.json_text import _parse_iteratively, parse_json

ORDINARY = [
    '{"a":[1,2.5,"x"]}',
    ' [ {"_type" : "image", "asset": {"_ref":"m1"}} , null, true, false ] ',
    '{"a":1,"b":2,"a":3}',
    '"\\ud800 lone, \\ud83d\\ude00 pair, \\u00e9"',
    "-0",
    "1e400",
    "-12.5E-3",
    '{"":{"":[[],{}]}}',
    "[0,-1,1.0,123456789012345678901234567890]",
]
INVALID = [
    "NaN",
    "[Infinity]",
    '{"a":-Infinity}',
    "{'a':1}",
    "[1,]",
    '{"a":1,}',
    "[1 2]",
    '{"a" 1}',
    "01",
    "[\u0661]",
    '"\x01"',
    "",
    "[",
    "[]]",
    "tru",
    "{1:2}",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_the_iterative_parser_reads_what_the_fast_decoder_reads(text):
    expected = json.loads(text)
    assert repr(_parse_iteratively(text)) == repr(expected)
    assert repr(parse_json(text)) == repr(expected)


@pytest.mark.parametrize("text", INVALID)
def test_the_iterative_parser_refuses_what_the_fast_decoder_refuses(text):
    with pytest.raises(ValueError):
        _parse_iteratively(text)
    with pytest.raises(ValueError):
        parse_json(text)


def test_random_documents_parse_the_same_both_ways():
    generator = random.Random(7)

    def value(depth: int):
        pick = generator.randrange(7 if depth < 4 else 4)
        if pick == 0:
            return generator.choice([None, True, False])
        if pick == 1:
            return generator.choice([0, -3, 2**60, 1.5, -2.25e-9])
        if pick in (2, 3):
            return "".join(chr(generator.randrange(0x20, 0x3000)) for _ in range(4))
        if pick in (4, 5):
            return [value(depth + 1) for _ in range(generator.randrange(4))]
        return {f"k{generator.randrange(5)}": value(depth + 1) for _ in range(3)}

    for _ in range(300):
        text = json.dumps(value(0), ensure_ascii=generator.random() < 0.5)
        assert repr(_parse_iteratively(text)) == repr(json.loads(text))


def test_nesting_far_deeper_than_the_recursion_limit_is_parsed():
    depth = 100_000
    parsed = parse_json('[{"_type":"image"},' + "[" * depth + "]" * depth + "]")
    assert parsed[0] == {"_type": "image"}
    inner, levels = parsed[1], 1
    while inner:
        inner, levels = inner[0], levels + 1
    assert levels == depth
    assert parse_json('{"a":' * 5000 + "1" + "}" * 5000)["a"]["a"]["a"] is not None


def test_an_integer_too_long_for_python_reads_as_javascript_reads_it():
    assert parse_json("[" + "9" * 5000 + "]") == [math.inf]
    assert parse_json("[-" + "9" * 5000 + ",1]") == [-math.inf, 1]


def test_driver_bytes_are_utf8_with_lone_surrogates_kept():
    assert parse_json('{"t":"\u00e9\\ud800"}'.encode()) == {"t": "\u00e9\ud800"}
    assert parse_json(memoryview(b"[1]")) == [1]
