"""Throwaway PostgreSQL schemas: a database of its own for one measurement or one test, on a
shared server, selected through the URL's `search_path` and dropped afterwards."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from sqlalchemy import create_engine
from sqlalchemy.engine import URL

from .engine import normalize_url


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
    admin = create_engine(normalize_url(server), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        try:
            yield schema, with_search_path(server, schema).render_as_string(hide_password=False)
        finally:
            if not keep:
                with admin.connect() as connection:
                    connection.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    finally:
        admin.dispose()


@contextlib.contextmanager
def scratch_database(server: str | URL, prefix: str) -> Iterator[URL]:
    """A new empty database `<prefix>_<random>` on `server` (its URL, the driver left as the
    caller's to choose), dropped on exit with whatever is still connected to it."""
    name = f"{prefix}_{uuid.uuid4().hex[:16]}"
    admin = create_engine(normalize_url(server), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield normalize_url(server).set(database=name)
        finally:
            with admin.connect() as connection:
                connection.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


__all__ = ["scratch_database", "scratch_schema", "with_search_path"]
