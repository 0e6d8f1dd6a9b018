"""The collection registry (`_emdash_collections`): lookups by slug and identity, and listings.

These are plain reads. A write that must still find the registry identity when it commits
does not look it up first: it re-asserts it in its own WHERE clause
(`predicates.registry_identity_is_current`).
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import Connection, Engine, func, inspect, select

from .engine import read_transaction
from .identifiers import validate_identifier
from .schema import collections


class RegisteredCollection(NamedTuple):
    """A registry row's identity; unpacks as `(id, slug)`."""

    id: str
    slug: str


def collection_id_for_slug(connection: Connection, slug: str) -> str | None:
    """The id registered under `slug`; None when no collection has it."""
    validate_identifier(slug, "collection slug")
    return connection.execute(select(collections.c.id).where(collections.c.slug == slug)).scalar()


def has_collection_identity(connection: Connection, collection_id: str, slug: str) -> bool:
    """A registry row with exactly (id, slug)."""
    found = connection.execute(
        select(collections.c.id).where(
            collections.c.id == collection_id, collections.c.slug == slug
        )
    )
    return found.first() is not None


def list_collections(
    connection: Connection, *, after: str | None = None, limit: int | None = None
) -> list[RegisteredCollection]:
    """Registry collections by slug: those after the slug `after`, at most `limit`."""
    statement = select(collections.c.id, collections.c.slug)
    if after:
        statement = statement.where(collections.c.slug > after)
    statement = statement.order_by(collections.c.slug)
    if limit is not None:
        statement = statement.limit(limit)
    return [RegisteredCollection(row.id, row.slug) for row in connection.execute(statement)]


def list_collection_slugs(connection: Connection) -> list[str]:
    """Every registered slug, in order."""
    return list(
        connection.execute(select(collections.c.slug).order_by(collections.c.slug)).scalars()
    )


def holds_collections(connection: Connection) -> bool:
    """The database has a registry with at least one collection (no registry table: none)."""
    if not inspect(connection).has_table(collections.name):
        return False
    count = select(func.count()).select_from(collections)
    return connection.execute(count).scalar_one() > 0


# -- one read transaction each, for callers that hold only an engine ---------------------------


def read_collection_id(engine: Engine, slug: str) -> str | None:
    with read_transaction(engine) as connection:
        return collection_id_for_slug(connection, slug)


def read_collection_slugs(engine: Engine) -> list[str]:
    with read_transaction(engine) as connection:
        return list_collection_slugs(connection)
