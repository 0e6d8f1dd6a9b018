"""The unit tier needs no database: any connection a unit test opens fails it.

Input validation is tested here against `no_sql_engine`, an engine of each dialect that never
reaches a server: bad input must be refused before the repository sends any SQL, so nothing
can have changed. Whatever the code under test does with the error, the attempt is recorded
and fails the test at teardown.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, event

from media_usage_orchestration.store.core.engine import create_database_engine

# Never opened: a connection attempt is refused before the driver is called.
NO_SQL_URLS = {
    "sqlite": "sqlite:///unit-tests-open-no-database.db",
    "postgres": "postgresql+psycopg://unit-tests@no-sql.invalid/none",
}


class SqlAttempted(AssertionError):
    """A unit test tried to reach a database."""


@pytest.fixture(autouse=True)
def refuse_connections() -> Iterator[list[str]]:
    """Every engine of the process refuses to connect during a unit test."""
    attempts: list[str] = []

    def refuse(dialect, conn_rec, cargs, cparams):
        attempts.append(f"{dialect.name} connection")
        raise SqlAttempted(f"a unit test tried to connect to a {dialect.name} database")

    event.listen(Engine, "do_connect", refuse)
    try:
        yield attempts
    finally:
        event.remove(Engine, "do_connect", refuse)
    assert attempts == [], f"the unit tier sends no SQL, but this test tried: {attempts}"


@pytest.fixture
def no_sql_engine(dialect) -> Iterator[Engine]:
    """An engine of the test's dialect (SQLite or PostgreSQL) that never connects."""
    engine = create_database_engine(NO_SQL_URLS[dialect])
    try:
        yield engine
    finally:
        engine.dispose()
