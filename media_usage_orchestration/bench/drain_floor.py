"""`media-usage bench --mode floor`: a reconciliation with nothing but what the schema's rules
need, to tell what the project's own driver adds.

It writes the end state the driver writes, on the same schema, with the project's extraction,
canonical JSON and fingerprints (`build_content_snapshots`, `published_values`,
`occurrence_rows`), in plain bulk SQL (`bench/sql/bulk_floor.py`), under the seeds' contract: a
leased coordinator row, pages of at most 50 entries (`PAGE_SIZE`, the seeds' `findScanPage`
cap) with one guarded checkpoint each, and each work item under a lease of its own. Its
bookkeeping is otherwise the minimum the rules ask for: each page's work rows are enqueued,
claimed (each item its own token) and completed in one statement each, and every source write
is guarded in its own statement by its item's live work lease and the source's generation
(absent, as the scan found it). There is no admission, no source-walk paging and no retries: a
floor, not a replacement, so project/floor measures what the project adds beyond the contract.

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

from media_usage_orchestration.bench.sql import bulk_floor
from media_usage_orchestration.emdash_double.cms_writer import Collection
from media_usage_orchestration.media.fields import FieldDiscovery
from media_usage_orchestration.media.snapshots import build_content_snapshots
from media_usage_orchestration.media.sources import CONTENT_SOURCE_SCHEMA_VERSION
from media_usage_orchestration.processing.loop.phases import phase
from media_usage_orchestration.processing.reconciliation.model import PAGE_SIZE
from media_usage_orchestration.processing.work.content_reads import read_fields
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.values.errors import FloorLeaseLost
from media_usage_orchestration.values.source_records import (
    new_ulids,
    occurrence_rows,
    published_values,
)

FLOOR_PAGE_SIZE = PAGE_SIZE


def reconcile_floor(engine: Engine, collection: Collection) -> int:
    """Reconcile `collection` from scratch the floor's way; returns its runs (one)."""
    try:
        return _reconcile_floor(engine, collection)
    except FloorLeaseLost as lost:
        raise click.ClickException(f"the floor stopped: {lost}") from None


def _reconcile_floor(engine: Engine, collection: Collection) -> int:
    discovery = read_fields(engine, collection.slug, collection.id)
    coordinator = new_ulids(1)[0]
    with phase("scan"):
        epoch = bulk_floor.take_status(engine, collection.id, collection.slug, coordinator)
    if epoch is None:
        raise click.ClickException("the floor found no active coverage status to reconcile")
    after = ""
    with phase("drain"):
        while after := _page(engine, collection, discovery, epoch, after, coordinator):
            pass
    with phase("sources"):
        bulk_floor.remove_sources_without_content(engine, collection.id, collection.slug)
    with phase("finalize"):
        schema_version = CONTENT_SOURCE_SCHEMA_VERSION
        if not bulk_floor.complete_coverage(engine, collection.id, schema_version, coordinator):
            raise click.ClickException("the floor could not complete coverage")
    return 1


def _page(
    engine: Engine,
    collection: Collection,
    discovery: FieldDiscovery,
    epoch: int,
    after: str,
    coordinator: str,
) -> str | None:
    """One page: read, enqueue and claim its work, build its rows, then write them, complete
    the work and checkpoint the coordinator; the last id, or None after the last page."""
    token = new_ulids(1)[0]
    rows, revisions = bulk_floor.read_and_claim_page(
        engine, collection.id, collection.slug, discovery, epoch, after, FLOOR_PAGE_SIZE, token
    )
    if not rows:
        return None
    built_sources, built_occurrences = _built(collection, discovery, rows, revisions)
    last = rows[-1]["id"]
    bulk_floor.write_page(
        engine, collection.id, built_sources, built_occurrences, token, (coordinator, last)
    )
    return last


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


# --- the end state ---------------------------------------------------------------------------


def end_state_digest(engine: Engine, collection: Collection) -> dict[str, Any]:
    """`end_state` as counts and one SHA-256."""
    state = bulk_floor.end_state(engine, collection.id, collection.slug)
    text = json.dumps(state, sort_keys=True, default=str)
    return {
        "sources": len(state["sources"]),
        "occurrences": len(state["occurrences"]),
        "digest": hashlib.sha256(text.encode()).hexdigest(),
    }


__all__ = ["FLOOR_PAGE_SIZE", "end_state_digest", "reconcile_floor"]
