"""EmDash's migration record read for the host-schema contract (`values/host_schema.py`).

`_emdash_migrations` is EmDash's migrator's table (`name`, `timestamp`, the name its primary
key); the project only reads its names. A database without it keeps today's behaviour.
"""

from __future__ import annotations

from sqlalchemy import Column, Connection, Engine, MetaData, String, Table, inspect, select

from media_usage_orchestration.values.errors import MissingEmdashMigration, UnknownEmdashMigration
from media_usage_orchestration.values.host_schema import HostSchema

# Its own metadata: the table is EmDash's migrator's, never created or dropped by the project.
emdash_migrations = Table(
    "_emdash_migrations",
    MetaData(),
    Column("name", String(255), primary_key=True),
    Column("timestamp", String(255), nullable=False),
)


def read_host_schema(engine: Engine) -> HostSchema:
    """One catalog lookup, and the names when the table exists (a few dozen short rows)."""
    with engine.connect() as connection:
        return host_schema_of(connection)


def host_schema_of(connection: Connection) -> HostSchema:
    if not inspect(connection).has_table(emdash_migrations.name):
        return HostSchema.from_names(None)
    return HostSchema.from_names(connection.scalars(select(emdash_migrations.c.name)))


def refuse_unknown_migrations(engine: Engine) -> HostSchema:
    """The contract, or `UnknownEmdashMigration` when a later EmDash ran a media usage migration
    the project does not implement (nothing may be written then)."""
    host = read_host_schema(engine)
    if refusal := host.write_refusal():
        raise UnknownEmdashMigration(refusal)
    return host


def refuse_install(connection: Connection) -> HostSchema:
    """Before the installer, in its transaction: on an EmDash database the media usage tables
    are its migrator's, so the project completes them only when EmDash ran every media usage
    migration the project knows and none it does not."""
    host = host_schema_of(connection)
    if refusal := host.write_refusal():
        raise UnknownEmdashMigration(refusal)
    if refusal := host.install_refusal():
        raise MissingEmdashMigration(refusal)
    return host
