"""Reading and changing work rows in the work repository tests (rows are built with
`tests.support.factories`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, update

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.work.records import WorkLease
from tests.support.states import one
from tests.support.triggers import create_trigger

ULID_PATTERN = r"^[0-9A-HJKMNP-TV-Z]{26}$"


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
    create_trigger(
        db.engine,
        name,
        table=schema.index_status.name,
        event="AFTER UPDATE OF change_epoch",
        action=statement,
    )
