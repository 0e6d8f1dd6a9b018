"""

The installer produces EmDash's schema: the fixtures EmDash made are the ground truth.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import uuid

import pytest
from sqlalchemy import create_engine, inspect, select, text

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.cleanup_fence import missing_fence
from tests.fixtures import FIXTURE_DB, SCHEMA_POSTGRES
from tests.support.databases import postgres_admin_url
from tests.support.emdash_fence import EMDASH_SQLITE_FENCE, restore_fence


def test_install_creates_every_table_and_index_and_is_idempotent(empty_db):
    with empty_db.engine.begin() as connection:
        added = schema.install_schema(connection)
    assert "table _emdash_media_usage_work" in added
    with empty_db.engine.begin() as connection:
        assert schema.install_schema(connection) == []
    inspector = inspect(empty_db.engine)
    for table in schema.EMDASH_TABLES:
        assert table.name in inspector.get_table_names()
        names = {index["name"] for index in inspector.get_indexes(table.name)}
        assert {index.name for index in table.indexes} <= names


def test_seed_rows_are_dormant(db):
    with db.engine.connect() as connection:
        row = connection.execute(select(schema.activation)).mappings().one()
    assert row["state"] == "expanded"
    assert row["media_usage_maintenance_turn"] == 2
    assert row["created_at"].endswith("Z") and "T" in row["created_at"]


# ==================================================================================================
# Compatibility with the schema EmDash itself created
# ==================================================================================================


TABLE_NAMES = sorted(table.name for table in schema.EMDASH_TABLES)


def _sqlite_shape(connection: sqlite3.Connection, table: str) -> dict:
    columns = {
        row[1]: (row[2].lower(), row[3], _normalize_default(row[4]), row[5])
        for row in connection.execute(f'PRAGMA table_info("{table}")')
    }
    indexes = {}
    for row in connection.execute(f'PRAGMA index_list("{table}")'):
        name, unique = row[1], row[2]
        if name.startswith("sqlite_autoindex"):
            name = f"auto:{','.join(_index_columns(connection, name))}"
        indexes[name] = (unique, tuple(_index_columns(connection, row[1])))
    return {"columns": columns, "indexes": indexes}


def _index_columns(connection: sqlite3.Connection, index: str) -> list[str]:
    return [row[2] for row in connection.execute(f'PRAGMA index_info("{index}")')]


def _normalize_default(value: str | None) -> str | None:
    if value is None:
        return None
    return re.sub(r"\s+", "", value).strip("()").lower()


@pytest.mark.sqlite_only("compared with EmDash's own SQLite database")
def test_sqlite_install_matches_emdash_fixture_database(tmp_path, empty_db):
    reference_path = tmp_path / "emdash.db"
    shutil.copy(FIXTURE_DB, reference_path)
    with empty_db.engine.begin() as connection:
        schema.install_schema(connection)
    ours = sqlite3.connect(empty_db.engine.url.database)
    reference = sqlite3.connect(reference_path)
    for table in TABLE_NAMES:
        assert _sqlite_shape(ours, table) == _sqlite_shape(reference, table), table


# What `media-usage init` adds to a database EmDash created: the project's own `_muo_` tables,
# nothing of EmDash's.
PROJECT_TABLES_ADDED = [f"table {table.name}" for table in schema.PROJECT_TABLES]
assert all(added.startswith("table _muo_") for added in PROJECT_TABLES_ADDED)


def test_install_on_emdash_database_adds_only_the_projects_own_tables(tmp_path):
    path = tmp_path / "emdash.db"
    shutil.copy(FIXTURE_DB, path)
    engine = create_engine(f"sqlite:///{path}")
    restore_fence(engine)  # as a real EmDash database has it
    with engine.begin() as connection:
        assert schema.install_schema(connection) == PROJECT_TABLES_ADDED
        assert schema.install_schema(connection) == []
    engine.dispose()


def test_install_on_the_fixture_copy_adds_exactly_the_fence_it_lacks(tmp_path):
    path = tmp_path / "emdash.db"
    shutil.copy(FIXTURE_DB, path)
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        added = schema.install_schema(connection)
    assert added == [*PROJECT_TABLES_ADDED, *(f"trigger {name}" for name in EMDASH_SQLITE_FENCE)]
    with engine.begin() as connection:
        assert schema.install_schema(connection) == []
        assert missing_fence(connection) == []
    engine.dispose()


def _load_postgres_reference(admin, schema_name: str) -> None:
    lines = []
    for line in SCHEMA_POSTGRES.read_text().splitlines():
        if line.startswith("\\") or "set_config('search_path'" in line:
            continue
        lines.append(line.replace("public.", f'"{schema_name}".'))
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE SCHEMA "{schema_name}"')
        connection.exec_driver_sql("\n".join(lines))


def _postgres_shape(connection, schema_name: str, table: str) -> dict:
    columns = {
        row.column_name: (row.data_type, row.is_nullable, row.column_default)
        for row in connection.execute(
            text(
                "SELECT column_name, data_type, is_nullable, column_default "
                "FROM information_schema.columns WHERE table_schema = :s AND table_name = :t"
            ),
            {"s": schema_name, "t": table},
        )
    }
    indexes = {
        row.indexname: row.indexdef.replace(f'"{schema_name}".', "").replace(f"{schema_name}.", "")
        for row in connection.execute(
            text(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = :s AND tablename = :t"
            ),
            {"s": schema_name, "t": table},
        )
    }
    constraints = {
        (row.conname, row.contype, row.definition.replace(f"{schema_name}.", ""))
        for row in connection.execute(
            text(
                "SELECT c.conname, c.contype, pg_get_constraintdef(c.oid) AS definition "
                "FROM pg_constraint c JOIN pg_class r ON r.oid = c.conrelid "
                "JOIN pg_namespace n ON n.oid = r.relnamespace "
                "WHERE n.nspname = :s AND r.relname = :t AND c.contype IN ('p', 'u', 'f')"
            ),
            {"s": schema_name, "t": table},
        )
    }
    return {"columns": columns, "indexes": indexes, "constraints": constraints}


@pytest.mark.postgres_only("compared with EmDash's PostgreSQL schema dump")
def test_postgres_install_matches_emdash_schema_dump(empty_db):
    with empty_db.engine.begin() as connection:
        schema.install_schema(connection)
        our_schema = connection.execute(text("SELECT current_schema()")).scalar_one()
    reference_schema = f"ref_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_admin_url(), isolation_level="AUTOCOMMIT")
    try:
        _load_postgres_reference(admin, reference_schema)
        with admin.connect() as connection:
            for table in TABLE_NAMES:
                ours = _postgres_shape(connection, our_schema, table)
                reference = _postgres_shape(connection, reference_schema, table)
                assert ours == reference, table
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{reference_schema}" CASCADE')
        admin.dispose()
