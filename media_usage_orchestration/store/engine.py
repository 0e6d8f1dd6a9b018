"""Engines for the two dialects, configured the way the correctness rules need them.

SQLite (embedded default): WAL so readers never block the writer, a generous busy timeout,
foreign keys on, and `BEGIN IMMEDIATE` for every transaction that may write: pysqlite's
deferred BEGIN would fail with SQLITE_BUSY at the first write without waiting.
PostgreSQL: psycopg 3, READ COMMITTED, one statement per guarded step, a plan per execution.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

DEFAULT_SQLITE_PATH = Path(".media_usage") / "media_usage.db"
DATABASE_URL_ENV = "MEDIA_USAGE_DATABASE_URL"
SQLITE_BUSY_TIMEOUT_MS = 30_000
_READ_ONLY = "media_usage_read_only"


def default_database_url() -> str:
    configured = os.environ.get(DATABASE_URL_ENV)
    if configured:
        return configured
    return f"sqlite:///{(Path.cwd() / DEFAULT_SQLITE_PATH).as_posix()}"


def normalize_url(url: str | URL) -> URL:
    """Accept `postgresql://` and `postgres://` as psycopg 3; refuse drivers we do not test."""
    parsed = make_url(url) if isinstance(url, str) else url
    backend, _, driver = parsed.drivername.partition("+")
    if backend in ("postgresql", "postgres"):
        if driver not in ("", "psycopg"):
            raise ValueError(
                "PostgreSQL URLs must use the psycopg 3 driver (postgresql+psycopg://)"
            )
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if driver not in ("", "pysqlite"):
            raise ValueError("SQLite URLs must use the standard sqlite3 driver (sqlite:///path)")
        if not parsed.database or parsed.database == ":memory:":
            raise ValueError("SQLite URLs must name a database file; processes share it")
        return parsed.set(drivername="sqlite")
    raise ValueError(f"Unsupported database URL scheme {parsed.drivername!r}")


def redacted_url(url: str | URL) -> str:
    """The URL as it may appear in logs, errors and run metadata: never with its password."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except Exception:  # an unparsable URL is shown as nothing rather than leaked
        return "<unparsable database URL>"
    return parsed.render_as_string(hide_password=True)


def compact_json(value) -> str:
    """JSON as EmDash writes it: no whitespace, non-ASCII kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def create_database_engine(url: str | URL, **engine_options) -> Engine:
    parsed = normalize_url(url)
    engine_options.setdefault("json_serializer", compact_json)
    if parsed.get_backend_name() == "sqlite":
        return _create_sqlite_engine(parsed, **engine_options)
    engine_options.setdefault("pool_pre_ping", True)
    return _create_postgres_engine(parsed, **engine_options)


def _create_postgres_engine(url: URL, **engine_options) -> Engine:
    engine = create_engine(url, **engine_options)

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection, _record):
        # psycopg prepares a statement after a few executions, and PostgreSQL may then keep a
        # generic plan chosen while a table was small: a work or source table that grows from
        # empty during a reconciliation would be scanned sequentially for the rest of the
        # session. Plans are therefore made for each execution (parsing is still saved).
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET plan_cache_mode = force_custom_plan")
        dbapi_connection.autocommit = autocommit

    return engine


def _create_sqlite_engine(url: URL, **engine_options) -> Engine:
    Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, **engine_options)

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection, _record):
        # Driver-level autocommit: SQLAlchemy's "begin" event below decides how to BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        # A 16 MiB page cache keeps the sources/occurrences indexes warm during bulk projection,
        # and checkpointing every ~40 MiB of WAL instead of every 4 MiB batches that work.
        cursor.execute("PRAGMA cache_size=-16384")
        cursor.execute("PRAGMA wal_autocheckpoint=10000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection):
        read_only = connection.get_execution_options().get(_READ_ONLY, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


@contextlib.contextmanager
def read_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that only reads: on SQLite it takes no write lock."""
    with engine.connect() as connection:
        connection = connection.execution_options(**{_READ_ONLY: True})
        with connection.begin():
            yield connection


def is_postgres(bind: Engine | Connection) -> bool:
    return bind.dialect.name == "postgresql"


def is_missing_table(error: DBAPIError) -> bool:
    """The statement failed because a table does not exist (on either dialect)."""
    original = error.orig
    return getattr(original, "sqlstate", None) == "42P01" or "no such table" in str(original)


def sqlite_database_file(url: str | URL) -> str | None:
    """The file a SQLite URL names; None for any other database (or an in-memory one)."""
    parsed = make_url(url) if isinstance(url, str) else url
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return parsed.database


# SQLAlchemy's types and errors that code outside store/ names, re-exported so that only
# store/ (and the database resource) import SQLAlchemy.
__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_SQLITE_PATH",
    "SQLITE_BUSY_TIMEOUT_MS",
    "URL",
    "ArgumentError",
    "Connection",
    "DBAPIError",
    "Engine",
    "SQLAlchemyError",
    "compact_json",
    "create_database_engine",
    "default_database_url",
    "is_missing_table",
    "is_postgres",
    "make_url",
    "normalize_url",
    "read_transaction",
    "redacted_url",
    "sqlite_database_file",
]
