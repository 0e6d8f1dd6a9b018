"""Ids generated in blocks, and one statement run for many rows through the driver."""

from __future__ import annotations

import random
import time

import pytest
from sqlalchemy import bindparam, insert, select
from ulid import ULID

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.sources.rows import execute_many
from media_usage_orchestration.values.source_records import new_ulids, ulid_text


def test_ulid_text_is_the_library_encoding():
    spread = (random.getrandbits(bits) for bits in range(1, 129) for _ in range(4))
    for value in (0, 1, 2**80 - 1, 2**128 - 1, *(int(ULID()) for _ in range(200)), *spread):
        assert ulid_text(value) == str(ULID.from_int(value))


def test_a_block_of_ulids_is_distinct_ascending_and_of_this_millisecond():
    before = time.time_ns() // 1_000_000
    ids = new_ulids(500)
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == 500 and ids == sorted(ids)
    stamps = {ULID.from_str(each).milliseconds for each in ids}
    assert len(stamps) == 1 and before <= stamps.pop() <= after
    assert new_ulids(0) == []
    assert set(new_ulids(50)).isdisjoint(ids)


def _occurrence(index: int, generation: str) -> dict:
    return {
        "id": f"occurrence-{index}",
        "source_key": "content:c:e:columns",
        "generation": generation,
        "field_slug": "hero",
        "field_path": f"hero[{index}]",
        "occurrence_index": index,
        "reference_type": "image_field",
        "media_id": None if index % 2 else f"m{index}",
        "provider": "local",
        "provider_asset_id": f"m{index}",
        "media_kind": "image",
        "mime_type": "image/png",
        "created_at": "2026-01-01T00:00:00.000Z",
    }


def test_rows_are_inserted_as_given(db):
    rows = [_occurrence(index, "g1") for index in range(7)]
    with db.engine.begin() as connection:
        execute_many(connection, insert(schema.occurrences), rows, tuple(rows[0]))
        execute_many(connection, insert(schema.occurrences), [], ("id",))
        stored = connection.execute(
            select(*(schema.occurrences.c[name] for name in rows[0])).order_by(
                schema.occurrences.c.occurrence_index
            )
        )
        assert [dict(row._mapping) for row in stored] == rows


def test_a_statement_keeps_its_own_values_and_conditions_per_row(db):
    """Each row runs the whole statement: its literal comparisons stay bound as written."""
    rows = [_occurrence(index, "g2") for index in range(4)]
    with db.engine.begin() as connection:
        execute_many(connection, insert(schema.occurrences), rows, tuple(rows[0]))
        statement = (
            schema.occurrences.update()
            .where(
                schema.occurrences.c.id == bindparam("row_id"),
                schema.occurrences.c.generation == "g2",
            )
            .values(mime_type=bindparam("row_mime"))
        )
        execute_many(
            connection,
            statement,
            [{"row_id": "occurrence-1", "row_mime": "image/gif"}, {"row_id": "x", "row_mime": "y"}],
        )
        stored = connection.execute(select(schema.occurrences.c.id, schema.occurrences.c.mime_type))
        mimes = {row.id: row.mime_type for row in stored}
    assert mimes == {
        "occurrence-0": "image/png",
        "occurrence-1": "image/gif",
        "occurrence-2": "image/png",
        "occurrence-3": "image/png",
    }


def test_a_statement_with_expanding_parameters_is_refused(db):
    statement = schema.occurrences.delete().where(
        schema.occurrences.c.id.in_(bindparam("ids", expanding=True))
    )
    with db.engine.begin() as connection, pytest.raises(ValueError, match="expand"):
        execute_many(connection, statement, [{"ids": ["a"]}])
