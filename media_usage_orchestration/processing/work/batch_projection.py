"""Refreshing many entries of one collection at once, for a batch of claimed jobs.

`refresh_content_for_work` refreshes one entry in about a dozen statements. Here a batch of
entries of one collection is refreshed in a fixed number: one read transaction (registry
identity, observed canonical sources, field discovery, content rows, draft revisions), ended
before projection in Python with the same snapshot, extraction and fingerprint code; a second
read for the occurrence counts of sources about to be deleted (only when some are); then the
guarded writes of `write_collection_batch` (`store/sources/batch_writes.py`), in which every
row keeps the guards it has alone.

Each entry is classified from what was read:

- its observed sources already publish every snapshot and nothing is absent: nothing to write;
- new or changed snapshots: publications (an insert where the source was observed absent, a
  compare-and-swap update otherwise), then guarded deletes of the canonical sources the entry no
  longer produces (a discarded draft), attempted only once its publications landed;
- its content row is gone: guarded deletes of its canonical sources, while the row stays absent;
- anything else is deferred to the per-item path, whose outcome codes, retries and admission
  stay the only definition of those cases: a snapshot error (draft revision missing, invalid or
  foreign), a refresh that a fresh claim's admission does not admit outright (over the limits,
  or fitting only once unchanged projections are discounted), an observed source that is not
  this entry's canonical row, a value the batch would not bind as the single-row statement does,
  and every entry whose write did not land.

An entry is `refreshed` only if all of its writes landed (or it needed none); it is then in the
state a successful `refresh_content_for_work` leaves. A deferred entry has had nothing
published: at most an abandoned generation (as a lost single-row publication leaves) and, of a
partially landed entry, some of its snapshots - each of which a later refresh finds unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from media_usage_orchestration.media.fields import FieldDiscovery
from media_usage_orchestration.media.projection import (
    MAX_OCCURRENCE_MUTATION_UNITS,
    admits_outright,
    canonical_source_keys,
)
from media_usage_orchestration.media.snapshots import build_content_snapshots
from media_usage_orchestration.media.sources import ContentSource
from media_usage_orchestration.processing.work.content_reads import load_fields
from media_usage_orchestration.store.core.engine import Engine, read_transaction
from media_usage_orchestration.store.host.content import content_rows, load_revisions
from media_usage_orchestration.store.host.registry import collection_identity_exists
from media_usage_orchestration.store.sources.batch_writes import (
    BatchWriteResult,
    Publication,
    Removal,
    measure_generation_deletions,
    write_collection_batch,
)
from media_usage_orchestration.store.sources.rows import sources_by_key
from media_usage_orchestration.values.source_records import (
    CANONICAL_IDENTITY_VERSION,
    SOURCE_TYPE_CONTENT,
    SourceRow,
    projection_is_unchanged,
)

logger = logging.getLogger(__name__)

# The sources table's `source_version` is a 32-bit integer on PostgreSQL.
_INT32 = range(-(2**31), 2**31)


@dataclass(frozen=True)
class BatchRefreshResult:
    """Content ids refreshed in bulk, and those left to the per-item path."""

    refreshed: frozenset[str] = frozenset()
    deferred: frozenset[str] = frozenset()


@dataclass
class _EntryPlan:
    content_id: str
    keys: list[str]
    observed: dict[str, SourceRow]
    snapshots: tuple[ContentSource, ...] = ()
    publications: list[Publication] = field(default_factory=list)
    removals: list[Removal] = field(default_factory=list)

    @property
    def absent(self) -> list[SourceRow]:
        return [removal.expected for removal in self.removals]

    def landed(self, written: BatchWriteResult) -> bool:
        return all(
            item.source.source_key in written.published for item in self.publications
        ) and all(item.expected.source_key in written.removed for item in self.removals)


# Completes the work of the refreshed entries (their content ids), given the transaction the
# batch's writes commit in: a completion commits with the writes it reports.
Completion = Callable[[Any, frozenset[str]], None]


def refresh_contents_for_work(
    engine: Engine,
    collection_id: str,
    collection_slug: str,
    content_ids: Sequence[str],
    complete: Completion | None = None,
) -> BatchRefreshResult:
    """Bring the entries' canonical sources in line with their content rows in bulk, or defer
    them; `complete` runs in the writes' transaction with the entries refreshed. Never
    raises: a failure defers every entry it could concern."""
    if not collection_id:
        raise ValueError("Durable media usage work requires a collection identity")
    ids = list(dict.fromkeys(content_ids))
    try:
        plans = _plan(engine, collection_id, collection_slug, ids)
    except Exception:
        logger.exception("Batch media usage refresh of %s could not be planned", collection_slug)
        return BatchRefreshResult(deferred=frozenset(ids))

    def refreshed_by(written: BatchWriteResult) -> frozenset[str]:
        return frozenset(plan.content_id for plan in plans if plan.landed(written))

    def complete_refreshed(connection: Any, written: BatchWriteResult) -> None:
        complete(connection, refreshed_by(written))

    then = complete_refreshed if complete is not None else None
    written = _write(engine, collection_id, collection_slug, plans, then)
    if written is None:
        return BatchRefreshResult(deferred=frozenset(ids))
    refreshed = refreshed_by(written)
    return BatchRefreshResult(refreshed, frozenset(ids) - refreshed)


# --- planning -----------------------------------------------------------------------------------


def _plan(
    engine: Engine, collection_id: str, collection_slug: str, ids: list[str]
) -> list[_EntryPlan]:
    """Plans of the entries the batch can refresh outright (the others are simply absent).

    Two short reads, each ended before the Python work that follows it: the rows, then (once
    snapshots are built) the sizes of the generations about to be deleted. Nothing relies on
    the reads sharing a snapshot: every write re-asserts what was read in its own statement."""
    keys = {content_id: canonical_source_keys(collection_id, content_id) for content_id in ids}
    read = _read_batch(engine, collection_id, collection_slug, ids, keys)
    if read is None:
        return []
    plans = []
    for content_id in ids:
        entry = _Entry(collection_id, collection_slug, read.discovery, content_id, keys[content_id])
        plan = _plan_entry(entry, read.rows.get(content_id), read.revisions, read.observed)
        if plan is not None:
            plans.append(plan)
    absent = [source for plan in plans for source in plan.absent]
    measured = {}
    if absent:
        with read_transaction(engine) as connection:
            measured = measure_generation_deletions(
                connection, absent, MAX_OCCURRENCE_MUTATION_UNITS
            )
    return [
        plan
        for plan in plans
        if admits_outright(plan.snapshots, plan.observed, plan.keys, measured)
    ]


@dataclass(frozen=True)
class _BatchRows:
    observed: dict[str, SourceRow]
    discovery: FieldDiscovery
    rows: dict[str, dict[str, Any]]
    revisions: dict[str, dict[str, Any]]


def _read_batch(
    engine: Engine,
    collection_id: str,
    collection_slug: str,
    ids: list[str],
    keys: Mapping[str, list[str]],
) -> _BatchRows | None:
    """What the batch is planned from, in one read transaction; None when the collection
    identity is not current."""
    with read_transaction(engine) as connection:
        if not collection_identity_exists(connection, collection_id, collection_slug):
            return None
        observed = sources_by_key(connection, [key for each in keys.values() for key in each])
        discovery = load_fields(connection, collection_slug, collection_id)
        rows = content_rows(connection, collection_slug, collection_id, discovery, ids)
        revisions = load_revisions(connection, _draft_revision_ids(rows.values()))
    return _BatchRows(observed, discovery, rows, revisions)


def _draft_revision_ids(rows) -> list[str]:
    return [
        row["draft_revision_id"]
        for row in rows
        if isinstance(row.get("draft_revision_id"), str) and row["draft_revision_id"]
    ]


@dataclass(frozen=True)
class _Entry:
    collection_id: str
    collection_slug: str
    discovery: FieldDiscovery
    content_id: str
    keys: list[str]

    def owns(self, key: str, source: SourceRow) -> bool:
        """The observed row is this entry's canonical source for `key`, as the batch writes it;
        anything else (legacy or foreign rows under a canonical key) is for the per-item path."""
        return (
            source.source_type == SOURCE_TYPE_CONTENT
            and source.collection_id == self.collection_id
            and source.collection_slug == self.collection_slug
            and source.identity_version == CANONICAL_IDENTITY_VERSION
            and source.content_id == self.content_id
            and key.endswith(f":{source.source_variant}")
        )


def _plan_entry(
    entry: _Entry,
    row: Mapping[str, Any] | None,
    revisions: Mapping[str, Mapping[str, Any]],
    observed: Mapping[str, SourceRow],
) -> _EntryPlan | None:
    mine = {key: observed[key] for key in entry.keys if key in observed}
    if not all(entry.owns(key, source) for key, source in mine.items()):
        return None
    plan = _EntryPlan(entry.content_id, entry.keys, mine)
    if row is None:
        plan.removals = [
            Removal(source, absent_content_id=entry.content_id) for source in mine.values()
        ]
        return plan
    snapshots = _snapshots(entry, row, revisions)
    if snapshots is None:
        return None
    plan.snapshots = snapshots
    plan.publications = [
        Publication(snapshot, mine.get(snapshot.source_key))
        for snapshot in snapshots
        if not _is_unchanged(snapshot, mine.get(snapshot.source_key))
    ]
    published = frozenset(item.source.source_key for item in plan.publications)
    produced = {snapshot.source_key for snapshot in snapshots}
    plan.removals = [
        Removal(source, after=published) for key, source in mine.items() if key not in produced
    ]
    return plan


def _snapshots(
    entry: _Entry, row: Mapping[str, Any], revisions: Mapping[str, Mapping[str, Any]]
) -> tuple[ContentSource, ...] | None:
    revision = revisions.get(row.get("draft_revision_id") or "")
    try:
        result = build_content_snapshots(
            entry.collection_id, entry.collection_slug, entry.discovery, row, revision
        )
    except Exception:
        return None  # the per-item path reports it (CONTENT_USAGE_REFRESH_ERROR)
    if not result.success or not all(_bindable(snapshot) for snapshot in result.snapshots):
        return None
    return result.snapshots


def _is_unchanged(snapshot: ContentSource, expected: SourceRow | None) -> bool:
    return expected is not None and projection_is_unchanged(snapshot, expected)


def _bindable(snapshot: ContentSource) -> bool:
    """A version the guard can compare as the single-row statement binds it: a whole number
    of the column's range (anything else goes the per-item way, whatever it makes of it)."""
    version = snapshot.source_version
    return isinstance(version, int) and not isinstance(version, bool) and version in _INT32


# --- writing ------------------------------------------------------------------------------------


def _write(
    engine: Engine,
    collection_id: str,
    collection_slug: str,
    plans: Sequence[_EntryPlan],
    then: Callable[[Any, BatchWriteResult], None] | None,
) -> BatchWriteResult | None:
    """The plans' writes (and `then`, even with nothing to write); None when they failed:
    nothing of them landed, and their entries take the per-item path, which finds a
    projection landed by anybody else unchanged."""
    publications = [item for plan in plans for item in plan.publications]
    removals = [item for plan in plans for item in plan.removals]
    if not publications and not removals and then is None:
        return BatchWriteResult()
    try:
        return write_collection_batch(
            engine, collection_id, collection_slug, publications, removals, then
        )
    except Exception:
        logger.exception("Batch media usage write of %s failed", collection_slug)
        return None


__all__ = ["BatchRefreshResult", "refresh_contents_for_work"]
