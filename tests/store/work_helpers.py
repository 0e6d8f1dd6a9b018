"""Builders for work-table states shared by the work repository tests."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, insert, text, update

from media_usage_orchestration.store import schema
from media_usage_orchestration.store.work import WorkLease
from tests.support import one

PAST = "2000-01-01T00:00:00.000Z"
FUTURE = "2999-01-01T00:00:00.000Z"
ULID_PATTERN = r"^[0-9A-HJKMNP-TV-Z]{26}$"


def work_row(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "collection_id": "collection-1",
        "collection_slug": "posts",
        "content_id": "entry-1",
        "change_epoch": 1,
        "work_version": 1,
        "state": "pending",
        "attempt_count": 0,
        "next_attempt_at": PAST,
        "lease_token": None,
        "lease_expires_at": None,
        "last_attempted_at": None,
        "last_error_code": None,
    }
    row.update(overrides)
    return row


def insert_work(engine: Engine, **overrides: Any) -> dict[str, Any]:
    row = work_row(**overrides)
    with engine.begin() as connection:
        connection.execute(insert(schema.work).values(**row))
    return row


def insert_works(engine: Engine, rows: list[dict[str, Any]]) -> None:
    with engine.begin() as connection:
        connection.execute(insert(schema.work), [work_row(**row) for row in rows])


def update_work(engine: Engine, values: dict[str, Any], **where: Any) -> int:
    table = schema.work
    with engine.begin() as connection:
        statement = update(table).where(*[table.c[key] == value for key, value in where.items()])
        return connection.execute(statement.values(**values)).rowcount


def read_work(
    engine: Engine, collection_id: str = "collection-1", content_id: str = "entry-1"
) -> dict[str, Any] | None:
    return one(engine, schema.work, collection_id=collection_id, content_id=content_id)


def lease(token: str, work_version: int = 1, content_id: str = "entry-1") -> WorkLease:
    return WorkLease("collection-1", content_id, work_version, token)


def after_epoch_bump(db, name: str, statement: str) -> None:
    """Run `statement` (which may use NEW.<column>) inside every change_epoch bump of a status
    row: a concurrent writer acting between two statements of the code under test."""
    table = schema.index_status.name
    with db.engine.begin() as connection:
        if db.is_postgres:
            connection.execute(
                text(
                    f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
                    f"$body$ BEGIN {statement}; RETURN NULL; END $body$"
                )
            )
            connection.execute(
                text(
                    f"CREATE TRIGGER {name} AFTER UPDATE OF change_epoch ON {table} "
                    f"FOR EACH ROW EXECUTE FUNCTION {name}()"
                )
            )
        else:
            connection.execute(
                text(
                    f"CREATE TRIGGER {name} AFTER UPDATE OF change_epoch ON {table} "
                    f"BEGIN {statement}; END"
                )
            )
