"""PostgreSQL connections are pinged only after sitting idle, and a dead idle connection is
replaced transparently; connections used moments ago are not pinged at all."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from media_usage_orchestration.store.core import engine as engine_module
from media_usage_orchestration.store.core.engine import create_database_engine
from tests.conftest import postgres_schema, require_postgres


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
