"""Durable per-entry media usage work: EmDash's `MediaUsageWorkRepository` on SQLAlchemy Core.

One row per (collection_id, content_id) in `_emdash_media_usage_work`. A row is claimed by
leasing an exact `work_version`; every later write (complete, retry, fail, renew) re-asserts
that version, the lease token and a live lease in the same statement, so an owner whose lease
expired, or whose work was re-enqueued meanwhile, can no longer change anything. All
timestamps come from the database clock (`store/core/clock.py`).

Each public method runs in its own transaction (`BEGIN IMMEDIATE` on SQLite; a method of one
statement runs without a transaction block on PostgreSQL). The guards do not rely on that
transaction: every statement is individually guarded, as in the seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    String,
    and_,
    case,
    delete,
    exists,
    literal,
    null,
    or_,
    select,
    update,
)
from ulid import ULID

from media_usage_orchestration.store.core.clock import (
    now,
    timestamp_offset,
    validate_duration,
)
from media_usage_orchestration.store.core.engine import (
    read_transaction,
    single_statement,
)
from media_usage_orchestration.store.core.leases import (
    LeaseState,
    is_claimable,
    lease_has_expired,
)
from media_usage_orchestration.store.core.predicates import (
    capture_is_active,
    registry_identity_is_current,
)
from media_usage_orchestration.store.core.schema import (
    collections,
    dialect_insert,
    index_status,
    work,
)
from media_usage_orchestration.store.host.activation import capture_active
from media_usage_orchestration.store.host.registry import (
    RegisteredCollection,
    collection_id_for_slug,
)
from media_usage_orchestration.store.work.guards import (
    holds_lease,
    is_identity,
    lease_is_live,
    no_work_exists,
    observed_work_unchanged,
    status_joins_registry,
    status_reached_epoch,
)
from media_usage_orchestration.store.work.records import (
    DUE_STATES,
    LEASED_VALUE,
    PAGE_ROWS,
    PENDING_VALUE,
    WORK_COLUMNS,
    OperatorPage,
    OperatorWorkItem,
    WorkLease,
    WorkRecord,
    due_limit,
    due_order_key,
    is_pending_under,
    operator_limit,
    operator_order_key,
    operator_state,
    page_content_ids,
    records_of,
    validated_change_epoch,
    validated_error_code,
    validated_identity,
    validated_lease,
    validated_lease_seconds,
    validated_work_version,
)
from media_usage_orchestration.store.work.statements import (
    CLAIM_COLLECTION,
    CLAIM_TOKENS,
    claim_batch_statement,
    due_indexes_walked_in_order,
    due_rows_statement,
    enqueue_page_parameters,
    enqueue_statement,
    new_work_row,
    operator_rows_statement,
)
from media_usage_orchestration.values.cursors import PageCursor, decode_cursor, encode_cursor
from media_usage_orchestration.values.identifiers import require_text
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome, OperatorRetryResult
from media_usage_orchestration.values.source_records import new_ulids

# --- repository -------------------------------------------------------------------------------


class WorkRepository:
    """EmDash's `MediaUsageWorkRepository`, one public method per seed method, plus
    `renew_lease` and `claim_due_batch`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- reconciliation enqueue ----------------------------------------------------------------

    def enqueue_reconciliation_page(
        self,
        *,
        collection_id: str,
        collection_slug: str,
        run_token: str,
        lease_token: str,
        change_epoch: int | str,
        phase: str,
        content_ids: Sequence[str],
    ) -> int:
        """Upsert one page of pending work at `change_epoch`, in one statement.

        Rows are inserted, or existing rows with an older epoch are reopened (version + 1,
        attempt and lease cleared); rows at the same or a newer epoch are left alone. Nothing
        is written unless the caller's reconciliation lease owns this run, phase and epoch.
        Returns how many rows were inserted or reopened (the seed returns nothing).
        """
        parameters = enqueue_page_parameters(
            collection_id=collection_id,
            collection_slug=collection_slug,
            run_token=run_token,
            lease_token=lease_token,
            change_epoch=change_epoch,
            phase=phase,
        )
        page_ids = page_content_ids(content_ids)
        rows = [{"content_id": content_id} for content_id in page_ids]
        with single_statement(self.engine) as connection:
            dialect_name = connection.dialect.name
            parameters.update(PAGE_ROWS.bind(dialect_name, rows))
            statement = enqueue_statement(dialect_name)
            return len(connection.execute(statement, parameters).all())

    # -- operator listing ----------------------------------------------------------------------

    def find_operator_page(
        self,
        collection_slug: str,
        *,
        state: LeaseState | str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> OperatorPage | None:
        """A page of the collection's work, newest first; None if the slug is not registered."""
        require_text(collection_slug, "Media usage work listing requires a collection slug")
        wanted = operator_state(state)
        limit = operator_limit(limit)
        position = decode_cursor(cursor) if cursor else None
        with read_transaction(self.engine) as connection:
            collection_id = collection_id_for_slug(connection, collection_slug)
            if collection_id is None:
                return None
            collection = RegisteredCollection(collection_id, collection_slug)
            states = (wanted,) if wanted else tuple(LeaseState)
            candidates = [
                OperatorWorkItem.from_record(record)
                for each in states
                for record in self._operator_rows(connection, collection, each, limit, position)
            ]
        ordered = sorted(candidates, key=operator_order_key, reverse=True)
        items = tuple(ordered[:limit])
        if len(ordered) > limit and items:
            return OperatorPage(items, encode_cursor(items[-1].updated_at, items[-1].content_id))
        return OperatorPage(items)

    @staticmethod
    def _operator_rows(
        connection: Connection, collection, state: LeaseState, limit: int, cursor: PageCursor | None
    ) -> list[WorkRecord]:
        statement = operator_rows_statement(
            collection.id, collection.slug, state, limit + 1, cursor
        )
        return records_of(connection.execute(statement))

    # -- operator retry ------------------------------------------------------------------------

    def retry_operator_work(self, collection_id: str, content_id: str) -> OperatorRetryResult:
        """Reopen (or create) one entry's work as pending at a freshly bumped coverage epoch.

        Pending work is reported unchanged; a live lease is never stolen; losing any race
        reports what won instead (pending unchanged, lease_active, collection_not_found or
        conflict), with coverage left stale rather than trusted.
        """
        message = "Media usage operator retry requires collection and content IDs"
        require_text(collection_id, message)
        require_text(content_id, message)
        with self.engine.begin() as connection:
            return self._retry_operator_work(connection, collection_id, content_id)

    def _retry_operator_work(
        self, connection: Connection, collection_id: str, content_id: str
    ) -> OperatorRetryResult:
        collection = self._active_collection(connection, collection_id)
        if collection is None:
            return OperatorRetryResult(OperatorRetryOutcome.COLLECTION_NOT_FOUND)
        observed = self._work_by_identity(connection, collection_id, content_id)
        if is_pending_under(observed, collection.slug):
            return _pending(changed=False, record=observed)
        epoch = self._invalidate_coverage(
            connection, collection_id, collection.slug, content_id, observed
        )
        if epoch is None:
            return self._operator_retry_lost(connection, collection_id, content_id)
        if observed:
            reopened = self._reopen_observed(connection, observed, collection.slug, epoch)
        else:
            reopened = self._create_operator_work(
                connection, collection_id, collection.slug, content_id, epoch
            )
        if reopened:
            return _pending(changed=True, record=reopened)
        return self._operator_retry_lost(connection, collection_id, content_id)

    @staticmethod
    def _active_collection(connection: Connection, collection_id: str):
        collection = collections.alias("collection")
        status = index_status.alias("status")
        return connection.execute(
            select(collection.c.id, collection.c.slug)
            .select_from(collection.join(status, status_joins_registry(status, collection)))
            .where(collection.c.id == collection_id, capture_is_active(status))
        ).first()

    @staticmethod
    def _work_by_identity(
        connection: Connection, collection_id: str, content_id: str
    ) -> WorkRecord | None:
        row = connection.execute(select(work).where(is_identity(collection_id, content_id))).first()
        return WorkRecord.from_row(row._mapping) if row else None

    @staticmethod
    def _invalidate_coverage(
        connection: Connection,
        collection_id: str,
        collection_slug: str,
        content_id: str,
        observed: WorkRecord | None,
    ) -> int | None:
        status = index_status
        work_unchanged = (
            observed_work_unchanged(observed) if observed else no_work_exists(content_id)
        )
        epoch = connection.execute(
            update(status)
            .values(
                change_epoch=status.c.change_epoch + 1,
                status=case((status.c.status == "complete", "stale"), else_=status.c.status),
                completed_at=case(
                    (status.c.status == "complete", null()), else_=status.c.completed_at
                ),
                updated_at=now(),
            )
            .where(
                capture_is_active(status),
                status.c.scope_key == collection_slug,
                status.c.collection_id == collection_id,
                registry_identity_is_current(status.c.collection_id, status.c.scope_key),
                work_unchanged,
            )
            .returning(status.c.change_epoch)
        ).scalar_one_or_none()
        return None if epoch is None else int(epoch)

    @staticmethod
    def _reopen_observed(
        connection: Connection, observed: WorkRecord, collection_slug: str, epoch: int
    ) -> WorkRecord | None:
        conditions = [
            is_identity(observed.collection_id, observed.content_id),
            work.c.work_version == observed.work_version,
            work.c.state == observed.state.value,
            status_reached_epoch(observed.collection_id, collection_slug, epoch),
        ]
        if observed.state is LeaseState.LEASED:
            conditions.append(lease_has_expired(work))
        row = connection.execute(
            update(work)
            .values(
                collection_slug=collection_slug,
                change_epoch=epoch,
                work_version=work.c.work_version + 1,
                state=PENDING_VALUE,
                attempt_count=0,
                next_attempt_at=now(),
                lease_token=None,
                lease_expires_at=None,
                last_attempted_at=None,
                last_error_code=None,
                updated_at=now(),
            )
            .where(*conditions)
            .returning(*work.c)
        ).first()
        return WorkRecord.from_row(row._mapping) if row else None

    @staticmethod
    def _create_operator_work(
        connection: Connection,
        collection_id: str,
        collection_slug: str,
        content_id: str,
        epoch: int,
    ) -> WorkRecord | None:
        status = index_status.alias("status")
        collection = collections.alias("collection")
        source = (
            select(
                *new_work_row(
                    literal(collection_id, String),
                    collection.c.slug,
                    literal(content_id, String),
                    status.c.change_epoch,
                )
            )
            .select_from(status.join(collection, status_joins_registry(status, collection)))
            .where(
                capture_is_active(status),
                status.c.scope_key == collection_slug,
                status.c.collection_id == collection_id,
                # Only at the epoch this retry produced: a newer writer's work wins.
                status.c.change_epoch == epoch,
            )
        )
        statement = (
            dialect_insert(connection, work)
            .from_select(WORK_COLUMNS, source)
            .on_conflict_do_nothing(index_elements=[work.c.collection_id, work.c.content_id])
            .returning(*work.c)
        )
        row = connection.execute(statement).first()
        return WorkRecord.from_row(row._mapping) if row else None

    def _operator_retry_lost(
        self, connection: Connection, collection_id: str, content_id: str
    ) -> OperatorRetryResult:
        if self._active_collection(connection, collection_id) is None:
            return OperatorRetryResult(OperatorRetryOutcome.COLLECTION_NOT_FOUND)
        current = self._work_by_identity(connection, collection_id, content_id)
        if current and current.state is LeaseState.PENDING:
            return _pending(changed=False, record=current)
        expiry = connection.execute(
            select(work.c.lease_expires_at).where(
                is_identity(collection_id, content_id),
                work.c.state == LEASED_VALUE,
                work.c.lease_expires_at.is_not(None),
                lease_is_live(),
            )
        ).scalar_one_or_none()
        if expiry:
            return OperatorRetryResult(OperatorRetryOutcome.LEASE_ACTIVE, lease_expires_at=expiry)
        return OperatorRetryResult(OperatorRetryOutcome.CONFLICT)

    # -- processing ----------------------------------------------------------------------------

    def find_due_work(self, limit: int) -> list[WorkRecord]:
        """Up to `limit` claimable rows, expired leases included, in due order."""
        limit = due_limit(limit)
        with read_transaction(self.engine) as connection:
            rows = [
                record
                for state in DUE_STATES
                for record in records_of(connection.execute(due_rows_statement(state, limit)))
            ]
        return sorted(rows, key=due_order_key)[:limit]

    def find_work_for_content(self, collection_slug: str, content_id: str) -> WorkRecord | None:
        """The entry's work row, only if it belongs to the collection currently at this slug."""
        message = "Media usage work lookup requires collection and content identity"
        require_text(collection_slug, message)
        require_text(content_id, message)
        statement = select(work).where(
            registry_identity_is_current(work.c.collection_id, work.c.collection_slug),
            work.c.collection_slug == collection_slug,
            work.c.content_id == content_id,
        )
        with read_transaction(self.engine) as connection:
            row = connection.execute(statement).first()
        return WorkRecord.from_row(row._mapping) if row else None

    def collection_has_work_in_hand(self, collection_id: str) -> bool:
        """Whether some of the collection's work is leased, or due now.

        Leased: another claimer is processing it and will complete, retry or fail it under its
        own lease, or let the lease lapse, after which the next claim takes it over. Due now
        although a claim just took nothing: on PostgreSQL a concurrent claim has locked those
        rows and not committed yet (`FOR UPDATE SKIP LOCKED` skipped them), so its leases are
        not visible to this statement; or the rows became due after that claim. Either way the
        next claim, or the check after it, sees them. Work backing off (retry not yet due) is
        in nobody's hand, and neither is a lease without an expiry (never taken over). One
        probe, served by the (collection, state) index."""
        require_text(collection_id, "Media usage work-in-hand check requires a collection ID")
        in_hand = or_(
            and_(work.c.state == LEASED_VALUE, work.c.lease_expires_at.is_not(None)),
            is_claimable(work),
        )
        statement = select(exists().where(work.c.collection_id == collection_id, in_hand))
        with read_transaction(self.engine) as connection:
            return bool(connection.execute(statement).scalar())

    def claim_work(
        self, collection_id: str, content_id: str, work_version: int | str, lease_seconds: int
    ) -> WorkRecord | None:
        """Lease this exact version if it is due (or its previous lease expired); None if not."""
        collection_id, content_id = validated_identity(collection_id, content_id)
        version = validated_work_version(work_version)
        lease_seconds = validated_lease_seconds(lease_seconds)
        statement = (
            update(work)
            .values(
                state=LEASED_VALUE,
                lease_token=str(ULID()),
                lease_expires_at=timestamp_offset(lease_seconds),
                last_attempted_at=now(),
                updated_at=now(),
            )
            .where(
                is_identity(collection_id, content_id),
                work.c.work_version == version,
                is_claimable(work),
            )
            .returning(*work.c)
        )
        with single_statement(self.engine) as connection:
            row = connection.execute(statement).first()
        return WorkRecord.from_row(row._mapping) if row else None

    def claim_due_batch(
        self,
        limit: int,
        lease_seconds: int,
        collection_id: str | None = None,
        *,
        while_capture_active: bool = False,
    ) -> list[WorkRecord] | None:
        """Lease up to `limit` due rows in one UPDATE, each under its own fresh ULID token.

        Not in the seed, which claims one row at a time. The candidate subquery picks due rows
        in `find_due_work` order - like it, one branch per due state, each walking its index in
        order and stopping after n rows, so a claim costs the same on any backlog - and
        numbers them 1..n. SQL has no portable ULID, so n ULIDs are generated beforehand and
        bound as one relation of (number, token); the UPDATE therefore joins the candidates
        and the tokens (UPDATE ... FROM) rather than using `pk IN (...)`, so the number travels
        with its key. It joins on (pk, work_version) and re-asserts the claim guard on the row
        it writes: a row that someone else claimed or re-enqueued meanwhile is neither
        written nor returned. On PostgreSQL the candidates are locked `FOR UPDATE SKIP LOCKED`,
        so concurrent batches take disjoint rows. Records come back in due order; each is then
        completed, retried, failed or renewed under its own lease. With `collection_id`, only
        that collection's due rows are candidates. With `while_capture_active` nothing is claimed
        unless capture is active, as EmDash's processor checks before each claim: the UPDATE
        asserts it, so a claim never lands after capture was deactivated, and only a claim that
        took nothing reads the activation row, to tell inactive (None) from nothing due. The
        UPDATE is a statement of its own (no transaction block on PostgreSQL), and records are
        built once it has committed.
        """
        limit = due_limit(limit)
        if collection_id is not None:
            require_text(collection_id, "Media usage batch claim collection ID must not be empty")
        lease_seconds = validated_lease_seconds(lease_seconds)
        tokens = new_ulids(limit)
        dialect_name = self.engine.dialect.name
        parameters = {CLAIM_TOKENS.key: tokens, CLAIM_COLLECTION.key: collection_id}
        statement = claim_batch_statement(
            dialect_name, limit, lease_seconds, collection_id is not None, while_capture_active
        )
        with (
            single_statement(self.engine) as connection,
            due_indexes_walked_in_order(connection),
        ):
            rows = connection.execute(statement, parameters).all()
        if not rows and while_capture_active and not self._capture_active():
            return None
        order = {token: index for index, token in enumerate(tokens)}
        return sorted(records_of(rows), key=lambda record: order[record.lease_token])

    def _capture_active(self) -> bool:
        with read_transaction(self.engine) as connection:
            return capture_active(connection)

    def renew_lease(self, lease: WorkLease, lease_seconds: int) -> str | None:
        """Extend a live lease to now + `lease_seconds`; returns the new expiry, or None.

        Not in the seed. The same guard as completion: only the current owner of this exact
        version, while its lease is still live, so an expired owner cannot resurrect a lease
        that another claimer may already be entitled to take over.
        """
        lease = validated_lease(lease)
        lease_seconds = validated_lease_seconds(lease_seconds)
        statement = (
            update(work)
            .values(lease_expires_at=timestamp_offset(lease_seconds), updated_at=now())
            .where(holds_lease(lease))
            .returning(work.c.lease_expires_at)
        )
        with single_statement(self.engine) as connection:
            return connection.execute(statement).scalar_one_or_none()

    def complete_work(self, lease: WorkLease) -> bool:
        """Delete the work row: success leaves nothing behind."""
        lease = validated_lease(lease)
        with single_statement(self.engine) as connection:
            result = connection.execute(delete(work).where(holds_lease(lease)))
        return result.rowcount > 0

    def delete_work_through_epoch(self, collection_id: str, max_change_epoch: int | str) -> int:
        """Delete the collection's work produced at or before `max_change_epoch`."""
        require_text(collection_id, "Media usage work cleanup requires a collection ID")
        epoch = validated_change_epoch(max_change_epoch)
        statement = delete(work).where(
            work.c.collection_id == collection_id, work.c.change_epoch <= epoch
        )
        with single_statement(self.engine) as connection:
            return connection.execute(statement).rowcount

    def retry_work(self, lease: WorkLease, retry_delay_seconds: int, error_code: str) -> bool:
        delay = validate_duration(
            retry_delay_seconds, "Media usage work retry delay", allow_zero=True
        )
        code = validated_error_code(error_code)
        return self._transition_failure(
            lease, LeaseState.RETRY, code, next_attempt_at=timestamp_offset(delay)
        )

    def fail_work(self, lease: WorkLease, error_code: str) -> bool:
        return self._transition_failure(lease, LeaseState.FAILED, validated_error_code(error_code))

    def _transition_failure(
        self, lease: WorkLease, state: LeaseState, error_code: str, **extra: Any
    ) -> bool:
        lease = validated_lease(lease)
        statement = (
            update(work)
            .values(
                state=state.value,
                attempt_count=work.c.attempt_count + 1,
                lease_token=None,
                lease_expires_at=None,
                last_error_code=error_code,
                updated_at=now(),
                **extra,
            )
            .where(holds_lease(lease))
        )
        with single_statement(self.engine) as connection:
            return connection.execute(statement).rowcount > 0


def _pending(*, changed: bool, record: WorkRecord) -> OperatorRetryResult[OperatorWorkItem]:
    item = OperatorWorkItem.from_record(record)
    return OperatorRetryResult(OperatorRetryOutcome.PENDING, changed=changed, row=item)
