"""EmDash's migration record (`_emdash_migrations`) on a test database, for the host-schema
contract: a copy of EmDash's fixture file on SQLite; on PostgreSQL the table as EmDash's own
dump creates it, holding the fixture's rows, beside the installed schema."""

from __future__ import annotations

import contextlib
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Engine, delete, insert, select

from media_usage_orchestration.store.core.engine import create_database_engine
from media_usage_orchestration.store.core.host_schema import emdash_migrations
from tests.fixtures import FIXTURE_DB, SCHEMA_POSTGRES
from tests.support.databases import TestDatabase
from tests.support.emdash_fence import restore_fence

# A later EmDash's media usage migration, and a known one an older EmDash has not run yet.
LATER_MIGRATION = "071_media_usage_something"
REMOVED_MIGRATION = "063_media_usage_incremental_work"


def fixture_migrations() -> list[tuple[str, str]]:
    """The 69 rows (name, timestamp) EmDash recorded in its fixture database."""
    with contextlib.closing(sqlite3.connect(f"{FIXTURE_DB.as_uri()}?mode=ro", uri=True)) as db:
        return db.execute(
            'SELECT name, "timestamp" FROM _emdash_migrations ORDER BY name'
        ).fetchall()


def _postgres_ddl() -> str:
    match = re.search(
        r"CREATE TABLE public\._emdash_migrations \(.*?\);", SCHEMA_POSTGRES.read_text(), re.S
    )
    assert match, "EmDash's PostgreSQL dump has no _emdash_migrations table"
    return match.group(0).replace("public.", "")


def record_fixture_migrations(engine: Engine) -> None:
    """`_emdash_migrations` created from EmDash's PostgreSQL dump, with the fixture's rows."""
    rows = [{"name": name, "timestamp": stamp} for name, stamp in fixture_migrations()]
    with engine.begin() as connection:
        connection.exec_driver_sql(_postgres_ddl())
        connection.execute(insert(emdash_migrations), rows)


@contextlib.contextmanager
def emdash_copy(db: TestDatabase, tmp_path: Path) -> Iterator[TestDatabase]:
    """EmDash's database as its 0.34.0 release left it: the fixture file copied (its fence
    triggers restored) on SQLite; the installed schema and the fixture's migration record on
    PostgreSQL."""
    if db.is_postgres:
        record_fixture_migrations(db.engine)
        yield db
        return
    copy = tmp_path / "emdash-fixture.db"
    shutil.copyfile(FIXTURE_DB, copy)
    url = f"sqlite:///{copy}"
    engine = create_database_engine(url)
    try:
        restore_fence(engine)
        yield TestDatabase(db.dialect, url, engine)
    finally:
        engine.dispose()


def add_migration(engine: Engine, name: str = LATER_MIGRATION) -> None:
    row = {"name": name, "timestamp": "2027-01-04T10:00:00.000Z"}
    with engine.begin() as connection:
        connection.execute(insert(emdash_migrations), [row])


def remove_migration(engine: Engine, name: str = REMOVED_MIGRATION) -> None:
    with engine.begin() as connection:
        connection.execute(delete(emdash_migrations).where(emdash_migrations.c.name == name))


def as_later_emdash(engine: Engine) -> None:
    """A later EmDash's record: a media usage migration the project does not know added, and
    one it knows removed (unknown wins: every writer refuses)."""
    add_migration(engine)
    remove_migration(engine)


def recorded_names(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return list(connection.scalars(select(emdash_migrations.c.name).order_by("name")))
