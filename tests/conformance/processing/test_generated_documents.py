"""Generated JSON documents (deep, wide, wrong types, lone surrogates, huge numbers, any
unicode) as field values, through the work path on both dialects: nothing escapes, each entry
is indexed exactly as extraction computes from the same document (or fails with a stable code),
and `verify` agrees."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import MEDIA_FIELDS
from media_usage_orchestration.media.extraction import extract_occurrences
from media_usage_orchestration.media.fields import discover_fields
from media_usage_orchestration.processing.integrity.verify import OCCURRENCE_COLUMNS, verify_index
from media_usage_orchestration.processing.work.processor import process_due_batch
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.host.content import field_rows
from tests.support.projection import active_collection, canonical_key
from tests.support.states import all_rows

STABLE_CODES = {
    "MEDIA_USAGE_PROCESSING_FAILED",
    "MEDIA_USAGE_SNAPSHOT_FAILED",
    "MEDIA_USAGE_RESOURCE_LIMIT",
}
TEXT_COLUMNS = ("hero", "attachment")  # media objects as JSON text, as EmDash stores them
JSON_COLUMNS = ("body", "gallery")
ODD_STRINGS = ["\ud800", "\udfff", "\ud83d\ude00", "\x00", "\u2028", " ", "/x", "https://a", ""]
HUGE_INTEGER = "9" * 5000

ids = st.one_of(st.sampled_from(["m1", "m2", " m3 ", *ODD_STRINGS]), st.text(max_size=8))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.sampled_from(ODD_STRINGS),
)
media = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(ids, scalars),
        "_ref": ids,
        "provider": st.sampled_from(["local", "external", "s3", " ", 3]),
        "mimeType": st.sampled_from(["image/png", "IMAGE/JPEG; q=1", "application/pdf", "x", 1]),
    },
)
blocks = st.fixed_dictionaries(
    {"_type": st.sampled_from(["image", "block", "Image"])}, optional={"asset": media}
)
anything = st.recursive(
    st.one_of(scalars, media, blocks),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
field_values = {
    "hero": st.one_of(media, ids, anything),
    "attachment": st.one_of(media, ids, anything),
    "body": st.one_of(st.lists(st.one_of(blocks, anything), max_size=4), anything),
    "gallery": st.one_of(
        st.lists(st.one_of(st.fixed_dictionaries({"image": media}), anything), max_size=4),
        anything,
    ),
}
documents = st.fixed_dictionaries(
    {slug: st.one_of(st.just(None), value) for slug, value in field_values.items()}
)
depths = st.sampled_from([0, 0, 1, 50, 3000])


def padded(value: Any, depth: int) -> tuple[Any, str]:
    """`value` and its JSON text; a list gets a `depth`-deep nest of arrays (holding a huge
    integer) appended, too deep for Python's own JSON modules, built without recursion."""
    body = json.dumps(value)
    if not isinstance(value, list) or depth == 0:
        return value, body
    nest: list[Any] = [float("inf")]
    for _ in range(depth - 1):
        nest = [nest]
    inner = "[" * depth + HUGE_INTEGER + "]" * depth
    return [*value, nest], body[:-1] + ("," if value else "") + inner + "]"


def as_read(slug: str, value: Any, stored: str) -> Any:
    """What the snapshot decodes: a TEXT column's string is used as-is unless it is JSON
    object or array text; a JSON column's value is the document (only arrays and objects can
    hold references there)."""
    if value is None:
        return None
    if slug in TEXT_COLUMNS:
        return value if isinstance(value, dict | list) else stored
    return value


def storable(value: str) -> bool:
    """Text every database's TEXT column can hold (a lone surrogate or NUL can only be a JSON
    escape there)."""
    return "\x00" not in value and not any("\ud800" <= char <= "\udfff" for char in value)


def write_document(db, content_id: str, stored: dict[str, str | None]) -> None:
    CmsWriter(db.engine).insert_entry(
        "posts", {"id": content_id, "slug": content_id, "status": "published", "title": "t"}
    )
    cast = "CAST(:{0} AS json)" if db.is_postgres else ":{0}"
    assignments = ", ".join(
        f"{slug} = {cast.format(slug) if slug in JSON_COLUMNS else ':' + slug}" for slug in stored
    )
    with db.engine.begin() as connection:
        connection.execute(
            text(f"UPDATE ec_posts SET {assignments} WHERE id = :id"), {**stored, "id": content_id}
        )


def drain_work(engine) -> None:
    while process_due_batch(engine, 25).counts.claimed:
        pass


def indexed_rows(engine, key: str) -> list[tuple]:
    rows = all_rows(engine, schema.occurrences, source_key=key)
    return sorted((tuple(row[name] for name in OCCURRENCE_COLUMNS) for row in rows), key=repr)


def test_generated_documents_are_indexed_as_extraction_computes(db):
    posts = active_collection(db.engine, "posts", MEDIA_FIELDS)
    with db.engine.connect() as connection:
        discovery = discover_fields(field_rows(connection, "posts", posts.id))
    numbers = itertools.count()
    failed: set[str] = set()

    @settings(
        max_examples=60,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(document=documents, depth=depths)
    def check(document: dict[str, Any], depth: int) -> None:
        content_id = f"entry-{next(numbers)}"
        read: dict[str, Any] = {}
        stored: dict[str, str | None] = {}
        for slug, value in document.items():
            if slug in TEXT_COLUMNS and isinstance(value, str) and storable(value):
                stored[slug], read[slug] = value, value
                continue
            value, stored_text = padded(value, depth if slug == "body" else 0)
            stored[slug] = None if value is None else stored_text
            read[slug] = as_read(slug, value, stored_text)
        write_document(db, content_id, stored)

        drain_work(db.engine)

        left = all_rows(db.engine, schema.work, content_id=content_id)
        if left:
            (row,) = left
            assert row["last_error_code"] in STABLE_CODES, row
            failed.add(content_id)
            return
        expected = sorted(
            (
                tuple(o.row_values()[name] for name in OCCURRENCE_COLUMNS)
                for o in extract_occurrences(discovery.extraction_fields, read)
            ),
            key=repr,
        )
        assert indexed_rows(db.engine, canonical_key(posts, content_id)) == expected

    check()

    report = verify_index(db.engine)
    assert {difference.content_id for difference in report.differences} <= failed
