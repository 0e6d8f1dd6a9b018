"""Durable collection reconciliations (spec section 6).

EmDash's `MediaUsageReconciliationRepository`: one method per guarded statement, with the
seed's guards composed from two named predicates, `live_claim_exists` (this lease still owns
the coordinator row) and `predicates.status_owns_run` (the coverage status is running for this
run at this epoch). Reconciliation leases are live while `lease_expires_at` is after
*statement* time, as in the seed.

Beyond the seed (each says so in its docstring):
- `renew_lease`: a Dagster step keeps its claim across several pages.
- `write_scan_page`, `checkpoint_clean_source_page`: a page read, enqueued and checkpointed
  in one statement (one transaction on SQLite), as the driver and the ops write pages.
- `find_stuck_failed`, `pin_stuck_failed_epoch`, `reset_stuck_failed`: healing of the seed's
  stuck state (spec 6.4), where a terminal failure recorded while nobody owned coverage leaves
  `target_epoch` NULL, so `reset_failed_for_new_epoch` can never match and seeding skips the
  collection for ever.
- `retry_failed_by_operator`: an operator retry, which EmDash does not offer for reconciliations.
- `resume_retry_now`: an operator's re-execution from the failed step resumes a retrying run.
- `find_by_collection`, `find_coverage`, `seed_collection`, `request_full_reconciliation`,
  `delete_one_obsolete_collection`, `holds_live_claim`: reconciling one named collection (a
  partitioned run or an operator's forced run) step by step, and reporting which collection a
  tick touched.

How the stuck state heals automatically: the seed's reset waits until the status epoch moves
past the epoch the failure was judged at, so a deterministic failure does not loop. A NULL
target has no such epoch, so `pin_stuck_failed_epoch` records the status epoch observed while
nobody owns coverage as the row's `target_epoch`. From then on the row is an ordinary seed
failure: `find_failed` lists it once `change_epoch` moves past the pin and
`reset_failed_for_new_epoch` reopens it (EmDash itself would heal it the same way). Intended
use: pin right after a terminal failure that `finish_failed_coverage` could not publish, and
let the maintenance tick pin whatever `find_stuck_failed` still lists (a crash in between).
`find_failed` itself stays exactly the seed's: listing target-less rows at once would reopen a
deterministic failure on every tick.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    case,
    delete,
    exists,
    func,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement
from ulid import ULID

from media_usage_orchestration.store.core.clock import (
    lease_live_at_statement,
    now,
    timestamp_offset,
    validate_duration,
)
from media_usage_orchestration.store.core.engine import (
    guarded_writes_together,
    is_postgres,
    read_transaction,
    single_statement,
)
from media_usage_orchestration.store.core.id_lists import in_text_list
from media_usage_orchestration.store.core.leases import (
    LeaseState,
    is_claimable,
    is_reopenable_by_operator,
    positive_whole,
)
from media_usage_orchestration.store.core.predicates import (
    activation_is_active,
    is_content_collection_status,
    no_deletion_tombstone,
)
from media_usage_orchestration.store.core.schema import (
    index_status,
    reconciliations,
    sources,
    work,
)
from media_usage_orchestration.store.reconciliation.guards import (
    canonical_sources,
    claim_holds_lease,
    claimable_status,
    holds_lease,
    live_claim_exists,
    no_work_rows,
    reset_values,
    running_epoch,
    status_is_claim_target,
    status_owns_claimed_run,
    unowned_status_for_row,
)
from media_usage_orchestration.store.reconciliation.records import (
    DEFAULT_LEASE_SECONDS,
    ENTRY_FAILED_CODE,
    NON_TERMINAL_ATTEMPT_CEILING,
    PROCESSING_FAILED_CODE,
    Coverage,
    PageCheckpoint,
    ReconciliationClaim,
    ReconciliationPhase,
    ReconciliationRecord,
    SourceCandidate,
    WorkBarrier,
    WorkBarrierState,
    candidate_limit,
    page_limit,
    require_claim,
    require_identity,
    require_lease_identity,
    unique_content_ids,
    validated_cursor,
    validated_epoch,
)
from media_usage_orchestration.store.reconciliation.statements import (
    BOUND_CURSOR,
    BOUND_EPOCH,
    BOUND_UPPER,
    PageWrite,
    checkpoint_statement,
    claim_parameters,
    clean_source_page_statement,
    content_table,
    delete_one_obsolete_statement,
    finalize_coverage_statement,
    find_due_statement,
    find_failed_statement,
    find_stuck_failed_statement,
    finish_failed_coverage_statement,
    owns_run_statement,
    renew_statement,
    request_full_reconciliation_statement,
    scan_page_statement,
    seed_next_candidate_statement,
    source_page_statement,
    write_scan_page_statements,
)
from media_usage_orchestration.store.work.statements import enqueue_page_parameters
from media_usage_orchestration.values.identifiers import (
    content_table_name,
    require_text,
    validate_error_code,
)
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome, OperatorRetryResult
from media_usage_orchestration.values.records import record_from_row

# --- repository ---------------------------------------------------------------------------------


class ReconciliationRepository:
    """EmDash's `MediaUsageReconciliationRepository`; each method is one transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _write(self, statement) -> bool:
        with single_statement(self.engine) as connection:
            return connection.execute(statement).rowcount == 1

    def _returning(self, statement) -> Any:
        with single_statement(self.engine) as connection:
            return connection.execute(statement).first()

    # -- reads -----------------------------------------------------------------------------------

    def find_by_identity(self, collection_id: str, run_token: str) -> ReconciliationRecord | None:
        require_identity(collection_id, run_token)
        with read_transaction(self.engine) as connection:
            row = connection.execute(
                select(reconciliations).where(
                    reconciliations.c.collection_id == collection_id,
                    reconciliations.c.run_token == run_token,
                )
            ).first()
        return ReconciliationRecord.from_row(row._mapping) if row is not None else None

    def find_by_collection(self, collection_id: str) -> ReconciliationRecord | None:
        """Beyond the seed: the coordinator of a collection, whatever its run token (a
        collection has at most one)."""
        require_text(collection_id, "Reconciliation lookup requires a collection ID")
        with read_transaction(self.engine) as connection:
            row = connection.execute(
                select(reconciliations).where(reconciliations.c.collection_id == collection_id)
            ).first()
        return ReconciliationRecord.from_row(row._mapping) if row is not None else None

    def find_all(self) -> list[ReconciliationRecord]:
        """Beyond the seed: every collection's coordinator (at most one each), by slug, for
        operators."""
        statement = select(reconciliations).order_by(
            reconciliations.c.collection_slug, reconciliations.c.collection_id
        )
        with read_transaction(self.engine) as connection:
            return [
                ReconciliationRecord.from_row(row._mapping) for row in connection.execute(statement)
            ]

    def find_coverage(self, collection_id: str) -> Coverage | None:
        """Beyond the seed: the content-media status row of a collection, to explain why a
        collection cannot be claimed."""
        require_text(collection_id, "Reconciliation lookup requires a collection ID")
        statement = select(
            index_status.c.status,
            index_status.c.capture_state,
            index_status.c.reconciliation_required,
            index_status.c.cursor,
            index_status.c.change_epoch,
        ).where(is_content_collection_status(), index_status.c.collection_id == collection_id)
        with read_transaction(self.engine) as connection:
            row = connection.execute(statement).first()
        if row is None:
            return None
        return record_from_row(
            Coverage, row._mapping, reconciliation_required=int, change_epoch=int
        )

    def find_due(self, limit: int) -> list[ReconciliationRecord]:
        statement = find_due_statement(limit)
        with read_transaction(self.engine) as connection:
            return [
                ReconciliationRecord.from_row(row._mapping) for row in connection.execute(statement)
            ]

    def find_failed(self, limit: int) -> list[ReconciliationRecord]:
        """Failed rows whose outcome can now be published or reset: coverage was completed by
        someone else, this run still owns a running status, or the epoch moved past the one the
        row failed at (never a row without one: see `find_stuck_failed`)."""
        statement = find_failed_statement(candidate_limit(limit))
        with read_transaction(self.engine) as connection:
            return [
                ReconciliationRecord.from_row(row._mapping) for row in connection.execute(statement)
            ]

    def owns_run(self, claim: ReconciliationRecord, target_epoch: int | str) -> bool:
        require_identity(claim.collection_id, claim.run_token)
        epoch = validated_epoch(target_epoch)
        parameters = claim_parameters(claim, **{BOUND_EPOCH.key: epoch})
        with read_transaction(self.engine) as connection:
            owned = connection.execute(owns_run_statement(), parameters).scalar()
        return bool(owned)

    def holds_live_claim(self, claim: ReconciliationRecord) -> bool:
        """Beyond the seed: `live_claim_exists` as a read, so a step can tell "nothing left
        to page" from "the guarded page read saw nothing because the lease is gone"."""
        require_claim(claim)
        with read_transaction(self.engine) as connection:
            return bool(connection.execute(select(live_claim_exists(claim))).scalar())

    def find_work_barrier(self, collection_id: str) -> WorkBarrier:
        """Counts every work row of the collection, captured ones included."""
        require_text(collection_id, "Reconciliation work barrier requires a collection ID")
        with read_transaction(self.engine) as connection:
            failed = connection.execute(
                select(work.c.last_error_code)
                .where(work.c.collection_id == collection_id, work.c.state == "failed")
                # The same order as by `content_id`, but one no index provides: ordered by the
                # primary key, SQLite would walk every work row of the collection to find a
                # failed one (once per drained batch); this way it reads only failed rows.
                .order_by(work.c.content_id.concat(""))
                .limit(1)
            ).first()
            if failed is not None:
                code = failed.last_error_code or PROCESSING_FAILED_CODE
                return WorkBarrier(WorkBarrierState.FAILED, code)
            pending = connection.execute(
                select(work.c.content_id).where(work.c.collection_id == collection_id).limit(1)
            ).first()
        return WorkBarrier(WorkBarrierState.PENDING if pending else WorkBarrierState.EMPTY)

    # -- scan ------------------------------------------------------------------------------------

    def find_scan_upper_id(self, claim: ReconciliationRecord) -> str | None:
        """The highest content id at run start: entries created later are captured by triggers."""
        content = content_table(claim.collection_slug)
        require_claim(claim)
        statement = (
            select(content.c.id)
            .where(live_claim_exists(claim))
            .order_by(content.c.id.desc())
            .limit(1)
        )
        with read_transaction(self.engine) as connection:
            return connection.execute(statement).scalar()

    def find_scan_page(
        self, reconciliation: ReconciliationRecord, limit: int, *, guarded: bool = True
    ) -> list[str]:
        """The next page of content ids after the scan cursor, seen only while the claim's
        lease holds the row. Unguarded (`guarded=False`) only inside the page's transaction,
        whose enqueue and checkpoint carry the lease's guards and refuse when it is lost."""
        limit = page_limit(limit, "scan")
        content_table_name(reconciliation.collection_slug)  # a bad slug fails before any SQL
        if not reconciliation.lease_token or reconciliation.target_epoch is None:
            return []
        require_claim(reconciliation)
        cursor, upper = reconciliation.scan_cursor, reconciliation.scan_upper_id
        statement = scan_page_statement(
            reconciliation.collection_slug, bool(cursor), bool(upper), limit, guarded
        )
        parameters = claim_parameters(
            reconciliation, **{BOUND_CURSOR.key: cursor, BOUND_UPPER.key: upper}
        )
        with read_transaction(self.engine) as connection:
            return list(connection.execute(statement, parameters).scalars())

    def begin_run(self, claim: ReconciliationRecord) -> int | None:
        """Take the coverage status for this run; the epoch moves unless this run already
        holds it (a resumed first step keeps its epoch and start time)."""
        require_claim(claim)
        same_run = and_(
            index_status.c.status == "running", index_status.c.cursor == claim.run_token
        )
        return self._take_status(claim, same_run, indexed_source_count=0, failed_source_count=0)

    def _take_status(
        self, claim: ReconciliationRecord, keeps_epoch: ColumnElement[bool], **extra: Any
    ) -> int | None:
        """Make the claim's run the running owner of its status; where `keeps_epoch` holds,
        the epoch and start time stay as they are, otherwise the epoch moves."""
        statement = (
            update(index_status)
            .where(status_is_claim_target(claim))
            .values(
                status="running",
                started_at=case((keeps_epoch, index_status.c.started_at), else_=now()),
                completed_at=None,
                cursor=claim.run_token,
                last_error_code=None,
                change_epoch=case(
                    (keeps_epoch, index_status.c.change_epoch),
                    else_=index_status.c.change_epoch + 1,
                ),
                reconciliation_required=1,
                updated_at=now(),
                **extra,
            )
            .returning(index_status.c.change_epoch)
        )
        row = self._returning(statement)
        return int(row.change_epoch) if row is not None else None

    def initialize_scan(
        self,
        claim: ReconciliationRecord,
        target_epoch: int | str,
        field_fingerprint: str,
        scan_upper_id: str | None,
    ) -> bool:
        require_claim(claim)
        return self._start_scan(
            claim,
            reconciliations.c.target_epoch.is_(None),
            target_epoch,
            field_fingerprint,
            scan_upper_id,
        )

    def _start_scan(
        self,
        claim: ReconciliationRecord,
        pinned_epoch: ColumnElement[bool],
        target_epoch: int | str,
        field_fingerprint: str,
        scan_upper_id: str | None,
        **extra: Any,
    ) -> bool:
        """Pin the run's epoch, fields and scan bound on the coordinator and start its scan,
        while the row's current pin matches `pinned_epoch` and the run owns its status."""
        epoch = validated_epoch(target_epoch)
        require_text(field_fingerprint, "Reconciliation requires a field fingerprint")
        scan_upper_id = validated_cursor(scan_upper_id, "scan upper id")
        statement = (
            update(reconciliations)
            .where(claim_holds_lease(claim), pinned_epoch, status_owns_claimed_run(claim, epoch))
            .values(
                target_epoch=epoch,
                field_fingerprint=field_fingerprint,
                phase=ReconciliationPhase.SCAN.value,
                scan_cursor=None,
                scan_upper_id=scan_upper_id,
                source_cursor=None,
                source_upper_key=None,
                attempt_count=0,
                last_error_code=None,
                updated_at=now(),
                **extra,
            )
        )
        return self._write(statement)

    def checkpoint_scan(
        self,
        claim: ReconciliationRecord,
        target_epoch: int | str,
        previous_cursor: str | None,
        next_cursor: str,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ) -> str | None:
        return self._checkpoint(
            claim,
            target_epoch,
            previous_cursor,
            next_cursor,
            ReconciliationPhase.SCAN,
            lease_seconds,
        )

    def _checkpoint(
        self,
        claim: ReconciliationRecord,
        target_epoch: int | str,
        previous_cursor: str | None,
        next_cursor: str,
        phase: ReconciliationPhase,
        lease_seconds: int,
    ) -> str | None:
        """Move the page cursor (compare-and-set) and renew the lease past its half, in one
        guarded statement; the lease's expiry afterwards, or None when the write was refused
        (lease, run token, epoch, phase or cursor moved)."""
        require_claim(claim)
        epoch = validated_epoch(target_epoch)
        previous_cursor = validated_cursor(previous_cursor, "previous cursor")
        require_text(next_cursor, "Reconciliation checkpoint requires a next cursor")
        validate_duration(lease_seconds, "Reconciliation lease duration", allow_zero=False)
        statement = checkpoint_statement(phase, previous_cursor is not None, lease_seconds)
        parameters = claim_parameters(
            claim,
            **{BOUND_EPOCH.key: epoch, "previous_cursor": previous_cursor},
            next_cursor=next_cursor,
        )
        with single_statement(self.engine) as connection:
            row = connection.execute(statement, parameters).first()
        return row.lease_expires_at if row is not None else None

    def write_scan_page(
        self,
        claim: ReconciliationRecord,
        reconciliation: ReconciliationRecord,
        limit: int,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ) -> PageCheckpoint | None:
        """Beyond the seed: `find_scan_page`, `enqueue_reconciliation_page` and
        `checkpoint_scan` for the page after `reconciliation.scan_cursor`, written together
        (one statement on PostgreSQL, one transaction on SQLite) with every guard of the
        three. None when nothing was written: the page was empty, or a guard refused."""
        page = PageWrite.of(claim, reconciliation, ReconciliationPhase.SCAN, limit, lease_seconds)
        if page is None:
            return None  # nothing to scan: the collection had no media fields
        parameters = {
            **page.parameters,
            **enqueue_page_parameters(
                collection_id=claim.collection_id,
                collection_slug=claim.collection_slug,
                run_token=claim.run_token,
                lease_token=claim.lease_token,
                change_epoch=page.parameters[BOUND_EPOCH.key],
                phase=ReconciliationPhase.SCAN.value,
            ),
        }
        # One statement on PostgreSQL; on SQLite the checkpoint first, and the enqueue only
        # if it was written, both in one transaction.
        together = single_statement if is_postgres(self.engine) else guarded_writes_together
        with together(self.engine) as connection:
            statements = write_scan_page_statements(
                connection.dialect.name,
                claim.collection_slug,
                page.has_previous,
                page.limit,
                lease_seconds,
            )
            row = connection.execute(statements[0], parameters).first()
            if row is None:
                return None
            if len(statements) == 1:
                return PageCheckpoint(*row)
            enqueued = connection.execute(statements[1], parameters).all()
        return PageCheckpoint(row[0], row[1], len(enqueued))

    def checkpoint_clean_source_page(
        self,
        claim: ReconciliationRecord,
        reconciliation: ReconciliationRecord,
        limit: int,
        variants: Sequence[str],
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ) -> PageCheckpoint | None:
        """Beyond the seed: `find_source_page`, `find_missing_content_ids` and
        `checkpoint_sources` in one guarded statement, for a page with nothing to enqueue:
        each source's variant is one of `variants`, its content id set, and its entry's
        content row exists. None when nothing was written: the page was empty, one of its
        sources needs more than a checkpoint, or a guard refused."""
        phase = ReconciliationPhase.SOURCES
        page = PageWrite.of(claim, reconciliation, phase, limit, lease_seconds)
        if page is None:
            return None  # no canonical source existed when the walk began
        with single_statement(self.engine) as connection:
            statement = clean_source_page_statement(
                connection.dialect.name,
                claim.collection_slug,
                page.has_previous,
                page.limit,
                lease_seconds,
                tuple(variants),
            )
            row = connection.execute(statement, page.parameters).first()
        return PageCheckpoint(row[0], row[1]) if row is not None else None

    def restart_run(self, claim: ReconciliationRecord, previous_epoch: int | str) -> int | None:
        """Like `begin_run`, but an "interrupted restart" (this run already moved the epoch past
        `previous_epoch`) keeps that epoch, so a crash between restart steps does not bump it
        again. Source counts are left alone."""
        require_claim(claim)
        previous = validated_epoch(previous_epoch, "Reconciliation previous epoch")
        interrupted = and_(
            index_status.c.status == "running",
            index_status.c.cursor == claim.run_token,
            index_status.c.change_epoch > previous,
        )
        return self._take_status(claim, interrupted)

    def restart_scan(
        self,
        claim: ReconciliationRecord,
        previous_epoch: int | str,
        target_epoch: int | str,
        field_fingerprint: str,
        scan_upper_id: str | None,
    ) -> bool:
        require_claim(claim)
        previous = validated_epoch(previous_epoch, "Reconciliation previous epoch")
        return self._start_scan(
            claim,
            reconciliations.c.target_epoch == previous,
            target_epoch,
            field_fingerprint,
            scan_upper_id,
            next_attempt_at=now(),
        )

    # -- sources ---------------------------------------------------------------------------------

    def find_source_upper_key(
        self, claim: ReconciliationRecord, target_epoch: int | str
    ) -> str | None:
        """The highest canonical source key when the scan ends; legacy sources are never
        enumerated (they have no collection identity)."""
        require_claim(claim)
        epoch = validated_epoch(target_epoch)
        statement = (
            select(sources.c.source_key)
            .where(
                canonical_sources(claim.collection_id),
                live_claim_exists(claim),
                status_owns_claimed_run(claim, epoch),
            )
            .order_by(sources.c.source_key.desc())
            .limit(1)
        )
        with read_transaction(self.engine) as connection:
            return connection.execute(statement).scalar()

    def transition_to_sources(
        self,
        claim: ReconciliationRecord,
        target_epoch: int | str,
        field_fingerprint: str,
        source_upper_key: str | None,
    ) -> bool:
        require_claim(claim)
        epoch = validated_epoch(target_epoch)
        require_text(field_fingerprint, "Reconciliation requires a field fingerprint")
        source_upper_key = validated_cursor(source_upper_key, "source upper key")
        statement = (
            update(reconciliations)
            .where(
                claim_holds_lease(claim),
                reconciliations.c.target_epoch == epoch,
                reconciliations.c.field_fingerprint == field_fingerprint,
                reconciliations.c.phase == ReconciliationPhase.SCAN.value,
                status_owns_claimed_run(claim, epoch),
                no_work_rows(claim.collection_id),
            )
            .values(
                phase=ReconciliationPhase.SOURCES.value,
                source_cursor=None,
                source_upper_key=source_upper_key,
                attempt_count=0,
                last_error_code=None,
                updated_at=now(),
            )
        )
        return self._write(statement)

    def find_source_page(
        self, reconciliation: ReconciliationRecord, limit: int
    ) -> list[SourceCandidate]:
        limit = page_limit(limit, "source")
        if not reconciliation.lease_token or reconciliation.target_epoch is None:
            return []
        require_claim(reconciliation)
        cursor, upper = reconciliation.source_cursor, reconciliation.source_upper_key
        statement = source_page_statement(bool(cursor), bool(upper), limit)
        parameters = claim_parameters(
            reconciliation,
            **{
                BOUND_EPOCH.key: reconciliation.target_epoch,
                BOUND_CURSOR.key: cursor,
                BOUND_UPPER.key: upper,
            },
        )
        with read_transaction(self.engine) as connection:
            return [
                record_from_row(SourceCandidate, row._mapping)
                for row in connection.execute(statement, parameters)
            ]

    def find_missing_content_ids(
        self, collection_slug: str, content_ids: Iterable[str]
    ) -> list[str]:
        content = content_table(collection_slug)
        unique = unique_content_ids(content_ids)
        if not unique:
            return []
        with read_transaction(self.engine) as connection:
            present = set(
                connection.execute(
                    select(content.c.id).where(in_text_list(content.c.id, "content_ids")),
                    {"content_ids": unique},
                ).scalars()
            )
        return [content_id for content_id in unique if content_id not in present]

    def checkpoint_sources(
        self,
        claim: ReconciliationRecord,
        target_epoch: int | str,
        previous_cursor: str | None,
        next_cursor: str,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ) -> str | None:
        return self._checkpoint(
            claim,
            target_epoch,
            previous_cursor,
            next_cursor,
            ReconciliationPhase.SOURCES,
            lease_seconds,
        )

    # -- coverage outcomes -----------------------------------------------------------------------

    def finish_failed_coverage(self, collection_id: str, run_token: str) -> bool:
        """Publish a failed run on the status it still owns: `partial` when a canonical index
        exists, `failed` otherwise; an entry failure reports the first failed work's code."""
        require_identity(collection_id, run_token)
        return self._write(finish_failed_coverage_statement(collection_id, run_token))

    def finalize_coverage(
        self,
        claim: ReconciliationRecord,
        target_epoch: int | str,
        field_fingerprint: str,
        schema_version: int = 1,
    ) -> bool:
        """Coverage becomes trusted only for the exact run, epoch, fields and live lease, with no
        outstanding work, a current registry identity and no deletion under way."""
        require_claim(claim)
        epoch = validated_epoch(target_epoch)
        require_text(field_fingerprint, "Reconciliation requires a field fingerprint")
        schema_version = positive_whole(schema_version, "Reconciliation schema version")
        return self._write(
            finalize_coverage_statement(claim, epoch, field_fingerprint, schema_version)
        )

    def delete_finalized(self, claim: ReconciliationRecord) -> bool:
        """Drop the coordinator once its own finalize made coverage complete."""
        require_claim(claim)
        status = index_status.alias("status")
        statement = delete(reconciliations).where(
            reconciliations.c.collection_id == claim.collection_id,
            reconciliations.c.run_token == claim.run_token,
            reconciliations.c.state == LeaseState.LEASED.value,
            reconciliations.c.lease_token == claim.lease_token,
            exists(
                select(status.c.collection_id).where(
                    status.c.collection_id == claim.collection_id,
                    status.c.scope_key == claim.collection_slug,
                    status.c.status == "complete",
                    status.c.reconciliation_required == 0,
                )
            ),
        )
        return self._write(statement)

    def delete_one_obsolete(self) -> bool:
        """Delete one coordinator whose coverage is already trusted (e.g. a manual repair
        finished), in any state."""
        return self.delete_one_obsolete_collection() is not None

    def delete_one_obsolete_collection(self) -> str | None:
        """`delete_one_obsolete`, returning the collection id of the deleted coordinator."""
        with self.engine.begin() as connection:
            row = connection.execute(delete_one_obsolete_statement()).first()
        return row.collection_id if row is not None else None

    # -- seeding and leases ----------------------------------------------------------------------

    def seed_next_candidate(self) -> bool:
        """Insert at most one coordinator: the lowest eligible collection id."""
        with self.engine.begin() as connection:
            statement = seed_next_candidate_statement(connection, str(ULID()))
            # RETURNING, not rowcount: psycopg reports -1 for an INSERT.
            return connection.execute(statement).first() is not None

    def seed_collection(self, collection_id: str) -> bool:
        """Beyond the seed: `seed_next_candidate` for one named collection (an operator or a
        partitioned run reconciles that collection, not the lowest eligible one)."""
        require_text(collection_id, "Reconciliation seeding requires a collection ID")
        with self.engine.begin() as connection:
            statement = seed_next_candidate_statement(connection, str(ULID()), collection_id)
            return connection.execute(statement).first() is not None

    def request_full_reconciliation(self, collection_id: str) -> bool:
        """Beyond the seed: make trusted coverage untrusted again so a full reconciliation
        runs (an operator's forced run). Only an active, current, undeleted collection whose
        coverage nobody is running; the epoch moves, so work and runs of the old epoch are
        fenced exactly as after a schema change."""
        require_text(collection_id, "Reconciliation request requires a collection ID")
        return self._write(request_full_reconciliation_statement(collection_id))

    def claim(
        self, collection_id: str, run_token: str, lease_duration_seconds: int
    ) -> ReconciliationClaim | None:
        require_identity(collection_id, run_token)
        validate_duration(lease_duration_seconds, "Reconciliation lease duration", allow_zero=False)
        lease_token = str(ULID())
        statement = (
            update(reconciliations)
            .where(
                reconciliations.c.collection_id == collection_id,
                reconciliations.c.run_token == run_token,
                is_claimable(reconciliations),
                activation_is_active(),
                claimable_status(),
                no_deletion_tombstone(reconciliations.c.collection_id),
            )
            .values(
                state=LeaseState.LEASED.value,
                lease_token=lease_token,
                lease_expires_at=timestamp_offset(lease_duration_seconds),
                updated_at=now(),
            )
            .returning(*reconciliations.c)
        )
        row = self._returning(statement)
        return ReconciliationClaim.from_row(row._mapping) if row is not None else None

    def renew_lease(self, claim: ReconciliationRecord, lease_seconds: int) -> str | None:
        """Beyond the seed: extend a still-live lease held by this token once more than half
        of it has elapsed, and return its expiry, or None once it expired or moved on. EmDash
        releases after every page; a Dagster step keeps its claim across pages and renews it
        between them."""
        require_claim(claim)
        validate_duration(lease_seconds, "Reconciliation lease duration", allow_zero=False)
        with single_statement(self.engine) as connection:
            row = connection.execute(
                renew_statement(lease_seconds), claim_parameters(claim)
            ).first()
        return row.lease_expires_at if row is not None else None

    def release(
        self, collection_id: str, run_token: str, lease_token: str, delay_seconds: int
    ) -> bool:
        """Back to pending after `delay_seconds`; the attempt count is kept."""
        require_lease_identity(collection_id, run_token, lease_token)
        validate_duration(delay_seconds, "Reconciliation release delay", allow_zero=True)
        statement = (
            update(reconciliations)
            .where(holds_lease(collection_id, run_token, lease_token))
            .values(
                state=LeaseState.PENDING.value,
                next_attempt_at=timestamp_offset(delay_seconds),
                lease_token=None,
                lease_expires_at=None,
                updated_at=now(),
            )
        )
        return self._write(statement)

    def record_failure(
        self,
        collection_id: str,
        run_token: str,
        lease_token: str,
        error_code: str,
        retry_delay_seconds: int,
        terminal: bool,
    ) -> bool:
        """Retry with backoff, failing after the fifth attempt; a terminal failure keeps the
        epoch it was judged at (or the running epoch of this run), so it is reopened only
        after that epoch moves."""
        require_lease_identity(collection_id, run_token, lease_token)
        validate_error_code(error_code, "Reconciliation failure error code")
        validate_duration(retry_delay_seconds, "Reconciliation retry delay", allow_zero=True)
        if not isinstance(terminal, bool):
            raise ValueError("Reconciliation failure requires an explicit terminal flag")
        values: dict[str, Any] = {
            "state": case(
                (
                    reconciliations.c.attempt_count >= NON_TERMINAL_ATTEMPT_CEILING,
                    LeaseState.FAILED.value,
                ),
                else_=LeaseState.RETRY.value,
            ),
            "attempt_count": reconciliations.c.attempt_count + 1,
            "next_attempt_at": timestamp_offset(retry_delay_seconds),
            "lease_token": None,
            "lease_expires_at": None,
            "last_error_code": error_code,
            "updated_at": now(),
        }
        if terminal:
            values["state"] = LeaseState.FAILED.value
            values["target_epoch"] = func.coalesce(
                reconciliations.c.target_epoch, running_epoch(collection_id, run_token)
            )
        statement = (
            update(reconciliations)
            .where(holds_lease(collection_id, run_token, lease_token))
            .values(values)
        )
        return self._write(statement)

    def record_entry_failure(self, claim: ReconciliationRecord) -> bool:
        """Fail the run because an entry's work failed; refused unless failed work exists."""
        require_claim(claim)
        failed_work = work.alias("work")
        statement = (
            update(reconciliations)
            .where(
                claim_holds_lease(claim),
                exists(
                    select(failed_work.c.content_id).where(
                        failed_work.c.collection_id == claim.collection_id,
                        failed_work.c.state == "failed",
                    )
                ),
            )
            .values(
                state=LeaseState.FAILED.value,
                attempt_count=reconciliations.c.attempt_count + 1,
                next_attempt_at=now(),
                lease_token=None,
                lease_expires_at=None,
                last_error_code=ENTRY_FAILED_CODE,
                updated_at=now(),
            )
        )
        return self._write(statement)

    def reset_failed_for_new_epoch(self, observed: ReconciliationRecord) -> bool:
        """Reopen a failed run as a fresh scan once nobody owns coverage and the epoch moved
        past the one it failed at."""
        require_identity(observed.collection_id, observed.run_token)
        if observed.target_epoch is None:
            return False
        target_epoch = validated_epoch(observed.target_epoch)
        status, unowned = unowned_status_for_row()
        statement = (
            update(reconciliations)
            .where(
                reconciliations.c.collection_id == observed.collection_id,
                reconciliations.c.run_token == observed.run_token,
                reconciliations.c.state == LeaseState.FAILED.value,
                reconciliations.c.target_epoch == target_epoch,
                exists(
                    select(status.c.collection_id).where(
                        unowned, status.c.change_epoch > target_epoch
                    )
                ),
            )
            .values(reset_values())
        )
        return self._write(statement)

    # -- healing the stuck state (beyond the seed) -----------------------------------------------

    def find_stuck_failed(self, limit: int) -> list[ReconciliationRecord]:
        """Beyond the seed: failed rows without a target epoch on a status nobody owns. The
        seed's `find_failed` never lists them and `reset_failed_for_new_epoch` never matches
        them; `pin_stuck_failed_epoch` turns each into an ordinary seed failure."""
        statement = find_stuck_failed_statement(candidate_limit(limit))
        with read_transaction(self.engine) as connection:
            return [
                ReconciliationRecord.from_row(row._mapping) for row in connection.execute(statement)
            ]

    def pin_stuck_failed_epoch(self, collection_id: str, run_token: str) -> int | None:
        """Beyond the seed: record the status epoch as the target of a failed row that has
        none, while nobody owns coverage; returns the pinned epoch. The seed's own reset then
        reopens the row as soon as the epoch moves past it, exactly like any other terminal
        failure (and EmDash, sharing the database, heals it the same way)."""
        require_identity(collection_id, run_token)
        status, unowned = unowned_status_for_row()
        observed_epoch = select(status.c.change_epoch).where(unowned).scalar_subquery()
        statement = (
            update(reconciliations)
            .where(
                reconciliations.c.collection_id == collection_id,
                reconciliations.c.run_token == run_token,
                reconciliations.c.state == LeaseState.FAILED.value,
                reconciliations.c.target_epoch.is_(None),
                exists(select(status.c.collection_id).where(unowned)),
            )
            .values(target_epoch=observed_epoch, updated_at=now())
            .returning(reconciliations.c.target_epoch)
        )
        row = self._returning(statement)
        return int(row.target_epoch) if row is not None else None

    def reset_stuck_failed(self, collection_id: str) -> bool:
        """Beyond the seed: reopen, now, a failed row without a target epoch when its status is
        active, untrusted and unowned (same reset as `reset_failed_for_new_epoch`). For explicit
        healing; the automatic path waits for the epoch to move (see the module docstring)."""
        require_text(collection_id, "Reconciliation reset requires a collection ID")
        status, unowned = unowned_status_for_row()
        statement = (
            update(reconciliations)
            .where(
                reconciliations.c.collection_id == collection_id,
                reconciliations.c.state == LeaseState.FAILED.value,
                reconciliations.c.target_epoch.is_(None),
                exists(select(status.c.collection_id).where(unowned)),
            )
            .values(reset_values())
        )
        return self._write(statement)

    def resume_retry_now(self, collection_id: str, run_token: str) -> bool:
        """Beyond the seed: make a retrying run due now, its checkpoints kept, for an operator
        who re-executes a failed Dagster run from the failed step (the steps before it do not
        run again, so a fresh scan could not be resumed there). The backoff only paces the
        automatic lane; every later write still asserts the lease, the epoch and the cursors."""
        require_identity(collection_id, run_token)
        statement = (
            update(reconciliations)
            .where(
                reconciliations.c.collection_id == collection_id,
                reconciliations.c.run_token == run_token,
                reconciliations.c.state == LeaseState.RETRY.value,
            )
            .values(next_attempt_at=now(), updated_at=now())
        )
        return self._write(statement)

    def retry_failed_by_operator(self, collection_id: str) -> OperatorRetryResult:
        """Beyond the seed (EmDash has no reconciliation retry): reopen a failed, retrying or
        lease-expired coordinator as a fresh scan. A live lease is never stolen; a pending row
        is already queued (conflict)."""
        require_text(collection_id, "Reconciliation retry requires a collection ID")
        with self.engine.begin() as connection:
            reopened = connection.execute(
                update(reconciliations)
                .where(
                    reconciliations.c.collection_id == collection_id,
                    is_reopenable_by_operator(reconciliations),
                )
                .values(reset_values())
                .returning(*reconciliations.c)
            ).first()
            if reopened is not None:
                record = ReconciliationRecord.from_row(reopened._mapping)
                return OperatorRetryResult(OperatorRetryOutcome.PENDING, changed=True, row=record)
            return self._retry_refusal(connection, collection_id)

    @staticmethod
    def _retry_refusal(connection: Connection, collection_id: str) -> OperatorRetryResult:
        observed = connection.execute(
            select(
                reconciliations,
                lease_live_at_statement(reconciliations.c.lease_expires_at).label("lease_live"),
            ).where(reconciliations.c.collection_id == collection_id)
        ).first()
        if observed is None:
            return OperatorRetryResult(OperatorRetryOutcome.NOT_FOUND)
        record = ReconciliationRecord.from_row(observed._mapping)
        if record.state is LeaseState.LEASED and observed.lease_live:
            return OperatorRetryResult(
                OperatorRetryOutcome.LEASE_ACTIVE,
                row=record,
                lease_expires_at=record.lease_expires_at,
            )
        return OperatorRetryResult(OperatorRetryOutcome.CONFLICT, row=record)
