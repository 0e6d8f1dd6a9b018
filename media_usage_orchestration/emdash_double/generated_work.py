"""A large synthetic work backlog in one statement, for timing the probes that must stay fast
whatever the size of the work table (`media-usage bench --workload tick`).

`INSERT ... SELECT` from `generate_series` (PostgreSQL) or a recursive CTE (SQLite): no rows
travel from Python. Of every 40 rows, 38 are pending and due now, one is retrying in an hour
and one is leased for an hour, as a backlog being worked through looks.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Index,
    Integer,
    Text,
    case,
    func,
    insert,
    literal,
    null,
    select,
)

from media_usage_orchestration.store.core.clock import now, timestamp_offset
from media_usage_orchestration.store.core.engine import is_postgres
from media_usage_orchestration.store.core.leases import positive_whole
from media_usage_orchestration.store.core.schema import work
from media_usage_orchestration.values.identifiers import require_text

ROWS_PER_CYCLE = 40
FUTURE_SECONDS = 3600


def _series(engine: Engine, count: int):
    """A one-column relation `n` = 1..count."""
    if is_postgres(engine):
        return func.generate_series(1, count).table_valued("n").render_derived(name="series")
    seed = select(literal(1, Integer).label("n")).cte("series", recursive=True)
    return seed.union_all(select(seed.c.n + 1).where(seed.c.n < count))


def _secondary_indexes_dropped(connection: Connection) -> list[Index]:
    """On PostgreSQL, the work table's secondary indexes dropped inside the caller's
    transaction, to be rebuilt after the insert: building an index over a million rows is
    several times faster than updating it a million times. SQLite gains nothing from this."""
    if not is_postgres(connection):
        return []
    indexes = sorted(work.indexes, key=lambda index: index.name)
    for index in indexes:
        index.drop(connection)
    return indexes


def insert_generated_work(
    engine: Engine, collection_id: str, collection_slug: str, count: int, *, analyze: bool = True
) -> int:
    """`count` work rows of one collection, content ids `gen-00000001`...; returns `count`.
    With `analyze`, PostgreSQL's statistics are brought up to date afterwards, as autovacuum
    would have them for a table this size in production."""
    require_text(collection_id, "Generated work requires a collection ID")
    require_text(collection_slug, "Generated work requires a collection slug")
    count = positive_whole(count, "Generated work row count")
    series = _series(engine, count)
    # The clock read once, not five times a row.
    stamps = select(now().label("now_at"), timestamp_offset(FUTURE_SECONDS).label("later_at"))
    stamps = stamps.subquery("stamps")
    n = series.c.n
    cycle = n % ROWS_PER_CYCLE
    retrying, leased = cycle == 0, cycle == 1
    source = select(
        literal(collection_id, Text),
        literal(collection_slug, Text),
        literal("gen-", Text).concat(func.lpad(n.cast(Text), 8, "0"))
        if is_postgres(engine)
        else literal("gen-", Text).concat(func.printf("%08d", n)),
        literal(1, BigInteger),
        literal(1, BigInteger),
        case((retrying, "retry"), (leased, "leased"), else_="pending"),
        case((retrying, 1), else_=0),
        case((retrying, stamps.c.later_at), else_=stamps.c.now_at),
        case((leased, literal("gen-lease-", Text).concat(n.cast(Text))), else_=null()),
        case((leased, stamps.c.later_at), else_=null()),
        null(),
        null(),
        stamps.c.now_at,
        stamps.c.now_at,
    ).select_from(series.join(stamps, literal(True)))
    statement = insert(work).from_select(tuple(work.c.keys()), source)
    with engine.begin() as connection:
        rebuilt = _secondary_indexes_dropped(connection)
        connection.execute(statement)
        for index in rebuilt:
            index.create(connection)
        if analyze and is_postgres(connection):
            connection.exec_driver_sql(f"ANALYZE {work.name}")
    return count


__all__ = ["insert_generated_work"]
