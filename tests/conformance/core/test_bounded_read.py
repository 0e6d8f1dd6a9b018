"""`bounded_read`: a read cancelled at its time limit raises StatementTimedOut and changes
nothing; a read within it answers; the connection goes back to the pool usable, its limit
gone (on both dialects)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from media_usage_orchestration.store.core.engine import StatementTimedOut, bounded_read

# A statement that runs for seconds on either dialect: counting to fifty million.
SLOW = text(
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000000) "
    "SELECT count(*) FROM n"
)


def test_a_read_past_its_limit_is_cancelled_and_the_connection_stays_usable(db):
    started = time.monotonic()
    with (
        pytest.raises(StatementTimedOut, match=r"longer than 0\.2 s"),
        bounded_read(db.engine, 0.2) as connection,
    ):
        connection.execute(SLOW)
    assert time.monotonic() - started < 5

    with bounded_read(db.engine, 5) as connection:
        assert connection.execute(text("SELECT 1")).scalar_one() == 1
    # The limit was the transaction's alone: a plain read afterwards is not bounded by it.
    with db.engine.connect() as connection:
        if db.engine.dialect.name == "postgresql":
            assert connection.exec_driver_sql("SHOW statement_timeout").scalar_one() == "0"
        assert connection.execute(text("SELECT 2")).scalar_one() == 2


def test_other_errors_pass_through_unchanged(db):
    from sqlalchemy.exc import DBAPIError

    with pytest.raises(DBAPIError), bounded_read(db.engine, 5) as connection:
        connection.execute(text("SELECT * FROM no_such_table"))
