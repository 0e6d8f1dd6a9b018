"""What each collection's index holds right now: the numbers `media-usage status` shows and the
coverage asset plots.

Read-only, inside one read transaction. Sources count the collection's canonical sources;
occurrences only those of each source's current generation (older generations are abandoned
rows awaiting cleanup). Entries count the rows of `ec_<slug>`, trashed ones included. Stuck work
is leased work whose lease expired (on the database clock): nobody is processing it until the
next claim takes it over.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, and_, case, column, func, literal, null, select, table

from media_usage_orchestration.store.core.engine import read_transaction
from media_usage_orchestration.store.core.leases import LeaseState, lease_has_expired
from media_usage_orchestration.store.core.predicates import is_content_collection_status
from media_usage_orchestration.store.core.schema import (
    collections,
    index_status,
    occurrences,
    reconciliations,
    sources,
    work,
)
from media_usage_orchestration.store.reconciliation.records import PROCESSING_FAILED_CODE
from media_usage_orchestration.values.errors import InvalidIdentifierError
from media_usage_orchestration.values.identifiers import content_table_name
from media_usage_orchestration.values.records import optional, record_from_row
from media_usage_orchestration.values.source_records import (
    CANONICAL_IDENTITY_VERSION,
    SOURCE_TYPE_CONTENT,
)


@dataclass(frozen=True)
class CollectionCoverage:
    """A registry collection's coverage row, index and work. Status fields are None for a
    collection without a status row (never activated); `entries` is None while its content
    table is missing (mid-deletion), or when the registry row's slug is not a valid identifier:
    then `problem_code` and `problem` say why, and the rest of the row is still counted."""

    collection_id: str
    collection_slug: str
    capture_state: str | None
    status: str | None
    change_epoch: int | None
    reconciliation_required: bool | None
    entries: int | None
    sources: int
    occurrences: int
    pending_work: int
    failed_work: int
    last_error_code: str | None
    started_at: str | None
    completed_at: str | None
    problem_code: str | None = None
    problem: str | None = None
    stuck_work: int = 0
    # error code -> failed work items with that code
    failed_work_codes: dict[str, int] = field(default_factory=dict)
    # When the status row last changed, and the collection's reconciliation row with its state
    # (database time; None without such a row): a reconciliation in progress renews its row.
    status_updated_at: str | None = None
    reconciliation_state: str | None = None
    reconciliation_updated_at: str | None = None

    @property
    def needs_operator(self) -> bool:
        """Failed work or failed coverage waits for an operator's retry."""
        return self.failed_work > 0 or self.status == "failed"

    @property
    def is_complete(self) -> bool:
        """Coverage complete with no failed and no stuck work: the index can be trusted."""
        return self.status == "complete" and self.failed_work == 0 and self.stuck_work == 0


def read_all_coverage(engine: Engine) -> tuple[CollectionCoverage, ...]:
    """Every registry collection, by slug."""
    with read_transaction(engine) as connection:
        rows = connection.execute(_registry_with_status().order_by(collections.c.slug)).all()
        return tuple(_coverage(connection, row) for row in rows)


def read_collection_coverage(engine: Engine, collection_id: str) -> CollectionCoverage | None:
    """One registry collection; None once it left the registry."""
    statement = _registry_with_status().where(collections.c.id == collection_id)
    with read_transaction(engine) as connection:
        row = connection.execute(statement).first()
        return None if row is None else _coverage(connection, row)


def health_status(status: str | None, reconciliation_required: bool | None) -> str | None:
    """The status as the collection's health sees it: an edit's capture turns `complete` into
    `stale` until its work is projected, which under steady edits is every few seconds, so a
    `stale` row that needs no reconciliation counts as `complete` (complete but for the edits
    still queued; the queue's own numbers and check show those)."""
    if status == "stale" and not reconciliation_required:
        return "complete"
    return status


def read_coverage_state(engine: Engine, collection_id: str) -> tuple[str | None, bool] | None:
    """What the collection's health turns on, in one indexed read: its status row's status
    (`health_status`) and whether any of its work failed for good. None once it left the
    registry."""
    failed_work = (
        select(work.c.collection_id)
        .where(work.c.collection_id == collection_id, work.c.state == LeaseState.FAILED.value)
        .exists()
    )
    status_row = and_(
        is_content_collection_status(), index_status.c.scope_key == collections.c.slug
    )
    statement = (
        select(
            index_status.c.status,
            index_status.c.reconciliation_required,
            failed_work.label("has_failed_work"),
        )
        .select_from(collections.outerjoin(index_status, status_row))
        .where(collections.c.id == collection_id)
    )
    with read_transaction(engine) as connection:
        row = connection.execute(statement).first()
    if row is None:
        return None
    status = health_status(row.status, bool(row.reconciliation_required))
    return status, bool(row.has_failed_work)


def _registry_with_status():
    status_row = and_(
        is_content_collection_status(), index_status.c.scope_key == collections.c.slug
    )
    return select(
        collections.c.id.label("collection_id"),
        collections.c.slug.label("collection_slug"),
        index_status.c.capture_state,
        index_status.c.status,
        index_status.c.change_epoch,
        index_status.c.reconciliation_required,
        index_status.c.last_error_code,
        index_status.c.started_at,
        index_status.c.completed_at,
        index_status.c.updated_at.label("status_updated_at"),
        reconciliations.c.state.label("reconciliation_state"),
        reconciliations.c.updated_at.label("reconciliation_updated_at"),
    ).select_from(
        collections.outerjoin(index_status, status_row).outerjoin(
            reconciliations, reconciliations.c.collection_id == collections.c.id
        )
    )


def _coverage(connection: Connection, row: Any) -> CollectionCoverage:
    work_counts, stuck_work, failed_codes = _work_counts(connection, row.collection_id)
    source_count, occurrence_count = _index_counts(connection, row.collection_id)
    try:
        entries, problem = _entry_count(connection, row.collection_slug), None
    except InvalidIdentifierError as error:
        # A registry row the CMS would refuse: reported, and the other collections listed.
        entries, problem = None, str(error)
    counted = {
        "entries": entries,
        "sources": source_count,
        "occurrences": occurrence_count,
        "pending_work": sum(n for state, n in work_counts.items() if state != LeaseState.FAILED),
        "failed_work": work_counts.get(LeaseState.FAILED.value, 0),
        "problem_code": PROCESSING_FAILED_CODE if problem else None,
        "problem": problem,
        "stuck_work": stuck_work,
        "failed_work_codes": failed_codes,
    }
    return record_from_row(
        CollectionCoverage,
        {**row._mapping, **counted},
        change_epoch=optional(int),
        reconciliation_required=optional(bool),
    )


def _entry_count(connection: Connection, slug: str) -> int | None:
    table_name = content_table_name(slug)
    if not connection.dialect.has_table(connection, table_name):
        return None
    content = table(table_name, column("id"))
    return connection.execute(select(func.count()).select_from(content)).scalar_one()


def _work_counts(
    connection: Connection, collection_id: str
) -> tuple[dict[str, int], int, dict[str, int]]:
    """Work rows per state, the stuck ones among them, and the failed ones per error code, in
    one statement."""
    state = work.c.state
    stuck = and_(state == LeaseState.LEASED.value, lease_has_expired(work))
    is_stuck = case((stuck, literal(1)), else_=literal(0)).label("stuck")
    failed_code = case(
        (state == LeaseState.FAILED.value, work.c.last_error_code), else_=null()
    ).label("failed_code")
    statement = (
        select(state, is_stuck, failed_code, func.count())
        .where(work.c.collection_id == collection_id)
        .group_by(state, is_stuck, failed_code)
    )
    by_state: Counter[str] = Counter()
    failed_codes: Counter[str] = Counter()
    stuck_count = 0
    for row_state, row_stuck, code, count in connection.execute(statement).all():
        by_state[row_state] += count
        stuck_count += count if row_stuck else 0
        if row_state == LeaseState.FAILED.value:
            failed_codes[code or "unknown"] += count
    return dict(by_state), stuck_count, dict(sorted(failed_codes.items()))


def _index_counts(connection: Connection, collection_id: str) -> tuple[int, int]:
    """Canonical sources of the collection, and the occurrences of their current generation."""
    canonical = and_(
        sources.c.source_type == SOURCE_TYPE_CONTENT,
        sources.c.collection_id == collection_id,
        sources.c.identity_version == CANONICAL_IDENTITY_VERSION,
    )
    source_count = connection.execute(
        select(func.count()).select_from(sources).where(canonical)
    ).scalar_one()
    current = and_(
        occurrences.c.source_key == sources.c.source_key,
        occurrences.c.generation == sources.c.current_generation,
    )
    occurrence_count = connection.execute(
        select(func.count()).select_from(occurrences.join(sources, current)).where(canonical)
    ).scalar_one()
    return source_count, occurrence_count
