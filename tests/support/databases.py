"""The test databases: the dialect matrix's server, and clean installed databases for every
test without paying for EmDash's DDL each time.

SQLite: the schema is installed once per worker into a template file, and each test gets a copy
of it (a file copy instead of thirteen tables, their indexes and triggers).

PostgreSQL: each test gets a schema of its own, as before, but an installed schema is reused.
When a test ends, what it added (its content tables, capture trigger functions, extra triggers)
is dropped and every row of EmDash's tables deleted with triggers off; the schema goes back to
the worker's pool only if its catalog then equals a fresh install's (tables, columns, defaults,
indexes, constraints, triggers, functions: one digest), and is dropped otherwise. A new schema is
installed only when the pool is empty. Creating and dropping a schema per test also bloats the
server's catalogs (hundreds of thousands of dead pg_attribute rows per suite), which slows every
later DDL statement.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Connection, Engine, NullPool, create_engine, select, text
from sqlalchemy.exc import SQLAlchemyError

from media_usage_orchestration.emdash_double.scratch import scratch_schema, with_search_path
from media_usage_orchestration.store.core.engine import create_database_engine, normalize_url
from media_usage_orchestration.store.core.schema import ALL_TABLES, install_schema

# What a test may have changed, in one statement: the digest of EmDash's tables as PostgreSQL
# spells them (columns with types and defaults, indexes, constraints, triggers) and of the
# functions a fresh install has, and what the test added besides (content tables, views,
# sequences, capture trigger functions), as the statements that drop it. Row contents are not
# part of the digest: they are deleted and re-seeded.
_INSPECTION = text(
    """
    WITH base AS (
        SELECT c.oid, c.relname FROM pg_class c
        WHERE c.relnamespace = current_schema()::regnamespace
          AND c.relname = ANY(CAST(:tables AS text[]))
    ), shape AS (
        SELECT 'column ' || b.relname || '.' || a.attname || ' '
               || format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END || ' '
               || coalesce(pg_get_expr(d.adbin, d.adrelid), '') AS item
        FROM base b
        JOIN pg_attribute a ON a.attrelid = b.oid AND a.attnum > 0 AND NOT a.attisdropped
        LEFT JOIN pg_attrdef d ON d.adrelid = b.oid AND d.adnum = a.attnum
        UNION ALL
        SELECT 'index ' || pg_get_indexdef(i.indexrelid)
        FROM pg_index i JOIN base b ON b.oid = i.indrelid
        UNION ALL
        SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(k.oid)
        FROM pg_constraint k JOIN base b ON b.oid = k.conrelid
        UNION ALL
        SELECT 'trigger ' || pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN base b ON b.oid = t.tgrelid WHERE NOT t.tgisinternal
        UNION ALL
        SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(p.prosrc)
        FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.oid::regprocedure::text = ANY(CAST(:functions AS text[]))
    )
    SELECT
        (SELECT md5(string_agg(item, E'\\n' ORDER BY item)) FROM shape) AS digest,
        (SELECT coalesce(string_agg(format('DROP %s IF EXISTS %I CASCADE;',
                CASE relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                             WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, relname), ' '), '')
         FROM pg_class
         WHERE relnamespace = current_schema()::regnamespace
           AND relkind IN ('r', 'p', 'v', 'm', 'S')
           AND relname <> ALL(CAST(:tables AS text[]))) AS drop_relations,
        (SELECT coalesce(string_agg(format('DROP FUNCTION IF EXISTS %s CASCADE;',
                p.oid::regprocedure), ' '), '')
         FROM pg_proc p
         WHERE p.pronamespace = current_schema()::regnamespace
           AND p.oid::regprocedure::text <> ALL(CAST(:functions AS text[]))) AS drop_functions
    """
)
_INSTALLED_TABLE_NAMES = frozenset(table.name for table in ALL_TABLES)


class SqliteTemplate:
    """A SQLite file with EmDash's schema installed, copied for each test."""

    def __init__(self) -> None:
        self._directory = tempfile.mkdtemp(prefix="media_usage_template_")
        self.path = Path(self._directory) / "installed.db"
        engine = create_database_engine(f"sqlite:///{self.path}")
        try:
            with engine.begin() as connection:
                install_schema(connection)
        finally:
            engine.dispose()
        # Fold the write-ahead log into the file, so that the file alone is the database.
        with contextlib.closing(sqlite3.connect(self.path)) as connection:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert not Path(f"{self.path}-wal").exists() or not Path(f"{self.path}-wal").stat().st_size

    def copy_to(self, path: Path) -> None:
        shutil.copyfile(self.path, path)

    def remove(self) -> None:
        shutil.rmtree(self._directory, ignore_errors=True)


# Each test's content tables, triggers and functions leave dead catalog rows behind.
VACUUM_EVERY = 100


class PostgresSchemaPool:
    """Installed schemas on the test server, reused from test to test while their catalog equals
    a fresh install's (see the module's docstring)."""

    def __init__(self, admin_url: str) -> None:
        self._admin = create_engine(normalize_url(admin_url), isolation_level="AUTOCOMMIT")
        self._admin_url = admin_url
        self._free: list[tuple[str, str]] = []  # (schema, url)
        self._fresh: _FreshInstall | None = None
        self._handed_out = 0

    @contextlib.contextmanager
    def installed_schema(self) -> Iterator[str]:
        """The URL of a clean installed schema for one test; given back (or dropped) after."""
        schema, url = self._free.pop() if self._free else self._install()
        self._handed_out += 1
        if self._handed_out % VACUUM_EVERY == 0:
            self._vacuum_catalogs()
        try:
            yield url
        finally:
            if self._cleaned(url):
                self._free.append((schema, url))
            else:
                self._drop(schema)

    def _vacuum_catalogs(self) -> None:
        """Reclaim the catalog rows the tests' content tables and triggers left dead, so the
        catalogs stop growing: a server without autovacuum (as this one may be) never does."""
        with self._admin.connect() as connection:
            connection.exec_driver_sql(f"VACUUM {_CHURNED_CATALOGS}")

    def close(self) -> None:
        for schema, _ in self._free:
            self._drop(schema)
        self._free.clear()
        self._admin.dispose()

    def _install(self) -> tuple[str, str]:
        schema = f"t_{uuid.uuid4().hex[:16]}"
        with self._admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        url = with_search_path(self._admin_url, schema).render_as_string(hide_password=False)
        engine = create_database_engine(url)
        try:
            with engine.begin() as connection:
                install_schema(connection)
                if self._fresh is None:
                    self._fresh = _FreshInstall.read(connection)
        finally:
            engine.dispose()
        return schema, url

    def _cleaned(self, url: str) -> bool:
        """Drop what the test added and delete every row; True when the schema is as fresh.
        Two round trips: the inspection, then one script."""
        fresh = self._fresh
        assert fresh is not None
        engine = create_engine(url, poolclass=NullPool)
        try:
            with engine.begin() as connection:
                # A test that left a lock behind costs its schema, not the suite's time.
                connection.exec_driver_sql("SET LOCAL lock_timeout = '5s'")
                found = connection.execute(_INSPECTION, fresh.parameters).one()
                if found.digest != fresh.digest:
                    return False
                connection.exec_driver_sql(
                    found.drop_relations + found.drop_functions + fresh.reset_script
                )
            return True
        except SQLAlchemyError:
            return False
        finally:
            engine.dispose()

    def _drop(self, schema: str) -> None:
        with self._admin.connect() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@dataclass(frozen=True)
class _FreshInstall:
    """What a fresh install holds: its shape's digest, its functions, and the script that puts
    its rows back (every row deleted with triggers and foreign keys off, since the cleanup fence
    refuses some deletes; then the rows the installer seeds)."""

    digest: str
    functions: tuple[str, ...]
    reset_script: str

    @property
    def parameters(self) -> dict[str, list[str]]:
        return {"tables": sorted(_INSTALLED_TABLE_NAMES), "functions": list(self.functions)}

    @classmethod
    def read(cls, connection: Connection) -> _FreshInstall:
        functions = tuple(
            connection.exec_driver_sql(
                "SELECT oid::regprocedure::text FROM pg_proc"
                " WHERE pronamespace = current_schema()::regnamespace"
            ).scalars()
        )
        parameters = {"tables": sorted(_INSTALLED_TABLE_NAMES), "functions": list(functions)}
        digest = connection.execute(_INSPECTION, parameters).one().digest
        return cls(digest, functions, _reset_script(connection))


def _reset_script(connection: Connection) -> str:
    statements = ["SET LOCAL session_replication_role = replica;"]
    statements += [f'DELETE FROM "{table.name}";' for table in reversed(ALL_TABLES)]
    for table in ALL_TABLES:
        for row in connection.execute(select(table)).mappings():
            insert = table.insert().values(**row)
            compiled = insert.compile(
                dialect=connection.dialect, compile_kwargs={"literal_binds": True}
            )
            statements.append(f"{compiled};")
    return " ".join(statements)


DEFAULT_TEST_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DIALECTS = ("sqlite", "postgres")


def postgres_admin_url() -> str:
    return os.environ.get("MEDIA_USAGE_TEST_POSTGRES_URL", DEFAULT_TEST_POSTGRES_URL)


def postgres_required() -> bool:
    return os.environ.get("MEDIA_USAGE_REQUIRE_POSTGRES") == "1"


_postgres_problem: list[str] = []


def check_postgres() -> str | None:
    if not _postgres_problem:
        try:
            probe = create_engine(postgres_admin_url())
            with probe.connect() as connection:
                connection.execute(text("SELECT 1"))
            probe.dispose()
            _postgres_problem.append("")
        except Exception as error:  # the reason is reported once, below
            _postgres_problem.append(f"PostgreSQL is unreachable: {type(error).__name__}")
    return _postgres_problem[0] or None


@dataclass
class TestDatabase:
    """One isolated database: its dialect, a URL other processes can open, its engine."""

    __test__ = False
    dialect: str
    url: str
    engine: Engine

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgres"


def require_postgres() -> None:
    """Skip the test without a server, or fail it when MEDIA_USAGE_REQUIRE_POSTGRES=1."""
    problem = check_postgres()
    if problem:
        if postgres_required():
            pytest.fail(f"{problem} and MEDIA_USAGE_REQUIRE_POSTGRES=1")
        pytest.skip(problem)


@contextlib.contextmanager
def postgres_schema() -> Iterator[str]:
    """A schema of its own on the test server, dropped afterwards: yields a URL whose
    search_path is that schema."""
    with scratch_schema(postgres_admin_url(), "t") as (_, url):
        yield url


@contextlib.contextmanager
def installed_database(dialect: str, url: str) -> Iterator[TestDatabase]:
    """The database at `url` with EmDash's schema installed; its engine disposed afterwards."""
    engine = create_database_engine(url)
    try:
        with engine.begin() as connection:
            install_schema(connection)
        yield TestDatabase(dialect, url, engine)
    finally:
        engine.dispose()


@contextlib.contextmanager
def clean_database(
    dialect: str, path: Path, sqlite_template: SqliteTemplate, postgres_pool: PostgresSchemaPool
) -> Iterator[TestDatabase]:
    """A database with EmDash's schema freshly installed (as far as any test can tell): a copy
    of the installed SQLite template at `path`, or a clean schema from the PostgreSQL pool."""
    if dialect == "sqlite":
        sqlite_template.copy_to(path)
        url = f"sqlite:///{path}"
        schema = contextlib.nullcontext(url)
    else:
        require_postgres()
        schema = postgres_pool.installed_schema()
    with schema as url:
        engine = create_database_engine(url)
        try:
            yield TestDatabase(dialect, url, engine)
        finally:
            engine.dispose()


# Above this size (a fresh server's is under 2 MB) the catalogs are bloated by earlier runs.
_BLOATED_CATALOG_BYTES = 16 * 1024 * 1024
_CHURNED_CATALOGS = ", ".join(
    f"pg_catalog.{name}"
    for name in (
        "pg_attribute",
        "pg_attrdef",
        "pg_class",
        "pg_constraint",
        "pg_depend",
        "pg_index",
        "pg_proc",
        "pg_trigger",
        "pg_type",
    )
)
# Any constant the suite's processes agree on: one of them compacts, the others wait for it.
_COMPACTION_LOCK = 7_403_221


def compact_bloated_catalogs(admin_url: str) -> None:
    """Compact the test server's catalogs if earlier runs bloated them. Every schema created and
    dropped leaves dead catalog rows behind faster than autovacuum reclaims them, and every DDL
    statement and catalog lookup then scans the bloat (pg_attribute reached 400 MB, making each
    schema install several times slower). A server that refuses (not the catalogs' owner) only
    runs the suite slower."""
    if check_postgres():
        return
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql(f"SELECT pg_advisory_lock({_COMPACTION_LOCK})")
            size = connection.exec_driver_sql(
                "SELECT pg_total_relation_size('pg_catalog.pg_attribute')"
            ).scalar_one()
            if size > _BLOATED_CATALOG_BYTES:
                connection.exec_driver_sql(f"VACUUM FULL {_CHURNED_CATALOGS}")
            connection.exec_driver_sql(f"SELECT pg_advisory_unlock({_COMPACTION_LOCK})")
    except SQLAlchemyError as error:
        warnings.warn(f"catalogs not compacted: {type(error).__name__}", stacklevel=1)
    finally:
        engine.dispose()
