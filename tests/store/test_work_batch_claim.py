"""A batch claim's cost does not grow with the backlog: each due state is read by walking its
index in due order, never by sorting every due row."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from media_usage_orchestration.store.work import WorkRepository, _walk_due_indexes_in_order
from tests.factories import insert_works

DUE_INDEX = "idx__emdash_media_usage_work_due"
LEASE_INDEX = "idx__emdash_media_usage_work_lease"


def backlog(engine, size: int = 400) -> None:
    """Due work of two collections, with retries and expired leases among it."""
    rows = []
    for index in range(size):
        row = {
            "collection_id": f"collection-{index % 2}",
            "content_id": f"entry-{index:04d}",
            "next_attempt_at": f"2000-01-01T00:{index // 60 % 60:02d}:{index % 60:02d}.000Z",
        }
        if index % 10 == 1:
            row["state"] = "retry"
        elif index % 10 == 2:
            row.update(state="leased", lease_token="gone", lease_expires_at=row["next_attempt_at"])
        rows.append(row)
    insert_works(engine, rows)


def plan_lines(db, collection_id: str | None) -> list[str]:
    """The plan of the claim statement `claim_due_batch` sends (captured as sent)."""
    sent = []

    def capture(_connection, _cursor, statement, parameters, _context, _many):
        if statement.startswith("UPDATE _emdash_media_usage_work"):
            sent.append((statement, parameters))

    event.listen(db.engine, "before_cursor_execute", capture)
    try:
        WorkRepository(db.engine).claim_due_batch(50, 60, collection_id)
    finally:
        event.remove(db.engine, "before_cursor_execute", capture)
    ((statement, parameters),) = sent
    with db.engine.connect() as connection, connection.begin():
        if db.is_postgres:
            _walk_due_indexes_in_order(connection)
            rows = connection.exec_driver_sql("EXPLAIN " + statement, parameters)
            return [row[0] for row in rows]
        rows = connection.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)
        return [row[-1] for row in rows]


@pytest.mark.parametrize("collection_id", [None, "collection-1"], ids=["any", "one-collection"])
def test_each_due_state_is_walked_through_its_index(db, collection_id):
    backlog(db.engine)

    lines = plan_lines(db, collection_id)

    plan = "\n".join(lines)
    for branch, index in (("pending", DUE_INDEX), ("retry", DUE_INDEX), ("leased", LEASE_INDEX)):
        reads = [line for line in lines if f"{branch}_work" in line]
        assert reads and all(index in line for line in reads), plan
    assert "Bitmap" not in plan, plan


def test_a_claim_takes_the_first_due_rows_of_its_collection_from_a_large_backlog(db):
    backlog(db.engine)
    repository = WorkRepository(db.engine)

    claimed = repository.claim_due_batch(50, 60, "collection-1")

    expected = sorted(
        (f"entry-{index:04d}" for index in range(400) if index % 2 == 1),
        key=lambda content_id: int(content_id[-4:]),
    )[:50]
    assert [record.content_id for record in claimed] == expected
    assert {record.collection_id for record in claimed} == {"collection-1"}


def test_a_claim_made_while_capture_is_active_claims_nothing_when_it_is_not(db, activated):
    """`db` has capture `expanded`; `activated` makes it active: the guarded claim reads the
    activation row in its own transaction."""
    backlog(db.engine, size=20)
    repository = WorkRepository(db.engine)
    with db.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE _emdash_media_usage_activation SET state = 'expanded'")

    assert repository.claim_due_batch(10, 60, while_capture_active=True) is None
    assert repository.find_due_work(100) and len(repository.find_due_work(100)) == 20

    with db.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE _emdash_media_usage_activation SET state = 'active'")
    claimed = repository.claim_due_batch(10, 60, while_capture_active=True)
    assert claimed is not None and len(claimed) == 10
