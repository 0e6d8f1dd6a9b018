"""Reads that check the index against the content: the verify oracle's and the scrubber's
pages, sources, occurrences, counts and work states, and the demo's end-state checks.

Read-only; each function runs inside the caller's (snapshot) transaction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Select,
    and_,
    column,
    exists,
    func,
    inspect,
    literal,
    select,
    table,
)
from sqlalchemy.sql.elements import ColumnElement

from media_usage_orchestration.store.core.clock import now
from media_usage_orchestration.store.core.engine import is_postgres, read_transaction
from media_usage_orchestration.store.core.leases import LeaseState
from media_usage_orchestration.store.core.predicates import is_content_collection_status
from media_usage_orchestration.store.core.schema import (
    collection_deletions,
    collections,
    content_table,
    index_status,
    occurrences,
    revisions,
    sources,
    work,
)
from media_usage_orchestration.store.host.registry import RegisteredCollection
from media_usage_orchestration.values.identifiers import content_table_name
from media_usage_orchestration.values.source_records import (
    CANONICAL_IDENTITY_VERSION,
    SOURCE_TYPE_CONTENT,
)

OPEN_WORK_STATES = (LeaseState.PENDING.value, LeaseState.LEASED.value, LeaseState.RETRY.value)


@contextlib.contextmanager
def snapshot_read_transaction(engine: Engine) -> Iterator[Connection]:
    """One snapshot for a whole comparison: PostgreSQL's READ COMMITTED would let pages see
    different states; a SQLite read transaction already is a snapshot."""
    if not is_postgres(engine):
        with read_transaction(engine) as connection:
            yield connection
        return
    with engine.connect() as connection:
        connection = connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            connection.exec_driver_sql("SET TRANSACTION READ ONLY")
            yield connection


def _captured(*columns: ColumnElement) -> Select:
    """Registry collections whose status row of the same identity has capture `active`."""
    return (
        select(collections.c.id, collections.c.slug, *columns)
        .join(
            index_status,
            and_(
                index_status.c.collection_id == collections.c.id,
                index_status.c.scope_key == collections.c.slug,
            ),
        )
        .where(is_content_collection_status(), index_status.c.capture_state == "active")
        .order_by(collections.c.slug)
    )


def captured_collections(
    connection: Connection, slugs: Sequence[str] | None
) -> list[RegisteredCollection]:
    """Registry collections whose status row of the same identity has capture `active` (only
    those of `slugs`, when given), by slug."""
    statement = _captured()
    if slugs:
        statement = statement.where(collections.c.slug.in_(list(slugs)))
    return [RegisteredCollection(row.id, row.slug) for row in connection.execute(statement)]


@dataclass(frozen=True)
class CapturedCoverage:
    """A captured collection and the fields of its status row that say whether its coverage is
    complete and trusted."""

    collection_id: str
    collection_slug: str
    status: str | None
    schema_version: int | None
    reconciliation_required: bool


def captured_coverage(connection: Connection) -> list[CapturedCoverage]:
    """Every captured collection (as `captured_collections`) with its coverage fields, by slug."""
    statement = _captured(
        index_status.c.status, index_status.c.schema_version, index_status.c.reconciliation_required
    )
    return [
        CapturedCoverage(
            row.id,
            row.slug,
            row.status,
            None if row.schema_version is None else int(row.schema_version),
            bool(row.reconciliation_required),
        )
        for row in connection.execute(statement)
    ]


def row_pages(
    connection: Connection, query: Select, key: ColumnElement, page_size: int
) -> Iterator[list[dict[str, Any]]]:
    """The rows of `query` in pages of `page_size`, in order of its unique column `key`."""
    cursor = None
    while rows := rows_after(connection, query, key, cursor, page_size):
        yield rows
        cursor = rows[-1][key.name]


def rows_after(
    connection: Connection, query: Select, key: ColumnElement, after: Any, limit: int
) -> list[dict[str, Any]]:
    """At most `limit` rows of `query` whose unique column `key` is past `after` (from the
    first without one), in order of `key`."""
    page = query.order_by(key).limit(limit)
    if after is not None:
        page = page.where(key > after)
    return [dict(row._mapping) for row in connection.execute(page)]


def revisions_by_id(connection: Connection, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    statement = select(
        revisions.c.id, revisions.c.collection, revisions.c.entry_id, revisions.c.data
    ).where(revisions.c.id.in_(ids))
    return {row.id: dict(row._mapping) for row in connection.execute(statement)}


def _canonical_sources(collection_id: str) -> ColumnElement[bool]:
    return and_(
        sources.c.source_type == SOURCE_TYPE_CONTENT,
        sources.c.collection_id == collection_id,
        sources.c.identity_version == CANONICAL_IDENTITY_VERSION,
    )


def canonical_source_rows(
    connection: Connection, collection_id: str, content_ids: Sequence[str]
) -> list[Mapping[str, Any]]:
    """The collection's canonical source rows of these entries, every column."""
    statement = select(sources).where(
        _canonical_sources(collection_id), sources.c.content_id.in_(content_ids)
    )
    return [row._mapping for row in connection.execute(statement)]


def current_occurrence_rows(
    connection: Connection,
    collection_id: str,
    content_ids: Sequence[str],
    columns: Sequence[str],
) -> list[Mapping[str, Any]]:
    """The occurrences (`source_key` and `columns`) of the current generation of these
    entries' canonical sources."""
    statement = (
        select(occurrences.c.source_key, *(occurrences.c[name] for name in columns))
        .join(
            sources,
            and_(
                sources.c.source_key == occurrences.c.source_key,
                sources.c.current_generation == occurrences.c.generation,
            ),
        )
        .where(_canonical_sources(collection_id), sources.c.content_id.in_(content_ids))
    )
    return [row._mapping for row in connection.execute(statement)]


def canonical_sources_without_entry(
    connection: Connection,
    collection_id: str,
    collection_slug: str,
    after: str | None = None,
    through: str | None = None,
) -> list[tuple[str, str]]:
    """(source_key, content_id) of canonical sources whose entry is gone, by source key; only
    those whose content id is past `after` and at most `through`, when given."""
    content = table(content_table_name(collection_slug), column("id")).alias("content")
    statement = (
        select(sources.c.source_key, sources.c.content_id)
        .where(
            _canonical_sources(collection_id),
            ~exists(
                select(literal(1)).select_from(content).where(content.c.id == sources.c.content_id)
            ),
        )
        .order_by(sources.c.source_key)
    )
    if after is not None:
        statement = statement.where(sources.c.content_id > after)
    if through is not None:
        statement = statement.where(sources.c.content_id <= through)
    return [(row.source_key, row.content_id) for row in connection.execute(statement)]


def abandoned_occurrence_count(connection: Connection, collection_id: str) -> int:
    """Rows outside every current generation: of a canonical source's other generations, or
    under this collection's key prefix with no source row at all."""
    stale = (
        select(func.count())
        .select_from(occurrences)
        .join(sources, sources.c.source_key == occurrences.c.source_key)
        .where(
            _canonical_sources(collection_id),
            occurrences.c.generation != sources.c.current_generation,
        )
    )
    prefix = f"content:{collection_id}:"
    orphaned = (
        select(func.count())
        .select_from(occurrences)
        .where(
            func.substr(occurrences.c.source_key, 1, len(prefix)) == prefix,
            ~exists(
                select(literal(1))
                .select_from(sources)
                .where(sources.c.source_key == occurrences.c.source_key)
            ),
        )
    )
    return sum(connection.execute(query).scalar_one() for query in (stale, orphaned))


def work_count(connection: Connection, collection_id: str | None = None) -> int:
    """Work rows of the collection (of every collection without one), in any state."""
    statement = select(func.count()).select_from(work)
    if collection_id is not None:
        statement = statement.where(work.c.collection_id == collection_id)
    return connection.execute(statement).scalar_one()


def entries_with_open_work(
    connection: Connection, collection_id: str, content_ids: Sequence[str]
) -> set[str]:
    """Those of `content_ids` whose work row is pending, leased or retrying: an edit (or a
    retry) the work path has not finished, so their index may lag behind on purpose."""
    if not content_ids:
        return set()
    statement = select(work.c.content_id).where(
        work.c.collection_id == collection_id,
        work.c.content_id.in_(list(content_ids)),
        work.c.state.in_(OPEN_WORK_STATES),
    )
    return set(connection.execute(statement).scalars())


def database_now(connection: Connection) -> str:
    return connection.execute(select(now())).scalar_one()


# --- the demo's end-state checks ---------------------------------------------------------------


def collection_is_gone(connection: Connection, slug: str) -> bool:
    """No registry row, no content table, no status row, no tombstone, no sources, no work."""
    leftovers = [
        connection.execute(select(func.count()).where(where)).scalar_one()
        for where in (
            collections.c.slug == slug,
            index_status.c.scope_key == slug,
            collection_deletions.c.collection_slug == slug,
            sources.c.collection_slug == slug,
            work.c.collection_slug == slug,
        )
    ]
    table_exists = inspect(connection).has_table(content_table_name(slug))
    return not any(leftovers) and not table_exists


def complete_collection_slugs(connection: Connection) -> set[str]:
    """Slugs whose content-media coverage is complete and trusted."""
    statement = select(index_status.c.scope_key).where(
        is_content_collection_status(),
        index_status.c.status == "complete",
        index_status.c.reconciliation_required == 0,
    )
    return set(connection.execute(statement).scalars())


def entry_counts(connection: Connection, slug: str) -> tuple[int, int, int]:
    """(entries, entries with a draft, trashed entries) of the collection's content table."""
    content = content_table(slug)
    return connection.execute(
        select(
            func.count(),
            func.count(content.c.draft_revision_id),
            func.count(content.c.deleted_at),
        ).select_from(content)
    ).one()
