"""The collection registry (`_emdash_collections`): lookups by slug and identity, and listings.

These are plain reads. A write that must still find the registry identity when it commits
does not look it up first: it re-asserts it in its own WHERE clause
(`predicates.registry_identity_is_current`).
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import Connection, Engine, exists, func, inspect, select
from sqlalchemy.exc import SQLAlchemyError

from media_usage_orchestration.store.core.engine import (
    create_database_engine,
    database_error_message,
    normalize_url,
    read_transaction,
    scrubbed,
)
from media_usage_orchestration.store.core.schema import collection_deletions, collections
from media_usage_orchestration.values.errors import RegistryUnreadable
from media_usage_orchestration.values.identifiers import validate_identifier

# How long a load of the registry waits for PostgreSQL before it does without.
REGISTRY_CONNECT_TIMEOUT_SECONDS = 5


class RegisteredCollection(NamedTuple):
    """A registry row's identity; unpacks as `(id, slug)`."""

    id: str
    slug: str


def collection_id_for_slug(connection: Connection, slug: str) -> str | None:
    """The id registered under `slug`; None when no collection has it."""
    validate_identifier(slug, "collection slug")
    return connection.execute(select(collections.c.id).where(collections.c.slug == slug)).scalar()


def collection_identity_exists(connection: Connection, collection_id: str, slug: str) -> bool:
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


def list_live_collection_slugs(connection: Connection) -> list[str]:
    """Registered slugs no deletion tombstone holds, in order (no registry table: none)."""
    tables = inspect(connection)
    if not tables.has_table(collections.name):
        return []
    statement = select(collections.c.slug).order_by(collections.c.slug)
    if tables.has_table(collection_deletions.name):
        tombstoned = exists().where(collection_deletions.c.collection_slug == collections.c.slug)
        statement = statement.where(~tombstoned)
    return list(connection.execute(statement).scalars())


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


def read_collection_slug(engine: Engine, collection_id: str) -> str | None:
    """The slug registered for `collection_id`; None when the registry no longer has it."""
    statement = select(collections.c.slug).where(collections.c.id == collection_id)
    with read_transaction(engine) as connection:
        return connection.execute(statement).scalar()


def read_collection_identity_exists(engine: Engine, collection_id: str, slug: str) -> bool:
    with read_transaction(engine) as connection:
        return collection_identity_exists(connection, collection_id, slug)


def read_collection_slugs(engine: Engine) -> list[str]:
    with read_transaction(engine) as connection:
        return list_collection_slugs(connection)


def read_live_collection_slugs_at(url: str) -> list[str]:
    """The live slugs of the database at `url`, read once through a read-only engine of its
    own (a missing SQLite file is not created); RegistryUnreadable when it cannot be read."""
    try:
        options = {}
        if normalize_url(url).get_backend_name() == "postgresql":
            options["connect_args"] = {"connect_timeout": REGISTRY_CONNECT_TIMEOUT_SECONDS}
        engine = create_database_engine(url, read_only=True, **options)
    except (ValueError, ImportError, SQLAlchemyError) as error:
        raise RegistryUnreadable(scrubbed(str(error), url)) from None
    try:
        with read_transaction(engine) as connection:
            return list_live_collection_slugs(connection)
    except SQLAlchemyError as error:
        raise RegistryUnreadable(scrubbed(database_error_message(error), url)) from None
    except (ValueError, ImportError, OSError) as error:
        raise RegistryUnreadable(scrubbed(str(error), url)) from None
    finally:
        engine.dispose()
