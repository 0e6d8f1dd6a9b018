"""Reads and single-statement writes skip BEGIN/COMMIT on PostgreSQL (two round trips each),
and the pooled connection they used goes back to ordinary transactions afterwards."""

from __future__ import annotations

from sqlalchemy import text

from media_usage_orchestration.store.core.engine import read_transaction, single_statement


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
