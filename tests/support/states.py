"""Test helpers: build database states directly, move time by backdating rows."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Table, func, select, text, update

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, Collection, FieldSpec
from media_usage_orchestration.emdash_double.sample_content import MEDIA_FIELDS
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.schema import (
    ACTIVATION_KEY,
    COLLECTION_SCOPE,
    CONTENT_ADAPTER_ID,
)
from tests.support.factories import ago, from_now

IMAGE_ONLY: tuple[FieldSpec, ...] = (FieldSpec("title", "string"), FieldSpec("hero", "image"))
NO_MEDIA: tuple[FieldSpec, ...] = (FieldSpec("title", "string"),)


def set_activation(engine: Engine, state: str = "active") -> None:
    with engine.begin() as connection:
        connection.execute(
            update(schema.activation)
            .where(schema.activation.c.task_key == ACTIVATION_KEY)
            .values(state=state)
        )


def make_collection(
    engine: Engine,
    slug: str,
    fields: Sequence[FieldSpec] = IMAGE_ONLY,
    *,
    collection_id: str | None = None,
    capture_state: str | None = "active",
    reconciliation_required: int = 1,
    status: str = "stale",
    change_epoch: int = 0,
    cursor: str | None = None,
) -> Collection:
    """A registry collection with its table and a status row in the given lifecycle state
    (no capture triggers: repository tests drive rows directly, as the upstream tests do)."""
    collection = CmsWriter(engine).create_collection(slug, fields, collection_id=collection_id)
    set_status(
        engine,
        slug,
        capture_state=capture_state,
        reconciliation_required=reconciliation_required,
        status=status,
        change_epoch=change_epoch,
        cursor=cursor,
    )
    return collection


def set_status(engine: Engine, slug: str, **values: Any) -> None:
    status = schema.index_status
    with engine.begin() as connection:
        connection.execute(
            update(status)
            .where(
                status.c.adapter_id == CONTENT_ADAPTER_ID,
                status.c.scope_type == COLLECTION_SCOPE,
                status.c.scope_key == slug,
            )
            .values(**values)
        )


def status_row(engine: Engine, slug: str) -> dict[str, Any] | None:
    return one(engine, schema.index_status, scope_key=slug)


def db_now(engine: Engine, offset_seconds: int = 0) -> str:
    with engine.connect() as connection:
        return connection.execute(select(from_now(offset_seconds))).scalar_one()


def assert_same_statement_time(first: str, second: str) -> None:
    """Two clock readings written by one statement.

    SQLite's 'now' is fixed within a statement; PostgreSQL's clock_timestamp() (the seeds'
    clock) advances between the two readings, so they may differ by a few milliseconds.
    """
    earlier, later = sorted(
        datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ") for value in (first, second)
    )
    assert later - earlier < timedelta(milliseconds=500), (first, second)


def backdate(engine: Engine, table: Table, column: str, seconds: int, **where: Any) -> int:
    """Set `column` to database time minus `seconds` on matching rows (time travel without sleep)."""
    with engine.begin() as connection:
        result = connection.execute(
            update(table)
            .where(*[table.c[key] == value for key, value in where.items()])
            .values({column: ago(seconds)})
        )
        return result.rowcount


def all_rows(engine: Engine, table: Table, **where: Any) -> list[dict[str, Any]]:
    with engine.connect() as connection:
        statement = select(table).where(*[table.c[key] == value for key, value in where.items()])
        return [dict(row) for row in connection.execute(statement).mappings()]


def one(engine: Engine, table: Table, **where: Any) -> dict[str, Any] | None:
    found = all_rows(engine, table, **where)
    assert len(found) <= 1, f"expected at most one {table.name} row, got {len(found)}"
    return found[0] if found else None


def count(engine: Engine, table: Table, **where: Any) -> int:
    with engine.connect() as connection:
        statement = (
            select(func.count())
            .select_from(table)
            .where(*[table.c[key] == value for key, value in where.items()])
        )
        return connection.execute(statement).scalar_one()


def snapshot(engine: Engine, tables: Sequence[Table] = schema.EMDASH_TABLES) -> dict[str, list]:
    """Every row of the given tables, for "bad input changes nothing" assertions."""
    result = {}
    with engine.connect() as connection:
        for table in tables:
            ordered = select(table).order_by(*table.primary_key.columns)
            result[table.name] = [tuple(row) for row in connection.execute(ordered)]
    return result


__all__ = [
    "IMAGE_ONLY",
    "MEDIA_FIELDS",
    "NO_MEDIA",
    "Collection",
    "all_rows",
    "backdate",
    "count",
    "db_now",
    "make_collection",
    "one",
    "set_activation",
    "set_status",
    "snapshot",
    "status_row",
]


class recorded_statements:
    """`with recorded_statements(engine) as sent:` collects every SQL statement the engine
    sends inside the block (BEGIN included)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.statements: list[str] = []

    def _record(self, _connection, _cursor, statement, _parameters, _context, _executemany):
        self.statements.append(statement)

    def __enter__(self) -> list[str]:
        from sqlalchemy import event

        event.listen(self.engine, "before_cursor_execute", self._record)
        return self.statements

    def __exit__(self, *_exc) -> None:
        from sqlalchemy import event

        event.remove(self.engine, "before_cursor_execute", self._record)


def waiter_on_table_lock(engine: Engine, table_name: str, timeout_seconds: float) -> bool:
    """Poll pg_locks until some backend waits for a lock on the table (False on timeout)."""
    return _polled_until_counted(
        engine,
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = to_regclass(:name)",
        {"name": table_name},
        timeout_seconds,
    )


def session_waits_for_lock(engine: Engine, application_name: str, timeout_seconds: float) -> bool:
    """Poll until a session named `application_name` waits for a lock (a row another
    transaction holds, say); False on timeout."""
    return _polled_until_counted(
        engine,
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE application_name = :name AND wait_event_type = 'Lock'",
        {"name": application_name},
        timeout_seconds,
    )


def _polled_until_counted(
    engine: Engine, counting_sql: str, parameters: dict[str, Any], timeout_seconds: float
) -> bool:
    """Run the count until it is positive (True) or the timeout passes (False)."""
    deadline = time.monotonic() + timeout_seconds
    with engine.connect() as monitor:
        while time.monotonic() < deadline:
            counted = monitor.execute(text(counting_sql), parameters).scalar_one()
            monitor.rollback()
            if counted:
                return True
            time.sleep(0.02)
    return False


__all__ += ["recorded_statements", "session_waits_for_lock", "waiter_on_table_lock"]
