"""The seed's named guard predicates, composed into every reconciliation statement: the live claim, the status a run owns, the coverage a collection may be reconciled under."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    and_,
    exists,
    literal,
    or_,
    select,
)
from sqlalchemy.sql.elements import ColumnElement

from media_usage_orchestration.store.core.clock import (
    lease_live_at_statement,
    now,
)
from media_usage_orchestration.store.core.leases import (
    LeaseState,
)
from media_usage_orchestration.store.core.predicates import (
    activation_is_active,
    is_content_collection_status,
    no_deletion_tombstone,
    registry_identity_is_current,
    status_owns_run,
)
from media_usage_orchestration.store.core.schema import (
    index_status,
    narrow,
    reconciliations,
    sources,
    work,
)
from media_usage_orchestration.store.reconciliation.records import (
    ReconciliationPhase,
    ReconciliationRecord,
)
from media_usage_orchestration.values.source_records import (
    CANONICAL_IDENTITY_VERSION,
    SOURCE_TYPE_CONTENT,
)

# --- named predicates ----------------------------------------------------------------------------


_CLAIMED_ROW = narrow(
    reconciliations,
    "collection_id",
    "collection_slug",
    "run_token",
    "state",
    "lease_token",
    "lease_expires_at",
)


def live_claim_exists(claim: ReconciliationRecord) -> ColumnElement[bool]:
    """The claim's lease still holds the coordinator row of a current, active, undeleted
    collection. Reads and writes outside the row itself carry it, so a fenced owner sees
    nothing and changes nothing."""
    reconciliation = _CLAIMED_ROW.alias("reconciliation")
    return exists(
        select(literal(1))
        .select_from(reconciliation)
        .where(
            registry_identity_is_current(
                reconciliation.c.collection_id, reconciliation.c.collection_slug
            ),
            reconciliation.c.collection_id == claim.collection_id,
            reconciliation.c.collection_slug == claim.collection_slug,
            reconciliation.c.run_token == claim.run_token,
            reconciliation.c.state == LeaseState.LEASED.value,
            reconciliation.c.lease_token == claim.lease_token,
            lease_live_at_statement(reconciliation.c.lease_expires_at),
            activation_is_active(),
            no_deletion_tombstone(reconciliation.c.collection_id),
        )
    )


def status_owns_claimed_run(claim, target_epoch) -> ColumnElement[bool]:
    return status_owns_run(
        claim.collection_id, claim.collection_slug, claim.run_token, target_epoch
    )


def holds_lease(collection_id: str, run_token: str, lease_token: str) -> ColumnElement[bool]:
    """The row-level lease guard of every transition of the coordinator row itself."""
    return and_(
        reconciliations.c.collection_id == collection_id,
        reconciliations.c.run_token == run_token,
        reconciliations.c.state == LeaseState.LEASED.value,
        reconciliations.c.lease_token == lease_token,
        lease_live_at_statement(reconciliations.c.lease_expires_at),
    )


def claim_holds_lease(claim: ReconciliationRecord) -> ColumnElement[bool]:
    return holds_lease(claim.collection_id, claim.run_token, claim.lease_token)


def status_is_claim_target(claim: ReconciliationRecord) -> ColumnElement[bool]:
    """begin/restart may only take an active, untrusted status that nobody else is running."""
    return and_(
        is_content_collection_status(),
        index_status.c.collection_id == claim.collection_id,
        index_status.c.scope_key == claim.collection_slug,
        index_status.c.capture_state == "active",
        index_status.c.reconciliation_required == 1,
        or_(index_status.c.status != "running", index_status.c.cursor == claim.run_token),
        live_claim_exists(claim),
    )


def no_work_rows(collection_id: str) -> ColumnElement[bool]:
    """Coverage cannot advance while any work (enqueued or captured) is outstanding."""
    pending = work.alias("work")
    return ~exists(
        select(pending.c.content_id).where(pending.c.collection_id == collection_id).correlate(None)
    )


def canonical_sources(collection_id: str, source=sources):
    return and_(
        source.c.source_type == SOURCE_TYPE_CONTENT,
        source.c.collection_id == collection_id,
        source.c.identity_version == CANONICAL_IDENTITY_VERSION,
    )


def unowned_status_for_row() -> Any:
    """Active status rows with untrusted coverage and no owner, matched to the row's identity."""
    status = index_status.alias("status")
    return status, and_(
        status.c.collection_id == reconciliations.c.collection_id,
        status.c.scope_key == reconciliations.c.collection_slug,
        is_content_collection_status(status),
        status.c.capture_state == "active",
        status.c.reconciliation_required == 1,
        status.c.cursor.is_(None),
    )


def needs_reconciliation_row(status) -> ColumnElement[bool]:
    """The status row (an alias of the status table) is a current, active, undeleted
    collection's untrusted coverage, and the collection has no coordinator row yet: seeding
    inserts one for it."""
    existing = reconciliations.alias("existing")
    return and_(
        is_content_collection_status(status),
        status.c.capture_state == "active",
        status.c.reconciliation_required == 1,
        status.c.collection_id.is_not(None),
        registry_identity_is_current(status.c.collection_id, status.c.scope_key),
        activation_is_active(),
        ~exists(
            select(literal(1))
            .select_from(existing)
            .where(existing.c.collection_id == status.c.collection_id)
        ),
        no_deletion_tombstone(status.c.collection_id),
    )


_RESET_VALUES: dict[str, Any] = {
    "state": LeaseState.PENDING.value,
    "phase": ReconciliationPhase.SCAN.value,
    "target_epoch": None,
    "field_fingerprint": None,
    "scan_cursor": None,
    "scan_upper_id": None,
    "source_cursor": None,
    "source_upper_key": None,
    "attempt_count": 0,
    "lease_token": None,
    "lease_expires_at": None,
    "last_error_code": None,
}


def reset_values() -> dict[str, Any]:
    """A fresh scan under the same run token (the seed's `resetFailedForNewEpoch` columns)."""
    return {**_RESET_VALUES, "next_attempt_at": now(), "updated_at": now()}


# --- statement pieces used by several methods ---------------------------------------------------


def claimable_status() -> ColumnElement[bool]:
    """Only a collection whose coverage is untrusted, active and current may be reconciled."""
    status = index_status.alias("status")
    return exists(
        select(status.c.collection_id).where(
            registry_identity_is_current(status.c.collection_id, status.c.scope_key),
            status.c.collection_id == reconciliations.c.collection_id,
            status.c.scope_key == reconciliations.c.collection_slug,
            is_content_collection_status(status),
            status.c.capture_state == "active",
            status.c.reconciliation_required == 1,
        )
    )


def running_epoch(collection_id: str, run_token: str):
    """The epoch of a status this run is running, if any: a terminal failure before
    `initialize_scan` still records the epoch it must wait out."""
    status = index_status.alias("status")
    return (
        select(status.c.change_epoch)
        .where(
            is_content_collection_status(status),
            status.c.collection_id == collection_id,
            status.c.status == "running",
            status.c.cursor == run_token,
        )
        .scalar_subquery()
    )
