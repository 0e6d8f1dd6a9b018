"""Engines for the two dialects, configured the way the correctness rules need them.

SQLite (embedded default): WAL so readers never block the writer, a generous busy timeout,
foreign keys on, and `BEGIN IMMEDIATE` for every transaction that may write: pysqlite's
deferred BEGIN would fail with SQLITE_BUSY at the first write without waiting.
PostgreSQL: psycopg 3, READ COMMITTED, one statement per guarded step, a plan per execution,
sessions named `APPLICATION_NAME` in `pg_stat_activity` (unless the URL or the caller names them).
Both: statement errors never carry bound values (lease and run tokens are bound parameters).

A read-only engine (`read_only=True`, for verbs that only look) changes nothing: SQLite opens
the existing file with `mode=ro` (no directory, no new file, no WAL switch), PostgreSQL
sessions default to read-only transactions.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
    TimeoutError,
)

from media_usage_orchestration.values.errors import DatabaseFileError, StatementTimedOut
from media_usage_orchestration.values.json_text import parse_json

DEFAULT_SQLITE_PATH = Path(".media_usage") / "media_usage.db"
DATABASE_URL_ENV = "MEDIA_USAGE_DATABASE_URL"
SQLITE_BUSY_TIMEOUT_MS = 30_000
# A pooled PostgreSQL connection idle this long is pinged before use; one used more recently
# is trusted (a failure then is a transient error, which the steps retry).
PING_AFTER_IDLE_SECONDS = 10.0
# How the project's PostgreSQL sessions appear in `pg_stat_activity` and the server's logs.
APPLICATION_NAME = "media_usage_orchestration"
_IDLE_SINCE = "media_usage_idle_since"
_READ_ONLY = "media_usage_read_only"
# Query parameters whose values are never shown: libpq's password settings, the password
# file's location, and `options`, which passes arbitrary server settings.
SECRET_QUERY_KEYS = frozenset({"password", "passfile", "sslpassword", "options"})
_HIDDEN = "***"
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]+@")
_PASSWORD_SETTING = re.compile(r"((?:password|passfile|options)\s*=\s*)[^\s&]+", re.IGNORECASE)


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


def _parsed(url: str | URL) -> URL | None:
    try:
        return make_url(url) if isinstance(url, str) else url
    except Exception:  # an unparsable URL has nothing we could show or find
        return None


def _secret_query_keys(parsed: URL) -> list[str]:
    return [key for key in parsed.query if key.lower() in SECRET_QUERY_KEYS]


def redacted_url(url: str | URL) -> str:
    """The URL as it may appear in output, logs, errors and run metadata: its password and
    the values of its secret query parameters (`SECRET_QUERY_KEYS`) replaced by ***."""
    parsed = _parsed(url)
    if parsed is None:
        return "<unparsable database URL>"
    hidden = parsed.update_query_dict({key: _HIDDEN for key in _secret_query_keys(parsed)})
    rendered = hidden.render_as_string(hide_password=True)
    return rendered.replace(quote_plus(_HIDDEN), _HIDDEN)


def url_secrets(url: str | URL) -> list[str]:
    """Every secret the URL carries (its password, its secret query values), in each spelling
    a message might quote it, longest first so that a secret containing another is hidden
    whole."""
    parsed = _parsed(url)
    if parsed is None:
        return []
    values = [parsed.password] if parsed.password else []
    for key in _secret_query_keys(parsed):
        value = parsed.query[key]
        values.extend([value] if isinstance(value, str) else value)
    spellings = {
        spelling
        for value in values
        if value
        for spelling in (value, quote_plus(value), quote(value, safe=""))
    }
    return sorted(spellings, key=len, reverse=True)


def scrubbed(message: str, url: str | URL | None) -> str:
    """A message as it may be shown: without the URL's secrets wherever they appear (inside
    the URL, alone, or as a `password=` setting quoted by a driver), nor any other URL's
    password."""
    if url:
        if isinstance(url, str):
            message = message.replace(url, redacted_url(url))
        for secret in url_secrets(url):
            message = message.replace(secret, _HIDDEN)
    message = _URL_PASSWORD.sub(rf"\1{_HIDDEN}@", message)
    return _PASSWORD_SETTING.sub(rf"\1{_HIDDEN}", message)


def database_error_message(error: SQLAlchemyError) -> str:
    """The driver's own first line (not the SQL, which only repeats what the caller ran)."""
    original = getattr(error, "orig", None) or error
    lines = str(original).strip().splitlines() or [""]
    message = f"Database error ({type(original).__name__}): {lines[0]}"
    if isinstance(error, DBAPIError) and is_missing_table(error):
        message += "; is the schema installed? Run `media-usage init`"
    return message


def compact_json(value) -> str:
    """JSON as EmDash writes it: no whitespace, non-ASCII kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def create_database_engine(url: str | URL, *, read_only: bool = False, **engine_options) -> Engine:
    parsed = normalize_url(url)
    engine_options.setdefault("json_serializer", compact_json)
    # PostgreSQL json values are decoded by the driver: as `JSON.parse` would, at any depth.
    engine_options.setdefault("json_deserializer", parse_json)
    # A failed statement's message names the SQL, never its values: lease and run tokens are
    # bound parameters, and failure messages reach run logs and the UI.
    engine_options.setdefault("hide_parameters", True)
    if parsed.get_backend_name() == "sqlite":
        if read_only:
            return _create_read_only_sqlite_engine(parsed, **engine_options)
        return _create_sqlite_engine(parsed, **engine_options)
    return _create_postgres_engine(parsed, read_only, **engine_options)


def _create_postgres_engine(url: URL, read_only: bool, **engine_options) -> Engine:
    connect_args = dict(engine_options.pop("connect_args", None) or {})
    if "application_name" not in url.query:
        connect_args.setdefault("application_name", APPLICATION_NAME)
    engine = create_engine(url, connect_args=connect_args, **engine_options)
    _ping_after_idle(engine)

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
            if read_only:
                cursor.execute("SET default_transaction_read_only = on")
        dbapi_connection.autocommit = autocommit

    return engine


def _ping_after_idle(engine: Engine) -> None:
    """Ping a pooled connection only when it sat idle for `PING_AFTER_IDLE_SECONDS`.

    SQLAlchemy's `pool_pre_ping` costs a round trip per checkout, and a step checks out a
    connection per transaction: that was one statement in three. A connection that failed the
    ping is discarded and the pool connects afresh (a `DisconnectionError` from `checkout`)."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_connection, record):
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection, record, _proxy):
        idle_since = record.info.pop(_IDLE_SINCE, None)
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as error:  # any failure means the connection cannot be trusted
            raise DisconnectionError("idle connection failed its ping") from error


def _create_sqlite_engine(url: URL, **engine_options) -> Engine:
    directory = Path(url.database).parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DatabaseFileError(
            f"cannot create the directory {directory} for the SQLite file: {error.strerror}"
        ) from None
    engine = create_engine(url, **engine_options)

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection, _record):
        cursor = _configure_sqlite_connection(dbapi_connection)
        cursor.execute("PRAGMA journal_mode=WAL")
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


def _create_read_only_sqlite_engine(url: URL, **engine_options) -> Engine:
    """The existing file, opened `mode=ro`: no directory or file is created and the journal
    mode stays what its owner chose (a WAL database may gain its usual -wal/-shm files).
    Like every engine it connects on first use, so bad input is refused before that."""
    path = Path(url.database)
    uri = f"file:{quote(str(path.absolute()), safe='/')}?mode=ro"

    def connect() -> sqlite3.Connection:
        if not path.is_file():
            raise DatabaseFileError(
                f"no SQLite database file at {path}: check the URL, or run `media-usage init`"
            )
        return sqlite3.connect(uri, uri=True, check_same_thread=False)

    engine = create_engine(url, creator=connect, **engine_options)

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection, _record):
        cursor = _configure_sqlite_connection(dbapi_connection)
        cursor.execute("PRAGMA query_only=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection):
        connection.exec_driver_sql("BEGIN")

    return engine


def _configure_sqlite_connection(dbapi_connection) -> sqlite3.Cursor:
    # Driver-level autocommit: SQLAlchemy's "begin" event decides how to BEGIN.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    return cursor


@contextlib.contextmanager
def read_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that only reads: on SQLite it takes no write lock (one snapshot for all
    its statements). On PostgreSQL its statements run without BEGIN and COMMIT: under READ
    COMMITTED each statement reads its own snapshot either way, so the two round trips would
    buy nothing. Row locks (`FOR SHARE`) belong in `engine.begin()`, never here."""
    with _without_transaction_block_on_postgres(engine, read_only=True) as connection:
        yield connection


# PostgreSQL's SQLSTATE for a statement cancelled by statement_timeout.
_QUERY_CANCELED = "57014"
# SQLite asks the progress handler every this many virtual machine instructions.
_SQLITE_PROGRESS_STEPS = 10_000


@contextlib.contextmanager
def bounded_read(engine: Engine, seconds: float) -> Iterator[Connection]:
    """A read transaction whose statements are cancelled once `seconds` have passed
    (StatementTimedOut): PostgreSQL's `statement_timeout` for this transaction alone (SET
    LOCAL), SQLite's progress handler against a deadline from the transaction's start. For a
    report that may be slow on some database (a large library, tables without planner
    statistics) and must not hold up what comes after it."""
    with engine.connect() as connection, connection.begin():
        driver = connection.connection.driver_connection
        if is_postgres(connection):
            milliseconds = max(1, round(seconds * 1000))
            connection.exec_driver_sql(f"SET LOCAL statement_timeout = {milliseconds}")
        else:
            deadline = time.monotonic() + seconds
            driver.set_progress_handler(
                lambda: int(time.monotonic() > deadline), _SQLITE_PROGRESS_STEPS
            )
        try:
            yield connection
        except OperationalError as error:
            if not _cancelled(error):
                raise
            raise StatementTimedOut(
                f"a read took longer than {seconds:g} s and was cancelled"
            ) from error
        finally:
            if not is_postgres(connection):
                driver.set_progress_handler(None, 0)


def prefer_linear_plans(connection: Connection) -> None:
    """For the rest of this transaction, PostgreSQL plans joins as hash or merge joins only:
    linear in the tables whatever the planner's statistics say (none after a bulk load, or
    taken while the tables were small, when a nested loop over a full scan looks cheap and
    takes hours). For reports that read whole tables; SQLite's planner needs no such hint."""
    if is_postgres(connection):
        connection.exec_driver_sql("SET LOCAL enable_nestloop = off")


def _cancelled(error: OperationalError) -> bool:
    if getattr(error.orig, "sqlstate", None) == _QUERY_CANCELED:
        return True
    return isinstance(error.orig, sqlite3.OperationalError) and "interrupted" in str(error.orig)


@contextlib.contextmanager
def single_statement(engine: Engine) -> Iterator[Connection]:
    """For a write that is exactly one statement, atomic by itself with its guard in its own
    WHERE clause: on PostgreSQL it runs without BEGIN and COMMIT, two round trips fewer;
    SQLite takes its write lock as `engine.begin()` does. Never run a second statement in it."""
    with _without_transaction_block_on_postgres(engine, read_only=False) as connection:
        yield connection


@contextlib.contextmanager
def guarded_writes_together(engine: Engine) -> Iterator[Connection]:
    """A transaction for a few guarded statements that commit together (one commit, where each
    would pay its own): repositories constructed on this connection run their reads and
    single statements in it. Each statement still carries its own guard; the caller rolls the
    transaction back when a later guard refused, so the group lands whole or not at all."""
    with engine.connect() as connection, connection.begin():
        yield connection


@contextlib.contextmanager
def _without_transaction_block_on_postgres(engine: Engine | Connection, *, read_only: bool):
    """A connection inside `begin()`: on SQLite that is `BEGIN` (read-only) or `BEGIN
    IMMEDIATE`; on PostgreSQL the driver runs each statement on its own (autocommit). Given
    a connection (`guarded_writes_together`), the statements run in its transaction."""
    if isinstance(engine, Connection):
        yield engine
        return
    with engine.connect() as connection:
        if is_postgres(connection):
            connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        connection = connection.execution_options(**{_READ_ONLY: read_only})
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
# The errors of a database that cannot be reached at all (as opposed to a failed statement).
CONNECTION_ERRORS = (OperationalError, InterfaceError)

_TRANSIENT_SQLSTATES = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now
    "08000",
    "08003",
    "08006",
}
_TRANSIENT_MESSAGES = (
    "database is locked",
    "database table is locked",
    "server closed the connection",
    "connection refused",
    "could not connect",
)


def is_transient_database_error(error: BaseException) -> bool:
    """Briefly unreachable, busy, or a deadlock victim: safe to run the same guarded step again."""
    if isinstance(error, DisconnectionError | TimeoutError):
        return True
    if not isinstance(error, DBAPIError):
        return False
    if error.connection_invalidated:
        return True
    if getattr(error.orig, "sqlstate", None) in _TRANSIENT_SQLSTATES:
        return True
    message = str(error.orig).lower()
    return isinstance(error, OperationalError) and any(
        fragment in message for fragment in _TRANSIENT_MESSAGES
    )


__all__ = [
    "APPLICATION_NAME",
    "CONNECTION_ERRORS",
    "DATABASE_URL_ENV",
    "DEFAULT_SQLITE_PATH",
    "SQLITE_BUSY_TIMEOUT_MS",
    "URL",
    "ArgumentError",
    "Connection",
    "DBAPIError",
    "Engine",
    "SQLAlchemyError",
    "StatementTimedOut",
    "bounded_read",
    "compact_json",
    "create_database_engine",
    "default_database_url",
    "is_missing_table",
    "is_postgres",
    "is_transient_database_error",
    "make_url",
    "normalize_url",
    "prefer_linear_plans",
    "read_transaction",
    "redacted_url",
    "single_statement",
    "sqlite_database_file",
]
