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

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    delete,
    inspect,
    or_,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from ulid import ULID

from media_usage_orchestration.store.core.clock import (
    lease_live_at_clock,
    now,
    timestamp_offset,
    validate_duration,
)
from media_usage_orchestration.store.core.engine import (
    is_missing_table,
    read_transaction,
)
from media_usage_orchestration.store.core.leases import (
    LeaseState,
    bounded_limit,
    is_claimable,
    is_reopenable_by_operator,
    parse_lease_state,
    require_flag,
)
from media_usage_orchestration.store.core.predicates import (
    is_collection_status_row,
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
from media_usage_orchestration.store.deletion.guards import (
    canonical_sources,
    deletion_lease_is_live,
    holds_deletion_lease,
)
from media_usage_orchestration.store.deletion.local_guard import is_slug_deleting
from media_usage_orchestration.store.deletion.records import (
    DEFAULT_OPERATOR_LIMIT,
    MAX_PAGE_LIMIT,
    ROWS_PER_BATCH,
    BatchResult,
    DeletionClaim,
    DeletionLease,
    DeletionPage,
    DeletionPhase,
    DeletionRecord,
    LeaseHolder,
    OperatorDeletionItem,
    lease_identity,
    validated_batch_size,
    validated_identity,
    validated_lease_seconds,
    validated_phase,
)
from media_usage_orchestration.store.deletion.statements import (
    cleanup_rows_remain,
    find_due_statement,
    lock_leased_tombstone,
    page_ids,
    update_deletion,
)
from media_usage_orchestration.store.host.registry import collection_identity_exists
from media_usage_orchestration.values.cursors import decode_cursor, encode_cursor
from media_usage_orchestration.values.errors import (
    DeletionCleanupIncomplete,
    DeletionIdentityConflict,
    DeletionLeaseLost,
)
from media_usage_orchestration.values.identifiers import (
    content_table_name,
    require_text,
    validate_error_code,
    validate_identifier,
)
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome, OperatorRetryResult

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
        collection_id, collection_slug = validated_identity(collection_id, collection_slug)
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
        phase = validated_phase(phase)
        lease_seconds = validated_lease_seconds(lease_seconds)
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
        lease = lease_identity(lease)
        lease_seconds = validated_lease_seconds(lease_seconds)
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

    def retry_operator_deletion(
        self, collection_id: str
    ) -> OperatorRetryResult[OperatorDeletionItem]:
        require_text(collection_id, "Collection deletion retry requires an ID")
        with self.engine.begin() as connection:
            observed = connection.execute(
                select(collection_deletions).where(
                    collection_deletions.c.collection_id == collection_id
                )
            ).first()
            if observed is None:
                return OperatorRetryResult(OperatorRetryOutcome.NOT_FOUND)
            live_expiry = self._live_lease_expiry(connection, observed)
            if live_expiry is not None:
                return OperatorRetryResult(
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
            return OperatorRetryResult(OperatorRetryOutcome.CONFLICT)
        return OperatorRetryResult(
            OperatorRetryOutcome.PENDING,
            changed=True,
            row=OperatorDeletionItem.from_row(reopened._mapping),
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
        lease = lease_identity(lease)
        from_phase, to_phase = validated_phase(from_phase), validated_phase(to_phase)
        return self._guarded_update(
            update(collection_deletions)
            .where(holds_deletion_lease(lease, phase=from_phase))
            .values(phase=to_phase.value, attempt_count=0, last_error_code=None, updated_at=now())
        )

    def release(self, lease: LeaseHolder) -> bool:
        """Hand the tombstone back as pending and due now: the next phase may start at once."""
        lease = lease_identity(lease)
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
        lease = lease_identity(lease)
        return self._guarded_update(
            delete(collection_deletions).where(
                holds_deletion_lease(lease, phase=DeletionPhase.FENCE)
            )
        )

    def record_failure(
        self, lease: LeaseHolder, error_code: str, terminal: bool, retry_delay_seconds: int
    ) -> bool:
        lease = lease_identity(lease)
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
        lease = lease_identity(lease)
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
        lease = lease_identity(lease)
        batch = validated_batch_size(batch)
        with self.engine.begin() as connection:
            tombstone = lock_leased_tombstone(connection, lease, DeletionPhase.WORK)
            ids = page_ids(
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
                update_deletion(connection, lease, DeletionPhase.WORK, work_cursor=chunk[-1])
                return BatchResult(DeletionPhase.WORK, deleted, work_cursor=chunk[-1])
            update_deletion(
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
        lease = lease_identity(lease)
        batch = validated_batch_size(batch)
        with self.engine.begin() as connection:
            tombstone = lock_leased_tombstone(connection, lease, DeletionPhase.SOURCES)
            source_key, cursor = tombstone.source_key, tombstone.occurrence_cursor
            if source_key is None:
                source_key = self._next_source_key(connection, lease.collection_id)
                if source_key is None:
                    update_deletion(
                        connection,
                        lease,
                        DeletionPhase.SOURCES,
                        phase=DeletionPhase.STATUS.value,
                        source_key=None,
                        occurrence_cursor=None,
                    )
                    return BatchResult(DeletionPhase.STATUS, 0)
                update_deletion(
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
        ids = page_ids(
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
            update_deletion(
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
                canonical_sources(lease.collection_id),
                deletion_lease_is_live(lease),
            )
        )
        update_deletion(
            connection, lease, DeletionPhase.SOURCES, source_key=None, occurrence_cursor=None
        )
        return BatchResult(DeletionPhase.SOURCES, deleted, source_deleted=True)

    @staticmethod
    def _next_source_key(connection: Connection, collection_id: str) -> str | None:
        return connection.execute(
            select(sources.c.source_key)
            .where(canonical_sources(collection_id))
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
        lease = lease_identity(lease)
        with self.engine.begin() as connection:
            tombstone = lock_leased_tombstone(connection, lease, DeletionPhase.STATUS)
            slug = tombstone.collection_slug
            if cleanup_rows_remain(connection, lease.collection_id, slug, include_status=False):
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
            update_deletion(
                connection, lease, DeletionPhase.STATUS, phase=DeletionPhase.FINALIZE.value
            )

    def finalize(self, lease: LeaseHolder) -> None:
        """Phase `finalize`: delete the tombstone (releasing the slug) once nothing is left."""
        lease = lease_identity(lease)
        with self.engine.begin() as connection:
            slug = lock_leased_tombstone(connection, lease, DeletionPhase.FINALIZE).collection_slug
            if inspect(connection).has_table(content_table_name(slug)):
                raise DeletionCleanupIncomplete(
                    "Collection table still exists during deletion finalization"
                )
            if cleanup_rows_remain(connection, lease.collection_id, slug, include_status=True):
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
