"""`canonical_json`, which escapes ASCII text with Python's C escaper, against the encoder that
spells every escape out, over generated documents (non-ASCII and surrogates, floats, huge
integers, array-index keys, subclasses, nesting): the same bytes for every value."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from media_usage_orchestration.media.canonical import (
    CanonicalText,
    canonical_json,
    canonical_key_order,
    reference_canonical_json,
)

SURROGATES = ["\ud800", "\udbff\udc00", "\udfff", "a\ud83d", "\ud83d\ude00", "\udc00\ud800"]
ODD_TEXT = ["", '"', "\\", "\x00", "\x1f", "\x7f", "\b\f\n\r\t", "\u2028", "é", "\U0001f600"]
KEYS = st.one_of(
    st.sampled_from(["a", "B", "_", "0", "1", "10", "01", "4294967294", "4294967295", "é"]),
    st.sampled_from(["\ue000", "\U0001f600", *SURROGATES]),
    st.text(max_size=4),
)
TEXT = st.one_of(st.text(max_size=8), st.sampled_from(SURROGATES + ODD_TEXT))
INTEGERS = st.one_of(
    st.integers(min_value=-(2**53) - 2, max_value=2**53 + 2),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([2**53 - 1, 2**53, -(2**53) + 1, -(2**53), 10**21, 10**400]),
)
FLOATS = st.one_of(
    st.floats(),  # NaN and infinities included: both encoders print null
    st.sampled_from([0.0, -0.0, 1.0, 1e21, 1e-7, 123e-20, 5e-324, 1.7976931348623157e308]),
)
SCALARS = st.one_of(st.none(), st.booleans(), TEXT, INTEGERS, FLOATS)
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(inner, max_size=5).map(tuple),
        st.dictionaries(KEYS, inner, max_size=6),
    ),
    max_leaves=30,
)


@settings(max_examples=1500, deadline=None)
@given(DOCUMENTS)
def test_generated_documents_encode_as_the_spelled_out_encoder(document):
    assert canonical_json(document) == reference_canonical_json(document)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(KEYS, st.one_of(st.none(), st.booleans(), TEXT, INTEGERS), max_size=12))
def test_flat_objects_of_plain_scalars_encode_as_the_spelled_out_encoder(document):
    assert canonical_json(document) == reference_canonical_json(document)


PLAIN_SCALARS = st.one_of(st.none(), st.booleans(), TEXT, INTEGERS)


@settings(max_examples=1500, deadline=None)
@given(st.dictionaries(KEYS, st.one_of(PLAIN_SCALARS, FLOATS), max_size=12))
def test_objects_already_in_output_order_encode_as_the_spelled_out_encoder(document):
    """Fingerprint payloads list their keys in output order, which lets the C encoder print the
    whole object when every value is plain: lone surrogates, floats and unsafe integers among
    the values must still come out as JavaScript prints them."""
    ordered = {key: document[key] for key in canonical_key_order(tuple(document))}
    assert canonical_json(ordered) == reference_canonical_json(ordered)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"a": "\udc00", "b": 1}, '{"a":"\\udc00","b":1}'),
        ({"a": 2**53, "b": "x"}, '{"a":9007199254740992,"b":"x"}'),
        ({"a": 2.5, "b": None}, '{"a":2.5,"b":null}'),
        ({"0": True, "a": "\x1f\u2028é"}, '{"0":true,"a":"\\u001f\u2028é"}'),
    ],
)
def test_ordered_objects_with_values_the_c_encoder_would_misprint(value, text):
    assert canonical_json(value) == text == reference_canonical_json(value)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(st.none(), st.booleans(), TEXT, INTEGERS), max_size=12))
def test_flat_arrays_of_plain_scalars_encode_as_the_spelled_out_encoder(document):
    assert canonical_json(document) == reference_canonical_json(document)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"b": 1, "a": None, "10": True, "2": False}, '{"2":false,"10":true,"a":null,"b":1}'),
        ({"a": 2**53}, '{"a":9007199254740992}'),
        ({"a": 2**53 + 1}, '{"a":9007199254740992}'),
        ({"a": 1.0, "b": 1e-7}, '{"a":1,"b":1e-7}'),
        (["\ud800", "\ud83d\ude00"], '["\\ud800","\U0001f600"]'),
        ({"\udc00": "x"}, '{"\\udc00":"x"}'),
        ({"a": CanonicalText('{"kept":1}')}, '{"a":{"kept":1}}'),
        ([True, None, "\x00\u2028"], '[true,null,"\\u0000\u2028"]'),
    ],
)
def test_values_print_as_javascript_through_both_encoders(value, text):
    assert canonical_json(value) == text
    assert reference_canonical_json(value) == text


def test_deep_nesting_encodes_as_the_spelled_out_encoder():
    document: object = {"leaf": ["x", 1]}
    for depth in range(200):
        document = [document] if depth % 2 else {"k": document, "0": depth}
    assert canonical_json(document) == reference_canonical_json(document)
