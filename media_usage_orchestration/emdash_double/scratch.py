"""Throwaway PostgreSQL schemas: a database of its own for one measurement or one test, on a
shared server, selected through the URL's `search_path` and dropped afterwards."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from sqlalchemy import create_engine
from sqlalchemy.engine import URL

from media_usage_orchestration.store.core.engine import normalize_url


def with_search_path(server: str | URL, schema: str) -> URL:
    """`server` whose connections use `schema` first, keeping any other `options`."""
    url = normalize_url(server)
    options = url.query.get("options")
    options = f"{options} " if isinstance(options, str) and options else ""
    return url.update_query_dict({"options": f"{options}-csearch_path={schema}"})


@contextlib.contextmanager
def scratch_schema(
    server: str | URL, prefix: str, *, keep: bool = False
) -> Iterator[tuple[str, str]]:
    """(schema name, URL with the password) of a new empty schema `<prefix>_<random>`, dropped
    on exit unless `keep`."""
    schema = f"{prefix}_{uuid.uuid4().hex[:16]}"
    drop = None if keep else f'DROP SCHEMA "{schema}" CASCADE'
    with _created(server, f'CREATE SCHEMA "{schema}"', drop):
        yield schema, with_search_path(server, schema).render_as_string(hide_password=False)


@contextlib.contextmanager
def scratch_database(server: str | URL, prefix: str) -> Iterator[URL]:
    """A new empty database `<prefix>_<random>` on `server` (its URL, the driver left as the
    caller's to choose), dropped on exit with whatever is still connected to it."""
    name = f"{prefix}_{uuid.uuid4().hex[:16]}"
    with _created(server, f'CREATE DATABASE "{name}"', f'DROP DATABASE "{name}" WITH (FORCE)'):
        yield normalize_url(server).set(database=name)


@contextlib.contextmanager
def _created(server: str | URL, create: str, drop: str | None) -> Iterator[None]:
    """Run `create` on the server, then `drop` (unless None) when the block ends."""
    admin = create_engine(normalize_url(server), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(create)
        try:
            yield
        finally:
            if drop is not None:
                with admin.connect() as connection:
                    connection.exec_driver_sql(drop)
    finally:
        admin.dispose()


__all__ = ["scratch_database", "scratch_schema", "with_search_path"]
