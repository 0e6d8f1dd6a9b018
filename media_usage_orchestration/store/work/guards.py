"""The guard predicates every work statement re-asserts: the exact identity, a live lease of the exact version and token, the reconciliation that owns a page, the observed row unchanged."""

from __future__ import annotations

from sqlalchemy import (
    and_,
    exists,
    literal,
    select,
)
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import FromClause

from media_usage_orchestration.store.core.clock import (
    lease_live_at_clock,
    lease_live_at_statement,
)
from media_usage_orchestration.store.core.leases import (
    LeaseState,
    lease_has_expired,
)
from media_usage_orchestration.store.core.predicates import (
    activation_is_active,
    capture_is_active,
    no_deletion_tombstone,
    registry_identity_is_current,
    status_row_owns_run,
)
from media_usage_orchestration.store.core.schema import (
    collections,
    index_status,
    reconciliations,
    work,
)
from media_usage_orchestration.store.work.records import LEASED_VALUE, WorkLease, WorkRecord

# --- guards -----------------------------------------------------------------------------------


def is_identity(collection_id: str, content_id: str, table: FromClause = work):
    return and_(table.c.collection_id == collection_id, table.c.content_id == content_id)


def lease_is_live() -> ColumnElement[bool]:
    """The seed's `leaseIsLive()`: work leases are judged against the wall clock."""
    return lease_live_at_clock(work.c.lease_expires_at)


def holds_lease(lease: WorkLease) -> ColumnElement[bool]:
    """Only the current owner of this exact version may write: a re-enqueue bumps the version,
    a takeover changes the token, and an expired lease belongs to nobody."""
    return and_(
        is_identity(lease.collection_id, lease.content_id),
        work.c.work_version == lease.work_version,
        work.c.state == LEASED_VALUE,
        work.c.lease_token == lease.lease_token,
        lease_is_live(),
    )


def status_joins_registry(status: FromClause, collection: FromClause) -> ColumnElement[bool]:
    return and_(status.c.collection_id == collection.c.id, status.c.scope_key == collection.c.slug)


def reconciliation_owns_page(
    *,
    collection_id: ColumnElement | str,
    collection_slug: ColumnElement | str,
    run_token: ColumnElement | str,
    lease_token: ColumnElement | str,
    change_epoch: ColumnElement | int,
    phase: ColumnElement | str,
) -> ColumnElement[bool]:
    """Only the live reconciliation lease that owns this run, phase and epoch may enqueue;
    anything else (a takeover, a restart, a deletion, deactivation) enqueues nothing."""
    reconciliation = reconciliations.alias("reconciliation")
    status = index_status.alias("status")
    joined = reconciliation.join(
        status,
        and_(
            status.c.collection_id == reconciliation.c.collection_id,
            status.c.scope_key == reconciliation.c.collection_slug,
        ),
    )
    return exists(
        select(literal(1))
        .select_from(joined)
        .where(
            reconciliation.c.collection_id == collection_id,
            reconciliation.c.collection_slug == collection_slug,
            reconciliation.c.run_token == run_token,
            reconciliation.c.target_epoch == change_epoch,
            reconciliation.c.state == LEASED_VALUE,
            reconciliation.c.phase == phase,
            reconciliation.c.lease_token == lease_token,
            lease_live_at_statement(reconciliation.c.lease_expires_at),
            registry_identity_is_current(
                reconciliation.c.collection_id, reconciliation.c.collection_slug
            ),
            status_row_owns_run(status, run_token, change_epoch),
            activation_is_active(),
            no_deletion_tombstone(reconciliation.c.collection_id),
        )
    )


def observed_work_unchanged(observed: WorkRecord) -> ColumnElement[bool]:
    """The row the operator looked at is still the same version and state (and, if leased,
    still abandoned), so the retry cannot overwrite newer work or steal a live lease."""
    current = work.alias("work")
    conditions = [
        current.c.collection_id == index_status.c.collection_id,
        current.c.content_id == observed.content_id,
        current.c.work_version == observed.work_version,
        current.c.state == observed.state.value,
    ]
    if observed.state is LeaseState.LEASED:
        conditions.append(lease_has_expired(current))
    return exists(select(literal(1)).select_from(current).where(*conditions))


def no_work_exists(content_id: str) -> ColumnElement[bool]:
    """Creating work is only right while no row exists; otherwise another writer got there."""
    current = work.alias("work")
    return ~exists(
        select(literal(1))
        .select_from(current)
        .where(
            current.c.collection_id == index_status.c.collection_id,
            current.c.content_id == content_id,
        )
    )


def status_reached_epoch(collection_id: str, collection_slug: str, change_epoch: int):
    """The coverage bump this retry made is still the latest: the collection is still current
    and active, and no other writer advanced the epoch in between."""
    collection = collections.alias("collection")
    status = index_status.alias("status")
    return exists(
        select(collection.c.id)
        .select_from(collection.join(status, status_joins_registry(status, collection)))
        .where(
            collection.c.id == collection_id,
            collection.c.slug == collection_slug,
            capture_is_active(status),
            status.c.change_epoch == change_epoch,
        )
    )
