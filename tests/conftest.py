"""The dialect matrix: every store, processing and job test runs on SQLite and PostgreSQL.

PostgreSQL comes from MEDIA_USAGE_TEST_POSTGRES_URL (default: the local server). Each test
gets its own schema there and its own file on SQLite. With MEDIA_USAGE_REQUIRE_POSTGRES=1
(CI) an unreachable server fails the test instead of skipping it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg
import pytest
from sqlalchemy import Engine, create_engine, text

from media_usage_orchestration.emdash_double.scratch import scratch_schema
from media_usage_orchestration.processing.activation import activate
from media_usage_orchestration.store.core.engine import create_database_engine
from media_usage_orchestration.store.core.schema import install_schema

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


@pytest.fixture
def database_url(request, tmp_path) -> Iterator[tuple[str, str]]:
    dialect = request.param
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
def db(empty_db) -> TestDatabase:
    """A database with EmDash's schema installed (activation still `expanded`)."""
    with empty_db.engine.begin() as connection:
        install_schema(connection)
    return empty_db


@pytest.fixture
def activated(db) -> TestDatabase:
    """`db` with capture activated directly (no Dagster run)."""
    activate(db.engine)
    return db


@pytest.fixture
def twin(db) -> Iterator[TestDatabase]:
    """A second, empty database of the same dialect, for running the same scenario twice."""
    if not db.is_postgres:
        with installed_database(db.dialect, db.url.replace("media_usage.db", "twin.db")) as twin:
            yield twin
        return
    with postgres_schema() as url, installed_database(db.dialect, url) as twin:
        yield twin


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    """A throwaway Dagster instance for the test."""
    with dg.instance_for_test() as instance:
        yield instance


def pytest_generate_tests(metafunc):
    if "database_url" in metafunc.fixturenames:
        metafunc.parametrize("database_url", DIALECTS, indirect=True)


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
