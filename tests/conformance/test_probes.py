"""The work sensor's probe and the batch claim, as the scale of the work table needs them.

The probe answers the earliest due item in the seed's due order (due time, `updated_at`,
collection, content) reading one index entry per due state: on SQLite its plan sorts nothing
(a temporary B-tree over every due row took a second with a million rows). The batch claim's
candidates are locked `FOR UPDATE SKIP LOCKED` on PostgreSQL only.
"""

from __future__ import annotations

from sqlalchemy.dialects import postgresql, sqlite

from media_usage_orchestration.store.probes import earliest_due_work, earliest_due_work_statement
from media_usage_orchestration.store.work import _claim_batch_statement
from tests.support.databases import installed_database
from tests.support.factories import ago, expired, insert_works, leased


def test_the_earliest_due_item_follows_due_time_then_updated_at(db):
    insert_works(
        db.engine,
        [
            # same due time: the row updated first is first, whatever its id
            {"content_id": "b", "next_attempt_at": ago(60), "updated_at": ago(90)},
            {"content_id": "a", "next_attempt_at": ago(60), "updated_at": ago(30)},
            {"content_id": "c", "next_attempt_at": ago(10), "updated_at": ago(200)},
            {"content_id": "d", "state": "retry", "next_attempt_at": ago(5)},
            {"content_id": "e", **leased()},
        ],
    )

    due = earliest_due_work(db.engine)

    assert (due.content_id, due.lease_expired) == ("b", False)


def test_an_expired_lease_anywhere_is_reported_even_when_it_is_not_first(db):
    insert_works(
        db.engine,
        [
            {"content_id": "a", "next_attempt_at": ago(120)},
            {"content_id": "z", **expired(seconds_ago=1)},
        ],
    )

    due = earliest_due_work(db.engine)

    assert (due.content_id, due.lease_expired) == ("a", True)


def test_nothing_due_is_none(db):
    insert_works(db.engine, [{"content_id": "a", **leased()}])

    assert earliest_due_work(db.engine) is None


def test_the_probe_on_sqlite_reads_its_indexes_in_order_and_sorts_nothing(tmp_path):
    """SQLite's plan does not depend on statistics; PostgreSQL's does, and the bench times
    its probe over a million rows."""
    compiled = earliest_due_work_statement().compile(
        dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}
    )
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    with installed_database("sqlite", url) as db, db.engine.connect() as connection:
        plan = [row[-1] for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}")]

    assert not [step for step in plan if "TEMP B-TREE" in step], plan
    assert sum("idx__emdash_media_usage_work_due" in step for step in plan) == 2, plan
    assert sum("idx__emdash_media_usage_work_lease" in step for step in plan) == 1, plan


def test_batch_claims_skip_locked_rows_on_postgresql_only():
    def sql(dialect) -> str:
        return str(_claim_batch_statement(dialect.name, 5, 60, True).compile(dialect=dialect))

    assert sql(postgresql.dialect()).count("FOR UPDATE SKIP LOCKED") == 3
    assert "FOR UPDATE" not in sql(sqlite.dialect())
