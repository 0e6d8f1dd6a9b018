"""Collection-deletion tombstones (spec section 7).

EmDash's `MediaUsageCollectionDeletionRepository`, its local deletion guard
(`executeLocalCollectionDeletionGuard`) and the back-phase statements of its deletion
processor. A tombstone row holds the collection's slug (UNIQUE: the slug lock) and walks the
phases fence, registry, table (front) then work, sources, status, finalize (back). Every write
re-asserts the deletion lease in the same statement or transaction: state `leased`, the exact
token, and a lease still live on the database clock.

Beyond the seed: `renew_lease` (a guarded CAS that extends a live lease, so one step may page
several batches), back-phase methods that re-read their cursors from the leased row instead of
trusting the caller's snapshot, and an explicit `_emdash_fields` delete in the registry phase.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Self

from sqlalchemy import (
    Connection,
    Engine,
    Select,
    and_,
    column,
    delete,
    exists,
    inspect,
    literal,
    or_,
    select,
    table,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.sql.elements import ColumnElement
from ulid import ULID

from media_usage_orchestration.store.core.clock import (
    lease_live_at_clock,
    now,
    timestamp_offset,
    validate_duration,
)
from media_usage_orchestration.store.core.engine import (
    is_missing_table,
    is_postgres,
    read_transaction,
)
from media_usage_orchestration.store.core.leases import (
    LeaseState,
    bounded_limit,
    due_candidates_statement,
    is_claimable,
    is_reopenable_by_operator,
    parse_choice,
    parse_lease_state,
    require_flag,
)
from media_usage_orchestration.store.core.predicates import (
    is_collection_status_row,
    is_content_collection_status,
    registry_identity_is_current,
)
from media_usage_orchestration.store.core.schema import (
    collection_deletions,
    collections,
    dialect_insert,
    fields,
    index_status,
    occurrences,
    reconciliations,
    sources,
    work,
)
from media_usage_orchestration.store.registry import collection_identity_exists
from media_usage_orchestration.values.cursors import decode_cursor, encode_cursor
from media_usage_orchestration.values.errors import (
    DeletionCleanupIncomplete,
    DeletionIdentityConflict,
    DeletionLeaseLost,
)
from media_usage_orchestration.values.identifiers import (
    content_table_name,
    quote_identifier,
    require_text,
    validate_error_code,
    validate_identifier,
)
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome
from media_usage_orchestration.values.records import record_from_record, record_from_row
from media_usage_orchestration.values.source_records import SOURCE_TYPE_CONTENT

ROWS_PER_BATCH = 50
MAX_PAGE_LIMIT = 100
DEFAULT_OPERATOR_LIMIT = 50
FTS_TABLE_PREFIX = "_emdash_fts_"
FTS_TRIGGER_SUFFIXES = ("insert", "update", "delete")


class DeletionPhase(StrEnum):
    FENCE = "fence"
    REGISTRY = "registry"
    TABLE = "table"
    WORK = "work"
    SOURCES = "sources"
    STATUS = "status"
    FINALIZE = "finalize"

    @property
    def is_front(self) -> bool:
        """Front phases run in the delete request (or one per background tick on resume)."""
        return self in _FRONT_PHASES


_FRONT_PHASES = frozenset({DeletionPhase.FENCE, DeletionPhase.REGISTRY, DeletionPhase.TABLE})


class GuardAction(StrEnum):
    FENCE = "fence"
    DROP = "drop"


class GuardOutcome(StrEnum):
    FENCED = "fenced"
    HAS_CONTENT = "has_content"
    STALE = "stale"
    DROPPED = "dropped"


@dataclass(frozen=True)
class DeletionRecord:
    collection_id: str
    collection_slug: str
    force_delete: bool
    state: LeaseState
    phase: DeletionPhase
    work_cursor: str | None
    source_key: str | None
    occurrence_cursor: str | None
    attempt_count: int
    next_attempt_at: str
    lease_token: str | None
    lease_expires_at: str | None
    last_error_code: str | None
    created_at: str
    updated_at: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        return record_from_row(cls, row, **_ROW_CONVERTERS)


@dataclass(frozen=True)
class DeletionLease:
    """The identity a step needs to act: which tombstone, under which lease."""

    collection_id: str
    lease_token: str


@dataclass(frozen=True)
class DeletionClaim(DeletionRecord):
    lease_token: str

    @property
    def lease(self) -> DeletionLease:
        return DeletionLease(self.collection_id, self.lease_token)


@dataclass(frozen=True)
class OperatorDeletionItem:
    """What operators may see of a tombstone: never its lease token."""

    collection_id: str
    collection_slug: str
    state: LeaseState
    phase: DeletionPhase
    attempt_count: int
    next_attempt_at: str
    lease_expires_at: str | None
    last_error_code: str | None
    updated_at: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> OperatorDeletionItem:
        return record_from_record(cls, DeletionRecord.from_row(row))


@dataclass(frozen=True)
class DeletionPage:
    items: tuple[OperatorDeletionItem, ...]
    next_cursor: str | None = None


@dataclass(frozen=True)
class DeletionRetryResult:
    outcome: OperatorRetryOutcome
    changed: bool = False
    item: OperatorDeletionItem | None = None
    lease_expires_at: str | None = None


@dataclass(frozen=True)
class BatchResult:
    """The tombstone's position after one back-phase batch."""

    phase: DeletionPhase
    deleted: int
    work_cursor: str | None = None
    source_key: str | None = None
    occurrence_cursor: str | None = None
    source_deleted: bool = False


LeaseHolder = DeletionLease | DeletionClaim


# --- validation -------------------------------------------------------------------------------


def _identity(collection_id: object, collection_slug: object) -> tuple[str, str]:
    require_text(collection_id, "Collection deletion requires a collection ID")
    validate_identifier(collection_slug, "collection slug")
    return collection_id, collection_slug  # type: ignore[return-value]


def _lease_identity(lease: LeaseHolder) -> DeletionLease:
    collection_id = getattr(lease, "collection_id", None)
    lease_token = getattr(lease, "lease_token", None)
    require_text(collection_id, "Collection deletion requires a collection ID")
    require_text(lease_token, "Collection deletion requires a lease token")
    return DeletionLease(collection_id, lease_token)  # type: ignore[arg-type]


def _phase(value: object) -> DeletionPhase:
    return parse_choice(DeletionPhase, value, "collection deletion phase")


_ROW_CONVERTERS = {
    "force_delete": bool,
    "state": functools.partial(parse_lease_state, label="collection deletion"),
    "phase": _phase,
}


def _lease_seconds(value: int) -> int:
    return validate_duration(value, "Collection deletion lease duration", allow_zero=False)


def _batch_size(value: int) -> int:
    return bounded_limit(
        value, 1, ROWS_PER_BATCH, f"Collection deletion batch must be from 1 to {ROWS_PER_BATCH}"
    )


# --- guard predicates -------------------------------------------------------------------------


def holds_deletion_lease(
    lease: DeletionLease,
    *,
    phase: DeletionPhase | None = None,
    collection_slug: str | None = None,
    tombstone=collection_deletions,
) -> ColumnElement[bool]:
    """The tombstone is leased to exactly this token and the lease is live on the clock."""
    conditions = [
        tombstone.c.collection_id == lease.collection_id,
        tombstone.c.state == LeaseState.LEASED.value,
        tombstone.c.lease_token == lease.lease_token,
        lease_live_at_clock(tombstone.c.lease_expires_at),
    ]
    if phase is not None:
        conditions.append(tombstone.c.phase == phase.value)
    if collection_slug is not None:
        conditions.append(tombstone.c.collection_slug == collection_slug)
    return and_(*conditions)


def deletion_lease_is_live(
    lease: DeletionLease, *, phase: DeletionPhase | None = None, collection_slug: str | None = None
) -> ColumnElement[bool]:
    """EXISTS form of `holds_deletion_lease`, for writes to other tables."""
    deletion = collection_deletions.alias("deletion")
    guard = holds_deletion_lease(
        lease, phase=phase, collection_slug=collection_slug, tombstone=deletion
    )
    return exists(select(deletion.c.collection_id).where(guard))


def _canonical_sources(collection_id: str) -> ColumnElement[bool]:
    # Legacy slug-keyed sources have collection_id NULL, so they never match.
    return and_(
        sources.c.source_type == SOURCE_TYPE_CONTENT, sources.c.collection_id == collection_id
    )


# --- statements shared by several methods ------------------------------------------------------


def find_due_statement(limit: int) -> Select:
    """One statement: the oldest due pending, retry and lease-expired tombstones."""
    limit = bounded_limit(
        limit, 1, MAX_PAGE_LIMIT, "Collection deletion candidate limit must be from 1 to 100"
    )
    return due_candidates_statement(collection_deletions, limit)


def _update_deletion(
    connection: Connection, lease: DeletionLease, in_phase: DeletionPhase, /, **values: Any
) -> None:
    """A back-phase checkpoint: progress resets the failure count; 0 rows means we lost."""
    result = connection.execute(
        update(collection_deletions)
        .where(holds_deletion_lease(lease, phase=in_phase))
        .values(**values, attempt_count=0, last_error_code=None, updated_at=now())
    )
    if result.rowcount != 1:
        raise DeletionLeaseLost("Collection deletion lease was lost")


def _lock_leased_tombstone(
    connection: Connection, lease: DeletionLease, phase: DeletionPhase
) -> DeletionRecord:
    """Read the step's own cursors under the lease; PostgreSQL serializes holders of one token."""
    row = connection.execute(
        select(collection_deletions)
        .where(holds_deletion_lease(lease, phase=phase))
        .with_for_update()
    ).first()
    if row is None:
        raise DeletionLeaseLost("Collection deletion lease was lost")
    return DeletionRecord.from_row(row._mapping)


def _cleanup_rows_remain(
    connection: Connection, collection_id: str, collection_slug: str, *, include_status: bool
) -> bool:
    """One query: does any work, canonical source (or status row) of the collection remain?"""
    row = connection.execute(
        select(
            exists(select(literal(1)).where(work.c.collection_id == collection_id)).label(
                "work_present"
            ),
            exists(select(literal(1)).where(_canonical_sources(collection_id))).label(
                "source_present"
            ),
            exists(
                select(literal(1)).where(is_collection_status_row(collection_id, collection_slug))
            ).label("status_present"),
        )
    ).one()
    return (
        bool(row.work_present)
        or bool(row.source_present)
        or (include_status and bool(row.status_present))
    )


def _page_ids(
    connection: Connection, id_column, scope: ColumnElement[bool], after: str | None, batch: int
) -> list[str]:
    """Up to `batch + 1` ids ascending after the cursor: the extra one says "more remain"."""
    statement = select(id_column).where(scope)
    if after is not None:
        statement = statement.where(id_column > after)
    return list(connection.execute(statement.order_by(id_column).limit(batch + 1)).scalars())


# --- the repository ---------------------------------------------------------------------------


class DeletionRepository:
    """Tombstone rows of `_emdash_media_usage_collection_deletions`; one guarded statement per
    method (or one transaction where the seed uses one)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- front door ----------------------------------------------------------------------------

    def create_tombstone(
        self, collection_id: str, collection_slug: str, force_delete: bool
    ) -> DeletionRecord:
        collection_id, collection_slug = _identity(collection_id, collection_slug)
        force_delete = require_flag(force_delete, "force_delete")
        try:
            with self.engine.begin() as connection:
                connection.execute(
                    dialect_insert(connection, collection_deletions)
                    .values(
                        collection_id=collection_id,
                        collection_slug=collection_slug,
                        force_delete=1 if force_delete else 0,
                        state=LeaseState.PENDING.value,
                        phase=DeletionPhase.FENCE.value,
                        next_attempt_at=now(),
                        updated_at=now(),
                    )
                    .on_conflict_do_nothing(index_elements=[collection_deletions.c.collection_id])
                )
                row = connection.execute(
                    select(collection_deletions).where(
                        collection_deletions.c.collection_id == collection_id
                    )
                ).one()
        except IntegrityError as error:
            # The UNIQUE slug is the slug lock: another collection id already holds it.
            raise DeletionIdentityConflict(
                "Collection deletion tombstone identity conflicts with existing work"
            ) from error
        record = DeletionRecord.from_row(row._mapping)
        if record.collection_slug != collection_slug or record.force_delete != force_delete:
            raise DeletionIdentityConflict(
                "Collection deletion tombstone identity conflicts with existing work"
            )
        return record

    def claim(
        self, collection_id: str, phase: DeletionPhase | str, lease_seconds: int
    ) -> DeletionClaim | None:
        require_text(collection_id, "Collection deletion claim requires an exact identity")
        phase = _phase(phase)
        lease_seconds = _lease_seconds(lease_seconds)
        lease_token = str(ULID())
        with self.engine.begin() as connection:
            row = connection.execute(
                update(collection_deletions)
                .where(
                    collection_deletions.c.collection_id == collection_id,
                    collection_deletions.c.phase == phase.value,
                )
                .where(is_claimable(collection_deletions))
                .values(
                    state=LeaseState.LEASED.value,
                    lease_token=lease_token,
                    lease_expires_at=timestamp_offset(lease_seconds),
                    updated_at=now(),
                )
                .returning(*collection_deletions.c)
            ).first()
        if row is None:
            return None
        return DeletionClaim.from_row(row._mapping)

    def renew_lease(self, lease: LeaseHolder, lease_seconds: int) -> str | None:
        """Extend a still-live lease held by this token; None once it expired or moved on."""
        lease = _lease_identity(lease)
        lease_seconds = _lease_seconds(lease_seconds)
        with self.engine.begin() as connection:
            return connection.execute(
                update(collection_deletions)
                .where(holds_deletion_lease(lease))
                .values(lease_expires_at=timestamp_offset(lease_seconds), updated_at=now())
                .returning(collection_deletions.c.lease_expires_at)
            ).scalar()

    # -- reads ---------------------------------------------------------------------------------

    def find_by_slug(self, collection_slug: str) -> DeletionRecord | None:
        validate_identifier(collection_slug, "collection slug")
        try:
            with read_transaction(self.engine) as connection:
                row = connection.execute(
                    select(collection_deletions).where(
                        collection_deletions.c.collection_slug == collection_slug
                    )
                ).first()
        except DBAPIError as error:
            if is_missing_table(error):
                return None
            raise
        return DeletionRecord.from_row(row._mapping) if row is not None else None

    def find(self, collection_id: str) -> DeletionRecord | None:
        require_text(collection_id, "Collection deletion requires a collection ID")
        with read_transaction(self.engine) as connection:
            row = connection.execute(
                select(collection_deletions).where(
                    collection_deletions.c.collection_id == collection_id
                )
            ).first()
        return DeletionRecord.from_row(row._mapping) if row is not None else None

    def is_slug_deleting(self, collection_slug: str) -> bool:
        return is_slug_deleting(self.engine, collection_slug)

    def find_due(self, limit: int) -> list[DeletionRecord]:
        statement = find_due_statement(limit)
        with read_transaction(self.engine) as connection:
            return [DeletionRecord.from_row(row._mapping) for row in connection.execute(statement)]

    def find_operator_page(
        self,
        state: LeaseState | str = LeaseState.FAILED,
        limit: int = DEFAULT_OPERATOR_LIMIT,
        cursor: str | None = None,
    ) -> DeletionPage:
        state = parse_lease_state(state, "collection deletion")
        limit = bounded_limit(
            limit, 1, MAX_PAGE_LIMIT, "Collection deletion operator limit must be from 1 to 100"
        )
        position = decode_cursor(cursor) if cursor is not None else None
        statement = select(collection_deletions).where(collection_deletions.c.state == state.value)
        if position is not None:
            statement = statement.where(
                or_(
                    collection_deletions.c.updated_at < position.order_value,
                    and_(
                        collection_deletions.c.updated_at == position.order_value,
                        collection_deletions.c.collection_id < position.id,
                    ),
                )
            )
        statement = statement.order_by(
            collection_deletions.c.updated_at.desc(), collection_deletions.c.collection_id.desc()
        ).limit(limit + 1)
        with read_transaction(self.engine) as connection:
            rows = connection.execute(statement).all()
        items = tuple(OperatorDeletionItem.from_row(row._mapping) for row in rows[:limit])
        next_cursor = None
        if len(rows) > limit and items:
            next_cursor = encode_cursor(items[-1].updated_at, items[-1].collection_id)
        return DeletionPage(items, next_cursor)

    # -- operator ------------------------------------------------------------------------------

    def retry_operator_deletion(self, collection_id: str) -> DeletionRetryResult:
        require_text(collection_id, "Collection deletion retry requires an ID")
        with self.engine.begin() as connection:
            observed = connection.execute(
                select(collection_deletions).where(
                    collection_deletions.c.collection_id == collection_id
                )
            ).first()
            if observed is None:
                return DeletionRetryResult(OperatorRetryOutcome.NOT_FOUND)
            live_expiry = self._live_lease_expiry(connection, observed)
            if live_expiry is not None:
                return DeletionRetryResult(
                    OperatorRetryOutcome.LEASE_ACTIVE, lease_expires_at=live_expiry
                )
            reopened = connection.execute(
                update(collection_deletions)
                .where(
                    collection_deletions.c.collection_id == collection_id,
                    is_reopenable_by_operator(collection_deletions),
                )
                .values(
                    state=LeaseState.PENDING.value,
                    attempt_count=0,
                    next_attempt_at=now(),
                    lease_token=None,
                    lease_expires_at=None,
                    last_error_code=None,
                    updated_at=now(),
                )
                .returning(*collection_deletions.c)
            ).first()
        if reopened is None:
            return DeletionRetryResult(OperatorRetryOutcome.CONFLICT)
        return DeletionRetryResult(
            OperatorRetryOutcome.PENDING,
            changed=True,
            item=OperatorDeletionItem.from_row(reopened._mapping),
        )

    @staticmethod
    def _live_lease_expiry(connection: Connection, observed: Any) -> str | None:
        if observed.state != LeaseState.LEASED.value or not observed.lease_expires_at:
            return None
        return connection.execute(
            select(collection_deletions.c.lease_expires_at).where(
                collection_deletions.c.collection_id == observed.collection_id,
                collection_deletions.c.state == LeaseState.LEASED.value,
                lease_live_at_clock(collection_deletions.c.lease_expires_at),
            )
        ).scalar()

    # -- lease transitions ---------------------------------------------------------------------

    def checkpoint(
        self,
        lease: LeaseHolder,
        from_phase: DeletionPhase | str,
        to_phase: DeletionPhase | str,
    ) -> bool:
        lease = _lease_identity(lease)
        from_phase, to_phase = _phase(from_phase), _phase(to_phase)
        return self._guarded_update(
            update(collection_deletions)
            .where(holds_deletion_lease(lease, phase=from_phase))
            .values(phase=to_phase.value, attempt_count=0, last_error_code=None, updated_at=now())
        )

    def release(self, lease: LeaseHolder) -> bool:
        """Hand the tombstone back as pending and due now: the next phase may start at once."""
        lease = _lease_identity(lease)
        return self._guarded_update(
            update(collection_deletions)
            .where(holds_deletion_lease(lease))
            .values(
                state=LeaseState.PENDING.value,
                next_attempt_at=now(),
                lease_token=None,
                lease_expires_at=None,
                attempt_count=0,
                last_error_code=None,
                updated_at=now(),
            )
        )

    def cancel_fence(self, lease: LeaseHolder) -> bool:
        """The collection kept its content: drop the tombstone, only while still in `fence`."""
        lease = _lease_identity(lease)
        return self._guarded_update(
            delete(collection_deletions).where(
                holds_deletion_lease(lease, phase=DeletionPhase.FENCE)
            )
        )

    def record_failure(
        self, lease: LeaseHolder, error_code: str, terminal: bool, retry_delay_seconds: int
    ) -> bool:
        lease = _lease_identity(lease)
        error_code = validate_error_code(error_code, "Collection deletion error code")
        terminal = require_flag(terminal, "terminal")
        retry_delay_seconds = validate_duration(
            retry_delay_seconds, "Collection deletion retry delay", allow_zero=True
        )
        state = LeaseState.FAILED if terminal else LeaseState.RETRY
        return self._guarded_update(
            update(collection_deletions)
            .where(holds_deletion_lease(lease))
            .values(
                state=state.value,
                attempt_count=collection_deletions.c.attempt_count + 1,
                next_attempt_at=timestamp_offset(retry_delay_seconds),
                lease_token=None,
                lease_expires_at=None,
                last_error_code=error_code,
                updated_at=now(),
            )
        )

    def _guarded_update(self, statement) -> bool:
        with self.engine.begin() as connection:
            return connection.execute(statement).rowcount == 1

    # -- front phases --------------------------------------------------------------------------

    def delete_registry_and_checkpoint(self, lease: LeaseHolder, collection_slug: str) -> bool:
        """Phase `registry`: remove the registry row (and its fields) and move to `table`."""
        lease = _lease_identity(lease)
        validate_identifier(collection_slug, "collection slug")
        registry_guard = deletion_lease_is_live(
            lease, phase=DeletionPhase.REGISTRY, collection_slug=collection_slug
        )
        with self.engine.begin() as connection:
            # Explicit, not only the FK cascade: SQLite cascades only on connections that
            # enabled foreign keys, and this must not depend on who opened the connection.
            connection.execute(
                delete(fields).where(
                    fields.c.collection_id == lease.collection_id,
                    registry_identity_is_current(lease.collection_id, collection_slug),
                    registry_guard,
                )
            )
            connection.execute(
                delete(collections).where(
                    collections.c.id == lease.collection_id,
                    collections.c.slug == collection_slug,
                    registry_guard,
                )
            )
            checkpoint = connection.execute(
                update(collection_deletions)
                .where(
                    holds_deletion_lease(
                        lease, phase=DeletionPhase.REGISTRY, collection_slug=collection_slug
                    )
                )
                .values(phase=DeletionPhase.TABLE.value, updated_at=now())
            )
            return checkpoint.rowcount == 1

    # -- back phases ---------------------------------------------------------------------------

    def delete_work_batch(self, lease: LeaseHolder, batch: int = ROWS_PER_BATCH) -> BatchResult:
        """Phase `work`: delete one batch of the collection's work rows, in any state."""
        lease = _lease_identity(lease)
        batch = _batch_size(batch)
        with self.engine.begin() as connection:
            tombstone = _lock_leased_tombstone(connection, lease, DeletionPhase.WORK)
            ids = _page_ids(
                connection,
                work.c.content_id,
                work.c.collection_id == lease.collection_id,
                tombstone.work_cursor,
                batch,
            )
            chunk = ids[:batch]
            deleted = self._delete_chunk(
                connection,
                delete(work).where(
                    work.c.collection_id == lease.collection_id, work.c.content_id.in_(chunk)
                ),
                lease,
                chunk,
            )
            if len(ids) > batch:
                _update_deletion(connection, lease, DeletionPhase.WORK, work_cursor=chunk[-1])
                return BatchResult(DeletionPhase.WORK, deleted, work_cursor=chunk[-1])
            _update_deletion(
                connection,
                lease,
                DeletionPhase.WORK,
                phase=DeletionPhase.SOURCES.value,
                work_cursor=None,
            )
            return BatchResult(DeletionPhase.SOURCES, deleted)

    def delete_sources_batch(self, lease: LeaseHolder, batch: int = ROWS_PER_BATCH) -> BatchResult:
        """Phase `sources`: empty one canonical source a batch of occurrences at a time, then
        delete the source itself; `status` once none remains."""
        lease = _lease_identity(lease)
        batch = _batch_size(batch)
        with self.engine.begin() as connection:
            tombstone = _lock_leased_tombstone(connection, lease, DeletionPhase.SOURCES)
            source_key, cursor = tombstone.source_key, tombstone.occurrence_cursor
            if source_key is None:
                source_key = self._next_source_key(connection, lease.collection_id)
                if source_key is None:
                    _update_deletion(
                        connection,
                        lease,
                        DeletionPhase.SOURCES,
                        phase=DeletionPhase.STATUS.value,
                        source_key=None,
                        occurrence_cursor=None,
                    )
                    return BatchResult(DeletionPhase.STATUS, 0)
                _update_deletion(
                    connection,
                    lease,
                    DeletionPhase.SOURCES,
                    source_key=source_key,
                    occurrence_cursor=None,
                )
                cursor = None
            return self._empty_source(connection, lease, source_key, cursor, batch)

    def _empty_source(
        self,
        connection: Connection,
        lease: DeletionLease,
        source_key: str,
        cursor: str | None,
        batch: int,
    ) -> BatchResult:
        ids = _page_ids(
            connection, occurrences.c.id, occurrences.c.source_key == source_key, cursor, batch
        )
        chunk = ids[:batch]
        deleted = self._delete_chunk(
            connection,
            delete(occurrences).where(
                occurrences.c.source_key == source_key, occurrences.c.id.in_(chunk)
            ),
            lease,
            chunk,
        )
        if len(ids) > batch:
            _update_deletion(
                connection,
                lease,
                DeletionPhase.SOURCES,
                source_key=source_key,
                occurrence_cursor=chunk[-1],
            )
            return BatchResult(
                DeletionPhase.SOURCES, deleted, source_key=source_key, occurrence_cursor=chunk[-1]
            )
        connection.execute(
            delete(sources).where(
                sources.c.source_key == source_key,
                _canonical_sources(lease.collection_id),
                deletion_lease_is_live(lease),
            )
        )
        _update_deletion(
            connection, lease, DeletionPhase.SOURCES, source_key=None, occurrence_cursor=None
        )
        return BatchResult(DeletionPhase.SOURCES, deleted, source_deleted=True)

    @staticmethod
    def _next_source_key(connection: Connection, collection_id: str) -> str | None:
        return connection.execute(
            select(sources.c.source_key)
            .where(_canonical_sources(collection_id))
            .order_by(sources.c.source_key)
            .limit(1)
        ).scalar()

    @staticmethod
    def _delete_chunk(
        connection: Connection, statement, lease: DeletionLease, chunk: Sequence[str]
    ) -> int:
        if not chunk:
            return 0
        return connection.execute(statement.where(deletion_lease_is_live(lease))).rowcount

    def delete_status(self, lease: LeaseHolder) -> None:
        """Phase `status`: once no work or canonical source remains, remove the collection's
        reconciliation and status rows and move to `finalize`."""
        lease = _lease_identity(lease)
        with self.engine.begin() as connection:
            tombstone = _lock_leased_tombstone(connection, lease, DeletionPhase.STATUS)
            slug = tombstone.collection_slug
            if _cleanup_rows_remain(connection, lease.collection_id, slug, include_status=False):
                raise DeletionCleanupIncomplete("Collection deletion cleanup is incomplete")
            connection.execute(
                delete(reconciliations).where(
                    reconciliations.c.collection_id == lease.collection_id,
                    reconciliations.c.collection_slug == slug,
                    deletion_lease_is_live(lease),
                )
            )
            connection.execute(
                delete(index_status).where(
                    is_collection_status_row(lease.collection_id, slug),
                    deletion_lease_is_live(lease),
                )
            )
            _update_deletion(
                connection, lease, DeletionPhase.STATUS, phase=DeletionPhase.FINALIZE.value
            )

    def finalize(self, lease: LeaseHolder) -> None:
        """Phase `finalize`: delete the tombstone (releasing the slug) once nothing is left."""
        lease = _lease_identity(lease)
        with self.engine.begin() as connection:
            slug = _lock_leased_tombstone(connection, lease, DeletionPhase.FINALIZE).collection_slug
            if inspect(connection).has_table(content_table_name(slug)):
                raise DeletionCleanupIncomplete(
                    "Collection table still exists during deletion finalization"
                )
            if _cleanup_rows_remain(connection, lease.collection_id, slug, include_status=True):
                raise DeletionCleanupIncomplete("Collection deletion is incomplete")
            if collection_identity_exists(connection, lease.collection_id, slug):
                raise DeletionCleanupIncomplete("Collection registry identity still exists")
            result = connection.execute(
                delete(collection_deletions).where(
                    holds_deletion_lease(lease, phase=DeletionPhase.FINALIZE, collection_slug=slug)
                )
            )
            if result.rowcount != 1:
                raise DeletionLeaseLost("Collection deletion lost finalization")


def is_slug_deleting(engine: Engine, collection_slug: str) -> bool:
    """The slug lock: a tombstone holds the slug until its deletion finalizes."""
    validate_identifier(collection_slug, "collection slug")
    try:
        with read_transaction(engine) as connection:
            row = connection.execute(
                select(collection_deletions.c.collection_id).where(
                    collection_deletions.c.collection_slug == collection_slug
                )
            ).first()
    except DBAPIError as error:
        if is_missing_table(error):
            return False
        raise
    return row is not None


# --- the local deletion guard -----------------------------------------------------------------


def execute_local_deletion_guard(
    engine: Engine,
    action: GuardAction | str,
    collection_id: str,
    collection_slug: str,
    lease_token: str,
    force_delete: bool = False,
) -> GuardOutcome:
    """Fence capture or drop the content table, in one transaction, only under the live lease
    of the matching phase (`fence` for fencing, `table` for dropping)."""
    action = _guard_action(action)
    collection_id, collection_slug = _identity(collection_id, collection_slug)
    require_text(lease_token, "Collection deletion requires a lease token")
    force_delete = require_flag(force_delete, "force_delete")
    content_table_name(collection_slug)
    lease = DeletionLease(collection_id, lease_token)
    with engine.begin() as connection:
        if not _lock_live_tombstone(connection, lease, collection_slug, action):
            return GuardOutcome.STALE
        if action is GuardAction.FENCE:
            return _fence_collection(connection, lease, collection_slug, force_delete)
        drop_content_table(connection, collection_slug)
        return GuardOutcome.DROPPED


def _guard_action(value: object) -> GuardAction:
    return parse_choice(GuardAction, value, "collection deletion guard action")


def _lock_live_tombstone(
    connection: Connection, lease: DeletionLease, collection_slug: str, action: GuardAction
) -> bool:
    """Hold the tombstone row for the whole guard so no takeover can interleave with it."""
    phase = DeletionPhase.FENCE if action is GuardAction.FENCE else DeletionPhase.TABLE
    guard = holds_deletion_lease(lease, phase=phase, collection_slug=collection_slug)
    if is_postgres(connection):
        row = connection.execute(
            select(collection_deletions.c.collection_id).where(guard).with_for_update()
        )
        return row.first() is not None
    # SQLite: BEGIN IMMEDIATE already holds the write lock; the no-op write proves the guard.
    result = connection.execute(
        update(collection_deletions)
        .where(guard)
        .values(updated_at=collection_deletions.c.updated_at)
    )
    return result.rowcount == 1


def _fence_collection(
    connection: Connection, lease: DeletionLease, collection_slug: str, force_delete: bool
) -> GuardOutcome:
    table_name = content_table_name(collection_slug)
    if is_postgres(connection):
        # Waits for in-flight content writes and blocks new ones until this transaction ends,
        # so the has-content check below cannot miss a concurrent insert.
        connection.exec_driver_sql(
            f"LOCK TABLE {quote_identifier(table_name)} IN SHARE ROW EXCLUSIVE MODE"
        )
    if not force_delete and table_has_live_content(connection, table_name):
        return GuardOutcome.HAS_CONTENT
    result = connection.execute(
        update(index_status)
        .where(
            is_collection_status_row(lease.collection_id, collection_slug),
            index_status.c.capture_state == "active",
            registry_identity_is_current(lease.collection_id, collection_slug),
        )
        .values(capture_state="deleting", updated_at=now())
    )
    return GuardOutcome.FENCED if result.rowcount == 1 else GuardOutcome.STALE


def delete_collection_synchronously(
    connection: Connection, collection_id: str, collection_slug: str
) -> None:
    """EmDash's delete while capture is not activated, inside the caller's transaction: the FTS
    and content tables, the registry row and its fields, the collection's sources (by slug)
    with their occurrences, and its status row."""
    drop_content_table(connection, collection_slug)
    connection.execute(delete(fields).where(fields.c.collection_id == collection_id))
    connection.execute(delete(collections).where(collections.c.id == collection_id))
    _delete_sources_by_slug(connection, collection_slug)
    connection.execute(
        delete(index_status).where(
            is_content_collection_status(), index_status.c.scope_key == collection_slug
        )
    )


def _delete_sources_by_slug(connection: Connection, collection_slug: str) -> None:
    # Occurrences have no foreign key to their source: delete them first, explicitly.
    by_slug = (sources.c.source_type == "content", sources.c.collection_slug == collection_slug)
    keys = select(sources.c.source_key).where(*by_slug)
    connection.execute(delete(occurrences).where(occurrences.c.source_key.in_(keys)))
    connection.execute(delete(sources).where(*by_slug))


def read_capture_state(
    connection: Connection, collection_id: str, collection_slug: str
) -> str | None:
    """The capture state of exactly this collection identity's status row (None without one)."""
    return connection.execute(
        select(index_status.c.capture_state).where(
            is_collection_status_row(collection_id, collection_slug)
        )
    ).scalar()


def table_has_live_content(connection: Connection, table_name: str) -> bool:
    """Trashed rows (deleted_at set) are not content worth keeping."""
    content = table(table_name, column("deleted_at"))
    statement = select(literal(1)).select_from(content).where(content.c.deleted_at.is_(None))
    return connection.execute(statement.limit(1)).first() is not None


def drop_content_table(connection: Connection, collection_slug: str) -> None:
    """Drop the collection's FTS table (with its triggers), then `ec_<slug>`."""
    _drop_fts_table(connection, collection_slug)
    connection.exec_driver_sql(
        f"DROP TABLE IF EXISTS {quote_identifier(content_table_name(collection_slug))}"
    )


def _drop_fts_table(connection: Connection, collection_slug: str) -> None:
    """EmDash's FTSManager.dropFtsTable: FTS5 exists only on SQLite, elsewhere a no-op."""
    if is_postgres(connection):
        return
    fts_table = f"{FTS_TABLE_PREFIX}{validate_identifier(collection_slug, 'collection slug')}"
    for suffix in FTS_TRIGGER_SUFFIXES:
        connection.exec_driver_sql(f'DROP TRIGGER IF EXISTS "{fts_table}_{suffix}"')
    connection.exec_driver_sql(f'DROP TABLE IF EXISTS "{fts_table}"')


__all__ = [
    "DEFAULT_OPERATOR_LIMIT",
    "MAX_PAGE_LIMIT",
    "ROWS_PER_BATCH",
    "BatchResult",
    "DeletionClaim",
    "DeletionLease",
    "DeletionPage",
    "DeletionPhase",
    "DeletionRecord",
    "DeletionRepository",
    "DeletionRetryResult",
    "GuardAction",
    "GuardOutcome",
    "OperatorDeletionItem",
    "delete_collection_synchronously",
    "deletion_lease_is_live",
    "drop_content_table",
    "execute_local_deletion_guard",
    "find_due_statement",
    "holds_deletion_lease",
    "is_slug_deleting",
    "read_capture_state",
    "table_has_live_content",
]
