"""The dialect matrix: every store, processing and job test runs on SQLite and PostgreSQL.

PostgreSQL comes from MEDIA_USAGE_TEST_POSTGRES_URL (default: the local server). Each test
gets its own schema there and its own file on SQLite. With MEDIA_USAGE_REQUIRE_POSTGRES=1
(CI) an unreachable server fails the test instead of skipping it.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, text

from media_usage_orchestration.emdash_double.scratch import scratch_schema
from media_usage_orchestration.processing.activation import activate
from media_usage_orchestration.store.core.engine import create_database_engine
from media_usage_orchestration.store.core.schema import install_schema
from tests.fast_databases import PostgresSchemaPool, SqliteTemplate


def _share_alembic_script_directories() -> None:
    """Dagster stamps every new storage (each test instance's run, event and schedule storage,
    and each run's event-log shard) with alembic, which re-reads every revision file of the
    storage each time: most of an instance's creation. The revisions do not change during a
    test session, so each script directory is read once per process."""
    read = ScriptDirectory.from_config.__func__
    directories: dict[str, ScriptDirectory] = {}

    def from_config(cls, config, *args, **kwargs):
        location = config.get_main_option("script_location")
        if location not in directories:
            directories[location] = read(cls, config, *args, **kwargs)
        return directories[location]

    ScriptDirectory.from_config = classmethod(from_config)


_share_alembic_script_directories()

DEFAULT_TEST_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DIALECTS = ("sqlite", "postgres")


def postgres_admin_url() -> str:
    return os.environ.get("MEDIA_USAGE_TEST_POSTGRES_URL", DEFAULT_TEST_POSTGRES_URL)


def postgres_required() -> bool:
    return os.environ.get("MEDIA_USAGE_REQUIRE_POSTGRES") == "1"


_postgres_problem: list[str] = []


def _check_postgres() -> str | None:
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
    problem = _check_postgres()
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


@pytest.fixture(scope="session")
def sqlite_template() -> Iterator[SqliteTemplate]:
    template = SqliteTemplate()
    yield template
    template.remove()


@pytest.fixture(scope="session")
def postgres_pool() -> Iterator[PostgresSchemaPool]:
    pool = PostgresSchemaPool(postgres_admin_url())
    yield pool
    pool.close()


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


@pytest.fixture
def dialect(request) -> str:
    return request.param


@pytest.fixture
def database_url(dialect, tmp_path) -> Iterator[tuple[str, str]]:
    """An empty database of the test's dialect: (dialect, URL)."""
    if dialect == "sqlite":
        yield dialect, f"sqlite:///{tmp_path / 'media_usage.db'}"
        return
    require_postgres()
    with postgres_schema() as url:
        yield dialect, url


@pytest.fixture
def empty_db(database_url) -> Iterator[TestDatabase]:
    """A database with nothing installed."""
    dialect, url = database_url
    engine = create_database_engine(url)
    try:
        yield TestDatabase(dialect, url, engine)
    finally:
        engine.dispose()


@pytest.fixture
def db(dialect, tmp_path, sqlite_template, postgres_pool) -> Iterator[TestDatabase]:
    """A database with EmDash's schema installed (activation still `expanded`)."""
    with clean_database(
        dialect, tmp_path / "media_usage.db", sqlite_template, postgres_pool
    ) as database:
        yield database


@pytest.fixture
def activated(db) -> TestDatabase:
    """`db` with capture activated directly (no Dagster run)."""
    activate(db.engine)
    return db


@pytest.fixture
def twin(db, tmp_path, sqlite_template, postgres_pool) -> Iterator[TestDatabase]:
    """A second database of the same dialect, for running the same scenario twice."""
    with clean_database(
        db.dialect, tmp_path / "twin.db", sqlite_template, postgres_pool
    ) as database:
        yield database


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    """A throwaway Dagster instance for the test: Dagster's ephemeral one, whose run and event
    storages are its SQL storages on an in-memory SQLite database. A run costs a tenth of a run
    on a persistent SQLite instance, which creates and stamps an event-log file per run; the
    tests of what persists (the deployed instance, the daemon, the webserver, the demo) open
    their own persistent instances."""
    with dg.DagsterInstance.ephemeral() as instance:
        yield instance


# Above this size (a fresh server's is under 2 MB) the catalogs are bloated by earlier runs.
_BLOATED_CATALOG_BYTES = 64 * 1024 * 1024


def pytest_sessionstart(session):
    """Compact the test server's catalogs if earlier runs bloated them. Every schema created and
    dropped leaves dead catalog rows behind faster than autovacuum reclaims them, and every DDL
    statement and catalog lookup then scans the bloat (pg_attribute reached 400 MB, making each
    schema install several times slower). Once, in the controlling process, before any test."""
    if os.environ.get("PYTEST_XDIST_WORKER") or _check_postgres():
        return
    engine = create_engine(postgres_admin_url(), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            size = connection.exec_driver_sql(
                "SELECT pg_total_relation_size('pg_catalog.pg_attribute')"
            ).scalar_one()
            if size > _BLOATED_CATALOG_BYTES:
                connection.exec_driver_sql(f"VACUUM FULL {', '.join(_CHURNED_CATALOGS)}")
    except Exception as error:  # a server that refuses (not the owner) runs the suite slower
        warnings.warn(f"catalogs not compacted: {type(error).__name__}", stacklevel=1)
    finally:
        engine.dispose()


_CHURNED_CATALOGS = tuple(
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


def pytest_generate_tests(metafunc):
    if "dialect" in metafunc.fixturenames:
        metafunc.parametrize("dialect", DIALECTS, indirect=True)


def pytest_terminal_summary(terminalreporter):
    """Show how many database tests ran on each dialect, so a silently skipped PostgreSQL half
    is visible in every run's output."""
    counts: dict[tuple[str, str], int] = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            if getattr(report, "when", "call") not in ("call", "setup"):
                continue
            if outcome == "passed" and report.when != "call":
                continue
            for dialect in DIALECTS:
                if f"[{dialect}" in nodeid or f"-{dialect}]" in nodeid or f"-{dialect}-" in nodeid:
                    counts[(dialect, outcome)] = counts.get((dialect, outcome), 0) + 1
    if not counts:
        return
    terminalreporter.section("database tests per dialect")
    for dialect in DIALECTS:
        parts = [
            f"{counts[(dialect, o)]} {o}"
            for o in ("passed", "failed", "error", "skipped")
            if (dialect, o) in counts
        ]
        terminalreporter.write_line(f"{dialect:>9}: {', '.join(parts) or 'none'}")
