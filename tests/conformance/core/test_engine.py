"""PostgreSQL connections are pinged only after sitting idle, and a dead idle connection is
replaced transparently; connections used moments ago are not pinged at all.

Reads and single-statement writes skip BEGIN/COMMIT on PostgreSQL (two round trips each),
and the pooled connection they used goes back to ordinary transactions afterwards. The
project's PostgreSQL sessions carry its name in `pg_stat_activity`.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from media_usage_orchestration.store.core import engine as engine_module
from media_usage_orchestration.store.core.engine import (
    APPLICATION_NAME,
    create_database_engine,
    read_transaction,
    single_statement,
)
from tests.support.databases import postgres_schema, require_postgres


@pytest.fixture
def pg_engine():
    require_postgres()
    with postgres_schema() as url:
        engine = create_database_engine(url)
        try:
            yield engine
        finally:
            engine.dispose()


def _backend_pid(engine) -> int:
    with engine.connect() as connection:
        return connection.execute(text("SELECT pg_backend_pid()")).scalar_one()


def test_busy_connections_are_not_pinged(pg_engine):
    _backend_pid(pg_engine)
    pinged: list[object] = []
    original = pg_engine.dialect.do_ping
    pg_engine.dialect.do_ping = lambda connection: pinged.append(connection) or original(connection)
    for _ in range(20):
        with pg_engine.begin() as connection:
            connection.execute(text("SELECT 1"))
    assert pinged == []


def test_an_idle_dead_connection_is_replaced_before_use(pg_engine, monkeypatch):
    first = _backend_pid(pg_engine)
    with create_database_engine(pg_engine.url).connect() as admin:
        admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
        admin.commit()
    # Backdate the idle clock instead of sleeping: the pooled connection now looks idle.
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_SECONDS", -1.0)
    second = _backend_pid(pg_engine)
    assert second != first


def test_without_the_idle_ping_a_dead_connection_fails_its_statement(pg_engine):
    """The ping is what saves the idle case above: a connection used moments ago is trusted,
    so its failure surfaces as a transient disconnect (which the steps retry)."""
    from media_usage_orchestration.store.core.engine import is_transient_database_error

    first = _backend_pid(pg_engine)
    with create_database_engine(pg_engine.url).connect() as admin:
        admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
        admin.commit()
    with pytest.raises(Exception) as failure:
        _backend_pid(pg_engine)
    assert is_transient_database_error(failure.value)
    assert _backend_pid(pg_engine) != first


# ==================================================================================================
# Round trips: reads and single statements without BEGIN/COMMIT on PostgreSQL
# ==================================================================================================


def _autocommit(connection) -> bool:
    """Whether the driver runs statements outside a transaction block right now."""
    dbapi_connection = connection.connection.dbapi_connection
    if hasattr(dbapi_connection, "autocommit") and connection.dialect.name == "postgresql":
        return bool(dbapi_connection.autocommit)
    return not dbapi_connection.in_transaction


def test_reads_and_single_statements_run_without_a_transaction_block_on_postgres(db):
    with read_transaction(db.engine) as connection:
        read_autocommit = _autocommit(connection)
        connection.execute(text("SELECT 1"))
    with single_statement(db.engine) as connection:
        write_autocommit = _autocommit(connection)
        connection.execute(
            text("UPDATE _emdash_media_usage_activation SET updated_at = updated_at")
        )
    assert read_autocommit is write_autocommit is db.is_postgres


def test_the_pooled_connection_returns_to_transactions_after_a_single_statement(db):
    with single_statement(db.engine) as connection:
        connection.execute(text("SELECT 1"))
    with db.engine.begin() as connection:
        connection.execute(text("UPDATE _emdash_media_usage_activation SET updated_at = 'x'"))
        assert not _autocommit(connection)
        connection.rollback()
    with db.engine.connect() as connection:
        values = connection.execute(text("SELECT updated_at FROM _emdash_media_usage_activation"))
        assert "x" not in [row[0] for row in values]


# ==================================================================================================
# Session names
# ==================================================================================================


def _application_name(engine) -> str:
    with engine.connect() as connection:
        return connection.execute(text("SELECT current_setting('application_name')")).scalar_one()


def test_postgres_sessions_are_named_after_the_project_unless_told_otherwise(pg_engine):
    assert _application_name(pg_engine) == APPLICATION_NAME
    by_caller = create_database_engine(pg_engine.url, connect_args={"application_name": "mine"})
    by_url = create_database_engine(pg_engine.url.update_query_dict({"application_name": "url"}))
    try:
        assert (_application_name(by_caller), _application_name(by_url)) == ("mine", "url")
    finally:
        by_caller.dispose()
        by_url.dispose()
