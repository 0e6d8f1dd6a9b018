"""The work sensor's probe and the batch claim, as the scale of the work table needs them.

The probe answers, per collection present in the work table, its first claimable row of each
due state, reading a few index entries per collection: on SQLite its plan sorts nothing (a
temporary B-tree over every due row took a second with a million rows). The batch claim's
candidates are locked `FOR UPDATE SKIP LOCKED` on PostgreSQL only.
"""

from __future__ import annotations

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from media_usage_orchestration.store.reads.probes import (
    _due_work_by_collection_statement,
    due_work_by_collection,
)
from media_usage_orchestration.store.work.statements import (
    claim_batch_statement as _claim_batch_statement,
)
from tests.support.databases import installed_database
from tests.support.factories import (
    ago,
    backing_off,
    expired,
    failed,
    from_now,
    insert_works,
    leased,
)


def test_each_collection_with_claimable_work_is_found_earliest_due_first(db):
    insert_works(
        db.engine,
        [
            {
                "collection_id": "c-b",
                "collection_slug": "b",
                "content_id": "x",
                "next_attempt_at": ago(10),
            },
            {
                "collection_id": "c-a",
                "collection_slug": "a",
                "content_id": "y",
                "next_attempt_at": ago(60),
            },
            {"collection_id": "c-c", "collection_slug": "c", "content_id": "z", **leased()},
            {"collection_id": "c-d", "collection_slug": "d", "content_id": "w", **failed("X")},
            {
                "collection_id": "c-e",
                "collection_slug": "e",
                "content_id": "v",
                "state": "retry",
                **backing_off(),
            },
        ],
    )

    found = due_work_by_collection(db.engine, 10)

    assert [(due.collection_slug, due.lease_expired) for due in found] == [
        ("a", False),
        ("b", False),
    ]


def test_an_expired_lease_or_a_due_retry_makes_a_collection_due(db):
    insert_works(
        db.engine,
        [
            {"collection_id": "c-1", "collection_slug": "one", "content_id": "a", **expired()},
            {
                "collection_id": "c-2",
                "collection_slug": "two",
                "content_id": "b",
                "state": "retry",
                "next_attempt_at": ago(5),
            },
        ],
    )

    found = {due.collection_slug: due for due in due_work_by_collection(db.engine, 10)}

    assert set(found) == {"one", "two"}
    assert found["one"].lease_expired and not found["two"].lease_expired


def test_the_generation_moves_on_when_the_due_set_does(db):
    insert_works(db.engine, [{"content_id": "a", "next_attempt_at": ago(5)}])
    [before] = due_work_by_collection(db.engine, 10)

    insert_works(db.engine, [{"content_id": "b", "state": "retry", "next_attempt_at": ago(1)}])
    [after] = due_work_by_collection(db.engine, 10)

    assert before.generation != after.generation
    assert before.due_at == after.due_at  # the pending row is still the earliest


def test_nothing_claimable_is_an_empty_list(db):
    insert_works(
        db.engine,
        [{"content_id": "a", **leased()}, {"content_id": "b", "next_attempt_at": from_now(60)}],
    )

    assert due_work_by_collection(db.engine, 10) == []


def test_the_limit_bounds_the_collections_probed(db):
    insert_works(
        db.engine,
        [
            {"collection_id": f"c-{n}", "collection_slug": f"s{n}", "content_id": "a"}
            for n in range(5)
        ],
    )

    assert [due.collection_id for due in due_work_by_collection(db.engine, 3)] == [
        "c-0",
        "c-1",
        "c-2",
    ]


@pytest.mark.parametrize("limit", [0, 101, True, "5"])
def test_a_limit_outside_1_to_100_is_refused(db, limit):
    with pytest.raises(ValueError, match="Work collection limit"):
        due_work_by_collection(db.engine, limit)


def test_the_probe_on_sqlite_reads_its_indexes_and_sorts_nothing(tmp_path):
    """SQLite's plan does not depend on statistics; PostgreSQL's does, and the bench times
    its probe over a million rows."""
    compiled = _due_work_by_collection_statement(25).compile(
        dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}
    )
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    with installed_database("sqlite", url) as db, db.engine.connect() as connection:
        plan = [row[-1] for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}")]

    sorts = [step for step in plan if "TEMP B-TREE" in step and "ORDER BY" in step]
    assert len(sorts) <= 1, plan  # at most the final order of the (few) collections
    assert not [step for step in plan if step.startswith("SCAN _emdash_media_usage_work")], plan
    assert any("idx__emdash_media_usage_work_operator" in step for step in plan), plan
    assert any("idx__emdash_media_usage_work_lease" in step for step in plan), plan


def test_batch_claims_skip_locked_rows_on_postgresql_only():
    def sql(dialect) -> str:
        return str(_claim_batch_statement(dialect.name, 5, 60, True, True).compile(dialect=dialect))

    assert sql(postgresql.dialect()).count("FOR UPDATE SKIP LOCKED") == 3
    assert "FOR UPDATE" not in sql(sqlite.dialect())
