"""The SQL of the bench's floor mode (`bench/drain_floor.py`): a reconciliation written with
plain bulk statements and the rules' minimal bookkeeping, and a reader of the end state it
compares with the driver's.

The reconciliation holds a leased coordinator row, as the seeds' does. Per page of at most 50
entries (the seeds' `findScanPage` cap): the content rows are read, the page's work enqueued and
each item claimed under a lease of its own (one statement each, with the read in one
transaction); then the occurrences and the sources are written, the work completed and the
coordinator's scan cursor checkpointed (one statement each, in another). Every source write is
guarded in its own statement by its item's live work lease and by the source's absence (the
generation the page found); the completion by each item's lease; the checkpoint by the
coordinator's live lease, and a lost lease rolls the page back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

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
from media_usage_orchestration.store.host.content import (
    ContentFields,
    content_rows_query,
    load_revisions,
)
from media_usage_orchestration.store.sources.rows import content_table, execute_many
from media_usage_orchestration.values.errors import FloorLeaseLost
from media_usage_orchestration.values.source_records import SOURCE_TYPE_CONTENT

WORK_LEASE_SECONDS = 60
COORDINATOR_LEASE_SECONDS = 60
_LEASED = "leased"


def take_status(engine: Engine, collection_id: str, collection_slug: str, token: str) -> int | None:
    """Make the collection's active coverage status running at a new epoch and lease the
    collection's coordinator row to `token`; that epoch, or None without an active status.
    Another holder's live lease on the coordinator row refuses both (FloorLeaseLost)."""
    with engine.begin() as connection:
        epoch = connection.execute(_TAKE_STATUS, {"page_collection_id": collection_id}).scalar()
        if epoch is None:
            return None
        claimed = connection.execute(
            _claim_coordinator(connection.dialect.name),
            {
                "page_collection_id": collection_id,
                "page_collection_slug": collection_slug,
                "coordinator_token": token,
                "epoch": epoch,
            },
        )
        if claimed.first() is None:
            raise FloorLeaseLost(f"another holder leases {collection_id}'s reconciliation")
        return epoch


def read_and_claim_page(
    engine: Engine,
    collection_id: str,
    collection_slug: str,
    discovery: ContentFields,
    epoch: int,
    after: str,
    limit: int,
    token: str,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The next `limit` content rows after `after` (each with the database time as
    `page_now`), their work enqueued and claimed under `token`, and their draft revisions."""
    query, content = content_rows_query(collection_slug, collection_id, discovery)
    page = query.add_columns(now().label("page_now")).where(content.c.id > after)
    page = page.order_by(content.c.id).limit(limit)
    identity = {"page_collection_id": collection_id, "page_collection_slug": collection_slug}
    with engine.begin() as connection:
        rows = [dict(row._mapping) for row in connection.execute(page)]
        if not rows:
            return [], {}
        bounds = {**identity, "after": after, "last": rows[-1]["id"], "page_lease_token": token}
        connection.execute(_enqueue_statement(collection_slug), {**bounds, "epoch": epoch})
        connection.execute(_CLAIM, bounds)
        drafts = [row["draft_revision_id"] for row in rows if row.get("draft_revision_id")]
        return rows, load_revisions(connection, drafts)


def write_page(
    engine: Engine,
    collection_id: str,
    built_sources: list[dict[str, Any]],
    built_occurrences: list[dict[str, Any]],
    token: str,
    checkpoint: tuple[str, str],
) -> None:
    """The page's occurrences, its guarded sources, its work completed, and the coordinator's
    scan cursor moved to the page's last id: `checkpoint` is (coordinator token, last id)."""
    coordinator_token, last_id = checkpoint
    with engine.begin() as connection:
        _insert_occurrences(connection, built_occurrences)
        _insert_sources(connection, built_sources, token)
        connection.execute(
            _COMPLETE_WORK, {"page_collection_id": collection_id, "page_lease_token": token}
        )
        moved = connection.execute(
            _CHECKPOINT,
            {
                "page_collection_id": collection_id,
                "coordinator_token": coordinator_token,
                "scan_cursor": last_id,
            },
        )
        if moved.rowcount != 1:
            raise FloorLeaseLost(f"the floor's lease on {collection_id} was lost")


def remove_sources_without_content(engine: Engine, collection_id: str, slug: str) -> None:
    with engine.begin() as connection:
        _remove_sources_without_content(connection, collection_id, slug)


def complete_coverage(
    engine: Engine, collection_id: str, schema_version: int, coordinator_token: str
) -> bool:
    """Coverage complete once no work is left, and the collection's coordinator row gone,
    both while the floor's lease on it is live (FloorLeaseLost otherwise)."""
    parameters = {
        "page_collection_id": collection_id,
        "page_schema_version": schema_version,
        "coordinator_token": coordinator_token,
    }
    with engine.begin() as connection:
        released = connection.execute(_RELEASE_COORDINATOR, parameters)
        if released.rowcount != 1:
            raise FloorLeaseLost(f"the floor's lease on {collection_id} was lost")
        completed = connection.execute(_COMPLETE_STATUS, parameters)
        return completed.rowcount == 1


# --- statements ---------------------------------------------------------------------------------


def _collection_status_update(*guards: Any, **values: Any):
    """An UPDATE of the collection's content status row (`page_collection_id`)."""
    return (
        update(index_status)
        .where(
            is_content_collection_status(),
            index_status.c.collection_id == bindparam("page_collection_id"),
            *guards,
        )
        .values(**values)
    )


_TAKE_STATUS = _collection_status_update(
    index_status.c.capture_state == "active",
    status="running",
    change_epoch=index_status.c.change_epoch + 1,
    reconciliation_required=1,
    started_at=now(),
    updated_at=now(),
).returning(index_status.c.change_epoch)
_COMPLETE_STATUS = _collection_status_update(
    index_status.c.status == "running",
    ~exists(
        select(work.c.content_id).where(work.c.collection_id == bindparam("page_collection_id"))
    ),
    status="complete",
    schema_version=bindparam("page_schema_version", type_=Integer),
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


def _claim_coordinator(dialect_name: str):
    """The coordinator row leased to the floor: inserted, or taken over unless its lease is
    held and live."""
    values = {
        "collection_id": bindparam("page_collection_id", type_=Text),
        "collection_slug": bindparam("page_collection_slug", type_=Text),
        "run_token": bindparam("coordinator_token", type_=Text),
        "target_epoch": bindparam("epoch", type_=Integer),
        "state": _LEASED,
        "phase": "scan",
        "scan_cursor": None,
        "next_attempt_at": now(),
        "lease_token": bindparam("coordinator_token", type_=Text),
        "lease_expires_at": timestamp_offset(COORDINATOR_LEASE_SECONDS),
        "updated_at": now(),
    }
    inserted = dialect_insert(dialect_name, reconciliations).values(values)
    held = and_(
        reconciliations.c.state == _LEASED,
        lease_live_at_clock(reconciliations.c.lease_expires_at),
    )
    # RETURNING tells whether a row was written (an upsert's rowcount is not portable).
    return inserted.on_conflict_do_update(
        index_elements=[reconciliations.c.collection_id],
        set_={name: value for name, value in values.items() if name != "collection_id"},
        where=~held,
    ).returning(reconciliations.c.collection_id)


# A coordinator statement guarded by the floor's live lease on the row.
_COORDINATOR_HELD = and_(
    reconciliations.c.collection_id == bindparam("page_collection_id"),
    reconciliations.c.lease_token == bindparam("coordinator_token"),
    reconciliations.c.state == _LEASED,
    lease_live_at_clock(reconciliations.c.lease_expires_at),
)
_CHECKPOINT = (
    update(reconciliations)
    .where(_COORDINATOR_HELD)
    .values(
        scan_cursor=bindparam("scan_cursor"),
        lease_expires_at=timestamp_offset(COORDINATOR_LEASE_SECONDS),
        updated_at=now(),
    )
)
_RELEASE_COORDINATOR = delete(reconciliations).where(_COORDINATOR_HELD)


def _item_token(content_id):
    """Each work item's own lease token: the page's token and the item's id."""
    return bindparam("page_lease_token", type_=Text) + ":" + content_id


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
        lease_token=_item_token(work.c.content_id),
        lease_expires_at=timestamp_offset(WORK_LEASE_SECONDS),
        last_attempted_at=now(),
        updated_at=now(),
    )
)
_COMPLETE_WORK = delete(work).where(
    work.c.collection_id == bindparam("page_collection_id"),
    work.c.lease_token == _item_token(work.c.content_id),
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
    """Each source only while its entry's work is leased (under its own token, from the
    page's `token`) and live, and only if it is still absent (the generation the page
    found)."""
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
            work.c.lease_token == _item_token(values["content_id"]),
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


def _remove_sources_without_content(connection: Connection, collection_id: str, slug: str) -> None:
    """The source walk's work in two statements: canonical sources of entries that no longer
    exist go, with their occurrences."""
    content = content_table(slug)
    orphaned = select(sources.c.source_key).where(
        sources.c.collection_id == collection_id,
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


def end_state(engine: Engine, collection_id: str, slug: str) -> dict[str, Any]:
    """What a reconciliation of `collection` leaves: the sources (with whether each carries
    its content row's `updated_at`), their current generation's occurrences, the coverage
    status, and the counts of work, coordinator and write-lease rows (which must be gone)."""
    with engine.connect() as connection:
        return {
            "sources": _source_rows(connection, collection_id, slug),
            "occurrences": _current_occurrences(connection, collection_id),
            "status": _without_run_values(
                connection.execute(
                    select(index_status).where(
                        is_content_collection_status(),
                        index_status.c.collection_id == collection_id,
                    )
                ).mappings()
            ),
            "leftovers": [
                connection.execute(select(func.count()).select_from(table)).scalar()
                for table in (work, reconciliations, generation_writes)
            ],
        }


def _source_rows(connection: Connection, collection_id: str, slug: str) -> list[str]:
    content = content_table(slug)
    statement = (
        select(sources, (sources.c.source_updated_at == content.c.updated_at).label("current"))
        .select_from(sources.outerjoin(content, content.c.id == sources.c.content_id))
        .where(sources.c.collection_id == collection_id)
    )
    return _without_run_values(connection.execute(statement).mappings())


def _current_occurrences(connection: Connection, collection_id: str) -> list[str]:
    statement = (
        select(occurrences)
        .join(
            sources,
            and_(
                sources.c.source_key == occurrences.c.source_key,
                sources.c.current_generation == occurrences.c.generation,
            ),
        )
        .where(sources.c.collection_id == collection_id)
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


__all__ = [
    "complete_coverage",
    "end_state",
    "read_and_claim_page",
    "remove_sources_without_content",
    "take_status",
    "write_page",
]
