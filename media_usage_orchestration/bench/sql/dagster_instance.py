"""The Dagster instance's PostgreSQL database, as the soak benchmark samples it: every table's
bytes (with its indexes and TOAST) and exact row count, and how the run-bound and runless halves
of `event_logs` and the statuses of `job_ticks` split their rows and row data (instance pruning
and tick retention treat them apart). Read-only; the tables are Dagster's, named by
dagster-postgres.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import URL, text
from sqlalchemy.engine import Connection

from media_usage_orchestration.store.core.engine import Engine, create_database_engine

# The parts a split table's growth is shared among; a table not split is one part.
RUNLESS_EVENTS = "event_logs:runless"
RUN_EVENTS = "event_logs:run"


@dataclass(frozen=True)
class TableSample:
    name: str
    bytes: int
    rows: int


@dataclass(frozen=True)
class InstanceSample:
    at: float  # wall clock, seconds
    database_bytes: int
    tables: dict[str, TableSample]
    # part -> (rows, bytes of row data): event_logs by run-bound/runless, job_ticks by status
    parts: dict[str, tuple[int, int]]
    event_types: dict[str, int]  # event_logs rows by dagster_event_type
    tick_origins: dict[str, int] = field(default_factory=dict)  # job_ticks rows by origin id

    def table_bytes(self) -> int:
        return sum(table.bytes for table in self.tables.values())


TABLES = text(
    "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = 'public' AND c.relkind = 'r' ORDER BY c.relname"
)
EVENT_PARTS = text(
    "SELECT run_id = '' AS runless, count(*), coalesce(sum(pg_column_size(event_logs.*)), 0) "
    "FROM event_logs GROUP BY 1"
)
EVENT_TYPES = text(
    "SELECT coalesce(dagster_event_type, 'log message'), count(*) FROM event_logs GROUP BY 1"
)
TICK_ORIGINS = text("SELECT job_origin_id, count(*) FROM job_ticks GROUP BY 1")
TICK_PARTS = text(
    "SELECT type, status, count(*), coalesce(sum(pg_column_size(job_ticks.*)), 0) "
    "FROM job_ticks GROUP BY 1, 2"
)


def instance_tables(connection: Connection) -> InstanceSample:
    """One sample of the instance database (a few cheap statements: its tables are small)."""
    tables = {}
    for name, size in connection.execute(TABLES):
        quoted = connection.dialect.identifier_preparer.quote(name)
        rows = connection.execute(text(f"SELECT count(*) FROM {quoted}")).scalar_one()
        tables[name] = TableSample(name, int(size), int(rows))
    parts: dict[str, tuple[int, int]] = {}
    if "event_logs" in tables:
        for runless, rows, size in connection.execute(EVENT_PARTS):
            parts[RUNLESS_EVENTS if runless else RUN_EVENTS] = (int(rows), int(size))
    if "job_ticks" in tables:
        for kind, status, rows, size in connection.execute(TICK_PARTS):
            parts[f"job_ticks:{kind}:{status}"] = (int(rows), int(size))
    event_types = (
        {kind: int(rows) for kind, rows in connection.execute(EVENT_TYPES)}
        if "event_logs" in tables
        else {}
    )
    origins = (
        {origin: int(rows) for origin, rows in connection.execute(TICK_ORIGINS)}
        if "job_ticks" in tables
        else {}
    )
    database = connection.execute(text("SELECT pg_database_size(current_database())"))
    size = int(database.scalar_one())
    return InstanceSample(time.time(), size, tables, parts, event_types, origins)


def instance_database_engine(variables: Mapping[str, str]) -> Engine:
    """A read-only engine on the instance database the five `DAGSTER_PG_*` variables name (as
    deploy/dagster.yaml reads them)."""
    url = URL.create(
        "postgresql+psycopg",
        username=variables["DAGSTER_PG_USER"],
        password=variables["DAGSTER_PG_PASSWORD"] or None,
        host=variables["DAGSTER_PG_HOST"],
        port=int(variables["DAGSTER_PG_PORT"]),
        database=variables["DAGSTER_PG_DB"],
    )
    return create_database_engine(url, read_only=True)


__all__ = [
    "RUNLESS_EVENTS",
    "RUN_EVENTS",
    "InstanceSample",
    "TableSample",
    "instance_database_engine",
    "instance_tables",
]
