"""The deletion lease as guard predicates: state `leased`, the exact token and a lease still live on the database clock, re-asserted by every tombstone write."""

from __future__ import annotations

from sqlalchemy import (
    and_,
    exists,
    select,
)
from sqlalchemy.sql.elements import ColumnElement

from media_usage_orchestration.store.core.clock import (
    lease_live_at_clock,
)
from media_usage_orchestration.store.core.leases import (
    LeaseState,
)
from media_usage_orchestration.store.core.schema import (
    collection_deletions,
    sources,
)
from media_usage_orchestration.store.deletion.records import DeletionLease, DeletionPhase
from media_usage_orchestration.values.source_records import SOURCE_TYPE_CONTENT

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


def canonical_sources(collection_id: str) -> ColumnElement[bool]:
    # Legacy slug-keyed sources have collection_id NULL, so they never match.
    return and_(
        sources.c.source_type == SOURCE_TYPE_CONTENT, sources.c.collection_id == collection_id
    )
