"""`media-usage bench --mode floor`: a reconciliation with nothing but what the schema's rules
need, to tell what the project's own driver adds.

It writes the end state the driver writes, on the same schema, with the project's extraction,
canonical JSON and fingerprints (`build_content_snapshots`, `published_values`,
`occurrence_rows`), in pages of 100 entries and plain bulk SQL. Its bookkeeping is the minimum
the rules ask for: each page's work rows are enqueued, claimed under one lease token and
completed in one statement each, and every source write is guarded in its own statement by
that token's live work lease and the source's generation (absent, as the scan found it). There
is no coordinator row, no per-page checkpoint, no admission and no retries: a floor, not a
replacement.

`end_state_digest` condenses what a reconciliation leaves (sources, their current occurrences,
coverage, and what must be gone) without the values that differ between two runs (generations,
ids, database times), so the floor's end state can be compared with a driver run's on a
database seeded the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import click
from sqlalchemy import (
    Connection,
    Integer,
    Text,
    and_,
    bindparam,
    delete,
    exists,
    func,
    literal,
    select,
    update,
)

from media_usage_orchestration.emdash_double.cms_writer import Collection
from media_usage_orchestration.media.fields import FieldDiscovery
from media_usage_orchestration.media.snapshots import build_content_snapshots
from media_usage_orchestration.media.sources import CONTENT_SOURCE_SCHEMA_VERSION
from media_usage_orchestration.processing.content_reads import read_fields
from media_usage_orchestration.processing.phases import phase
from media_usage_orchestration.store.content import content_rows_query, load_revisions
from media_usage_orchestration.store.core.clock import lease_live_at_clock, now, timestamp_offset
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.core.json_rows import JsonRows
from media_usage_orchestration.store.core.predicates import is_content_collection_status
from media_usage_orchestration.store.core.schema import (
    dialect_insert,
    generation_writes,
    index_status,
    occurrences,
    reconciliations,
    sources,
    work,
)
from media_usage_orchestration.store.sources.rows import content_table, execute_many
from media_usage_orchestration.values.source_records import (
    SOURCE_TYPE_CONTENT,
    new_ulids,
    occurrence_rows,
    published_values,
)

FLOOR_PAGE_SIZE = 100
WORK_LEASE_SECONDS = 60
_LEASED = "leased"


def reconcile_floor(engine: Engine, collection: Collection) -> int:
    """Reconcile `collection` from scratch the floor's way; returns its runs (one)."""
    discovery = read_fields(engine, collection.slug, collection.id)
    with phase("scan"), engine.begin() as connection:
        epoch = connection.execute(_TAKE_STATUS, {"page_collection_id": collection.id}).scalar()
    if epoch is None:
        raise click.ClickException("the floor found no active coverage status to reconcile")
    after = ""
    with phase("drain"):
        while (after := _page(engine, collection, discovery, epoch, after)) is not None:
            pass
    with phase("sources"), engine.begin() as connection:
        _remove_sources_without_content(connection, collection)
    with phase("finalize"), engine.begin() as connection:
        connection.execute(_COMPLETE_STATUS, {"page_collection_id": collection.id})
        connection.execute(
            delete(reconciliations).where(reconciliations.c.collection_id == collection.id)
        )
    return 1


def _page(
    engine: Engine, collection: Collection, discovery: FieldDiscovery, epoch: int, after: str
) -> str | None:
    """One page: read, enqueue and claim its work (one transaction), build its rows, then
    write them and complete the work (another); the last id, or None after the last page."""
    token = new_ulids(1)[0]
    identity = {"page_collection_id": collection.id, "page_collection_slug": collection.slug}
    query, content = content_rows_query(collection.slug, collection.id, discovery)
    page = query.add_columns(now().label("page_now")).where(content.c.id > after)
    page = page.order_by(content.c.id).limit(FLOOR_PAGE_SIZE)
    with engine.begin() as connection:
        rows = [dict(row._mapping) for row in connection.execute(page)]
        if not rows:
            return None
        bounds = {**identity, "after": after, "last": rows[-1]["id"], "page_lease_token": token}
        connection.execute(_enqueue_statement(collection.slug), {**bounds, "epoch": epoch})
        connection.execute(_CLAIM, bounds)
        drafts = [row["draft_revision_id"] for row in rows if row.get("draft_revision_id")]
        revisions = load_revisions(connection, drafts)
    built_sources, built_occurrences = _built(collection, discovery, rows, revisions)
    with engine.begin() as connection:
        _insert_occurrences(connection, built_occurrences)
        _insert_sources(connection, built_sources, token)
        connection.execute(_COMPLETE_WORK, {**identity, "page_lease_token": token})
    return rows[-1]["id"]


def _built(
    collection: Collection,
    discovery: FieldDiscovery,
    rows: Sequence[Mapping[str, Any]],
    revisions: Mapping[str, Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each entry's source rows and occurrence rows, as the project builds them."""
    built_sources: list[dict[str, Any]] = []
    built_occurrences: list[dict[str, Any]] = []
    for row in rows:
        revision = revisions.get(row.get("draft_revision_id") or "")
        result = build_content_snapshots(collection.id, collection.slug, discovery, row, revision)
        if not result.success:
            raise click.ClickException(f"the floor cannot project {row['id']}: {result.error}")
        stamp = row["page_now"]
        for snapshot in result.snapshots:
            generation = new_ulids(1)[0]
            built_sources.append(published_values(snapshot, generation, stamp))
            built_occurrences += occurrence_rows(
                snapshot.source_key, generation, snapshot.occurrences, stamp
            )
    return built_sources, built_occurrences


# --- statements ---------------------------------------------------------------------------------

_TAKE_STATUS = (
    update(index_status)
    .where(
        is_content_collection_status(),
        index_status.c.collection_id == bindparam("page_collection_id"),
        index_status.c.capture_state == "active",
    )
    .values(
        status="running",
        change_epoch=index_status.c.change_epoch + 1,
        reconciliation_required=1,
        started_at=now(),
        updated_at=now(),
    )
    .returning(index_status.c.change_epoch)
)
_COMPLETE_STATUS = (
    update(index_status)
    .where(
        is_content_collection_status(),
        index_status.c.collection_id == bindparam("page_collection_id"),
        index_status.c.status == "running",
        ~exists(
            select(work.c.content_id).where(work.c.collection_id == bindparam("page_collection_id"))
        ),
    )
    .values(
        status="complete",
        schema_version=CONTENT_SOURCE_SCHEMA_VERSION,
        completed_at=now(),
        cursor=None,
        last_error_code=None,
        indexed_source_count=0,
        failed_source_count=0,
        reconciliation_required=0,
        # The drain's completed work marks it, as the driver's work batches do.
        last_incremental_success_at=now(),
        updated_at=now(),
    )
)


def _enqueue_statement(collection_slug: str):
    """The page's work rows, pending, straight from the content table's id range."""
    content = content_table(collection_slug)
    selected = select(
        bindparam("page_collection_id", type_=Text),
        bindparam("page_collection_slug", type_=Text),
        content.c.id,
        bindparam("epoch", type_=Integer),
        now(),
    ).where(content.c.id > bindparam("after"), content.c.id <= bindparam("last"))
    names = ["collection_id", "collection_slug", "content_id", "change_epoch", "next_attempt_at"]
    return work.insert().from_select(names, selected)


_PAGE_WORK = and_(
    work.c.collection_id == bindparam("page_collection_id"),
    work.c.content_id > bindparam("after"),
    work.c.content_id <= bindparam("last"),
)
_CLAIM = (
    update(work)
    .where(_PAGE_WORK, work.c.state == "pending")
    .values(
        state=_LEASED,
        lease_token=bindparam("page_lease_token"),
        lease_expires_at=timestamp_offset(WORK_LEASE_SECONDS),
        last_attempted_at=now(),
        updated_at=now(),
    )
)
_COMPLETE_WORK = delete(work).where(
    work.c.collection_id == bindparam("page_collection_id"),
    work.c.lease_token == bindparam("page_lease_token"),
    work.c.state == _LEASED,
    lease_live_at_clock(work.c.lease_expires_at),
)


def _insert_occurrences(connection: Connection, rows: list[dict[str, Any]]) -> None:
    """SQLite takes the rows through `executemany`; PostgreSQL as one JSON relation (each the
    faster on its dialect)."""
    if not rows:
        return
    names = tuple(rows[0])
    if connection.dialect.name == "sqlite":
        execute_many(connection, occurrences.insert(), rows, names)
        return
    relation = _relation_of("floor_occurrence", occurrences, names)
    derived = relation.relation("postgresql")
    statement = occurrences.insert().from_select(
        list(names), select(*(derived.c[name] for name in names))
    )
    connection.execute(statement, relation.bind("postgresql", rows))


def _insert_sources(connection: Connection, rows: list[dict[str, Any]], token: str) -> None:
    """Each source only while its entry's work is leased to `token` and live, and only if it
    is still absent (the generation the page found)."""
    if not rows:
        return
    names = tuple(rows[0])
    if connection.dialect.name == "sqlite":
        values = {name: bindparam(name, type_=sources.c[name].type) for name in names}
        statement = _guarded_source_insert("sqlite", names, values)
        execute_many(connection, statement, [{**row, "page_lease_token": token} for row in rows])
        return
    relation = _relation_of("floor_source", sources, names)
    derived = relation.relation("postgresql")
    statement = _guarded_source_insert(
        "postgresql", names, {name: derived.c[name] for name in names}
    )
    connection.execute(statement, {"page_lease_token": token, **relation.bind("postgresql", rows)})


def _guarded_source_insert(dialect_name: str, names: tuple[str, ...], values: Mapping[str, Any]):
    held = exists(
        select(literal(1)).where(
            work.c.collection_id == values["collection_id"],
            work.c.content_id == values["content_id"],
            work.c.lease_token == bindparam("page_lease_token", type_=Text),
            work.c.state == _LEASED,
            lease_live_at_clock(work.c.lease_expires_at),
        )
    )
    selected = select(*(values[name] for name in names)).where(held)
    return (
        dialect_insert(dialect_name, sources)
        .from_select(list(names), selected)
        .on_conflict_do_nothing(index_elements=[sources.c.source_key])
    )


def _relation_of(name: str, table, names: tuple[str, ...]) -> JsonRows:
    return JsonRows.of(
        name,
        {each: Integer() if isinstance(table.c[each].type, Integer) else Text() for each in names},
    )


def _remove_sources_without_content(connection: Connection, collection: Collection) -> None:
    """The source walk's work in two statements: canonical sources of entries that no longer
    exist go, with their occurrences."""
    content = content_table(collection.slug)
    orphaned = select(sources.c.source_key).where(
        sources.c.collection_id == collection.id,
        sources.c.source_type == SOURCE_TYPE_CONTENT,
        ~exists(select(literal(1)).where(content.c.id == sources.c.content_id)),
    )
    connection.execute(delete(occurrences).where(occurrences.c.source_key.in_(orphaned)))
    connection.execute(delete(sources).where(sources.c.source_key.in_(orphaned)))


# --- the end state ------------------------------------------------------------------------------

# Values that differ between two runs of the same reconciliation: fresh ids and database times.
_RUN_VALUES = frozenset(
    {
        "id",
        "generation",
        "current_generation",
        "created_at",
        "updated_at",
        "indexed_at",
        "last_attempted_at",
        "started_at",
        "completed_at",
        "source_updated_at",
        "last_incremental_success_at",
    }
)


def end_state_digest(engine: Engine, collection: Collection) -> dict[str, Any]:
    """`end_state` as counts and one SHA-256."""
    state = end_state(engine, collection)
    text = json.dumps(state, sort_keys=True, default=str)
    return {
        "sources": len(state["sources"]),
        "occurrences": len(state["occurrences"]),
        "digest": hashlib.sha256(text.encode()).hexdigest(),
    }


def end_state(engine: Engine, collection: Collection) -> dict[str, Any]:
    """What a reconciliation of `collection` leaves: the sources (with whether each carries
    its content row's `updated_at`), their current generation's occurrences, the coverage
    status, and the counts of work, coordinator and write-lease rows (which must be gone)."""
    with engine.connect() as connection:
        return {
            "sources": _source_rows(connection, collection),
            "occurrences": _current_occurrences(connection, collection),
            "status": _without_run_values(
                connection.execute(
                    select(index_status).where(
                        is_content_collection_status(),
                        index_status.c.collection_id == collection.id,
                    )
                ).mappings()
            ),
            "leftovers": [
                connection.execute(select(func.count()).select_from(table)).scalar()
                for table in (work, reconciliations, generation_writes)
            ],
        }


def _source_rows(connection: Connection, collection: Collection) -> list[str]:
    content = content_table(collection.slug)
    statement = (
        select(sources, (sources.c.source_updated_at == content.c.updated_at).label("current"))
        .select_from(sources.outerjoin(content, content.c.id == sources.c.content_id))
        .where(sources.c.collection_id == collection.id)
    )
    return _without_run_values(connection.execute(statement).mappings())


def _current_occurrences(connection: Connection, collection: Collection) -> list[str]:
    statement = (
        select(occurrences)
        .join(
            sources,
            and_(
                sources.c.source_key == occurrences.c.source_key,
                sources.c.current_generation == occurrences.c.generation,
            ),
        )
        .where(sources.c.collection_id == collection.id)
    )
    return _without_run_values(connection.execute(statement).mappings())


def _without_run_values(rows) -> list[str]:
    """Each row as JSON text, its run values only as set or not, in a stable order."""
    return sorted(
        json.dumps(
            {
                key: (value is not None) if key in _RUN_VALUES else value
                for key, value in row.items()
            },
            default=str,
        )
        for row in rows
    )


__all__ = ["FLOOR_PAGE_SIZE", "end_state_digest", "reconcile_floor"]
