"""The dialect matrix: every store, processing and job test runs on SQLite and PostgreSQL.

PostgreSQL comes from MEDIA_USAGE_TEST_POSTGRES_URL (default: the local server). Each test
gets its own schema there and its own file on SQLite. With MEDIA_USAGE_REQUIRE_POSTGRES=1
(CI) an unreachable server fails the test instead of skipping it.
"""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest
from alembic.script import ScriptDirectory

from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.resources.automation import WORK_LINGER_ENV
from media_usage_orchestration.store.core.engine import create_database_engine
from tests.support.databases import (
    DIALECTS,
    PostgresSchemaPool,
    SqliteTemplate,
    TestDatabase,
    clean_database,
    compact_bloated_catalogs,
    postgres_admin_url,
    postgres_schema,
    require_postgres,
)
from tests.support.emdash_migrations import emdash_copy


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


@pytest.fixture(autouse=True)
def _work_runs_do_not_linger(monkeypatch) -> None:
    """Work runs the tests' sensors ask for end once drained, as the local lanes' do: a test
    executes its runs one at a time (many in this process), and a run waiting 30 s for edits
    that never come would only wait. Tests of the linger set it themselves."""
    monkeypatch.setenv(WORK_LINGER_ENV, "0")


@pytest.fixture
def webhook_env(monkeypatch) -> pytest.MonkeyPatch:
    """The test's environment without proxies, for a sensor that posts to a local webhook
    receiver (`tests/support/webhook.py`) on 127.0.0.1."""
    for proxy in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    return monkeypatch


@pytest.fixture(scope="session")
def sqlite_template() -> Iterator[SqliteTemplate]:
    template = SqliteTemplate()
    yield template
    template.remove()


@pytest.fixture(scope="session")
def postgres_pool() -> Iterator[PostgresSchemaPool]:
    compact_bloated_catalogs(postgres_admin_url())
    pool = PostgresSchemaPool(postgres_admin_url())
    yield pool
    pool.close()


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
def emdash(db, tmp_path) -> Iterator[TestDatabase]:
    """EmDash 0.34.0's database, `_emdash_migrations` included: a copy of its fixture file on
    SQLite; on PostgreSQL the installed schema with the fixture's migration record."""
    with emdash_copy(db, tmp_path) as database:
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


def pytest_generate_tests(metafunc):
    """Every test of the `dialect` fixture (through `db`, `empty_db`, `no_sql_engine`, ...) runs
    on both dialects, but for behaviour only one of them has: `postgres_only(reason)` (row
    locks, concurrent writers) or `sqlite_only(reason)` (EXPLAIN QUERY PLAN, FTS5)."""
    if "dialect" not in metafunc.fixturenames:
        return
    only = {"postgres_only": ("postgres",), "sqlite_only": ("sqlite",)}
    marked = [only[name] for name in only if metafunc.definition.get_closest_marker(name)]
    if len(marked) > 1:
        raise pytest.UsageError(f"{metafunc.definition.nodeid} is marked for both dialects only")
    metafunc.parametrize("dialect", marked[0] if marked else DIALECTS, indirect=True)


# The deployment tier (tests/deployment/) runs on one worker of its own, from the start: its
# modules mostly wait (for leases to expire, runs to start, retries to land) while the other
# workers run the others (`make test` starts four).
DEPLOYMENT_TIER = "tests/deployment/"
# The acceptance modules that take the longest (about a minute each on this machine), started
# before everything else but the deployment tier.
ACCEPTANCE_FIRST = (
    "tests/acceptance/test_demo.py",
    "tests/acceptance/browser/",
    "tests/acceptance/test_bench.py",
    "tests/acceptance/races/",
    "tests/acceptance/faults/",
    "tests/acceptance/end_to_end/",
)


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TierScopes(LoadScopeScheduling):
        """Modules are scopes, as with `--dist loadscope`, but the deployment tier is one, given
        first to a worker that takes nothing else until the tier's last test."""

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(DEPLOYMENT_TIER):
                return DEPLOYMENT_TIER
            return super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            # The longest modules first, so none of them is left running alone at the end:
            # the deployment tier, then the acceptance tier's (in xdist's order, by size).
            for first in (DEPLOYMENT_TIER, *ACCEPTANCE_FIRST):
                scope = next((each for each in self.workqueue if each.startswith(first)), None)
                if scope is not None:
                    self.workqueue.move_to_end(scope, last=False)
                    break
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            # A worker runs a test only once it knows the next one (or that none follows), so
            # the tier's last test would wait for the whole queue to drain: more work is given
            # as soon as that test is the tier's only one left.
            tier = self.assigned_work.get(node, {}).get(DEPLOYMENT_TIER)
            left = sum(not done for done in tier.values()) if tier is not None else 0
            if left > 1 and self.workqueue:
                return
            super()._reschedule(node)

    return TierScopes(config, log)


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
