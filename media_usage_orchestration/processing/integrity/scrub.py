"""The scrubber: the media usage index checked against the content continuously, a slice at a
time, Dagster-free.

Each `scrub_tick` (one sensor tick) compares the next slice of one collection's entries (at most
`ScrubLimits.entries`, within `ScrubLimits.seconds`) with what extraction computes from them,
using verify's own per-entry comparison (`verify.entry_differences`), and returns where the next
tick goes on (`ScrubPosition`, which the caller keeps: the sensor's cursor). A collection's
entries are walked in id order, one sweep after another; when a sweep ends the next tick starts
on the next collection by slug, so every collection is swept in turn.

Only collections whose coverage is complete are scrubbed (`usage.coverage_status`, the rule the
usage route uses): elsewhere differences are expected and a reconciliation or the work is on
them. A sweep whose collection stops being complete (an edit, or a heal, makes it stale until
the work catches up) waits for it up to `MAX_PAUSED_TICKS` ticks, then moves on.

A difference counts only once confirmed. Entries with open work (pending, leased, retrying) are
skipped: their index lags on purpose. An entry that differs is read again in a new snapshot:
its content row must be unchanged (an edit in flight changes it, and its capture trigger opens
work), no open work may have appeared, and the difference must still be there. A confirmed
difference is healed through the operator's retry of the entry's work (lease-guarded; it creates
the work row when there is none), which the work path then processes. Where the stored source's
fingerprint still matches the content (an occurrence or a column changed behind the write
protocol's back) the work would find the source unchanged and skip it, so the scrubber first
withdraws that exact row's trust (`SourceRepository.withdraw_trust`). It never writes sources'
columns or occurrences itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from media_usage_orchestration.media.fields import FieldDiscovery
from media_usage_orchestration.processing.integrity.verify import (
    Difference,
    DriftKind,
    discover_fields,
    entry_differences,
    read_stored_index,
)
from media_usage_orchestration.processing.loop.run_loop import Budget
from media_usage_orchestration.processing.operator.actions import retry_entry_work
from media_usage_orchestration.processing.operator.usage import coverage_status
from media_usage_orchestration.store.core.engine import Connection, Engine, read_transaction
from media_usage_orchestration.store.host.content import content_rows, content_rows_query
from media_usage_orchestration.store.host.registry import RegisteredCollection
from media_usage_orchestration.store.reads import audit
from media_usage_orchestration.store.sources.usage import CoverageScope
from media_usage_orchestration.store.sources.writes import SourceRepository
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome
from media_usage_orchestration.values.source_records import SourceRow

SLICE_ENTRIES = 300
SLICE_SECONDS = 2.0
# Ticks a sweep waits for its collection's coverage to be complete again before moving on.
MAX_PAUSED_TICKS = 10
POSITION_VERSION = 1
# Differences the work path cannot see by itself: the source's fingerprint still matches.
_BEHIND_THE_FINGERPRINT = frozenset(
    {DriftKind.MISSING_OCCURRENCE, DriftKind.UNEXPECTED_OCCURRENCE, DriftKind.COLUMN_MISMATCH}
)


@dataclass(frozen=True)
class ScrubLimits:
    entries: int = SLICE_ENTRIES
    seconds: float = SLICE_SECONDS


# --- the position (the sensor's cursor) -------------------------------------------------------


@dataclass(frozen=True)
class ScrubPosition:
    """Where the scrubber is: the collection, the last entry handled in its sweep (None: none
    yet), when the sweep started (database time) and what it found so far. `done`: the sweep
    ended, the next tick starts on the next collection."""

    collection_id: str | None = None
    collection_slug: str | None = None
    after: str | None = None
    sweep_started_at: str | None = None
    entries_seen: int = 0
    entries_checked: int = 0
    entries_skipped: int = 0
    differences: int = 0
    healed: int = 0
    paused_ticks: int = 0
    done: bool = False

    @property
    def sweeping(self) -> bool:
        return self.sweep_started_at is not None and not self.done

    def to_cursor(self) -> str:
        return json.dumps({"v": POSITION_VERSION, **asdict(self)}, sort_keys=True)


_TEXT_FIELDS = frozenset({"collection_id", "collection_slug", "after", "sweep_started_at"})
_FLAG_FIELDS = frozenset({"done"})


def _valid_field(name: str, value: object) -> bool:
    if name in _TEXT_FIELDS:
        return value is None or isinstance(value, str)
    if name in _FLAG_FIELDS:
        return isinstance(value, bool)
    # A count: a whole number, not a flag (a bool is an int in Python).
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_FIELD_NAMES = frozenset(spec.name for spec in fields(ScrubPosition))


def parse_position(cursor: str | None) -> ScrubPosition | None:
    """The position a cursor holds; a fresh one without a cursor; None when the cursor is not
    one this version wrote (the caller starts afresh and says so)."""
    if cursor is None:
        return ScrubPosition()
    try:
        data = json.loads(cursor)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.pop("v", None) != POSITION_VERSION:
        return None
    if data.keys() != _FIELD_NAMES:
        return None
    if not all(_valid_field(name, value) for name, value in data.items()):
        return None
    return ScrubPosition(**data)


# --- which collection a tick scrubs -----------------------------------------------------------


@dataclass(frozen=True)
class CollectionState:
    collection_id: str
    collection_slug: str
    complete: bool


@dataclass(frozen=True)
class Paused:
    """The sweep's collection is not complete now: the tick scrubs nothing and waits."""

    position: ScrubPosition


def plan_tick(
    position: ScrubPosition, collections: Sequence[CollectionState]
) -> ScrubPosition | Paused | None:
    """Where this tick scrubs (a position to go on from, or a new sweep's), or a pause, or
    None when no collection's coverage is complete. `collections` are the captured ones."""
    current = next((c for c in collections if c.collection_id == position.collection_id), None)
    if current is not None and position.sweeping:
        if current.complete:
            return replace(position, paused_ticks=0)
        if position.paused_ticks < MAX_PAUSED_TICKS:
            return Paused(replace(position, paused_ticks=position.paused_ticks + 1))
    complete = sorted((c for c in collections if c.complete), key=lambda c: c.collection_slug)
    if not complete:
        return None
    slug = position.collection_slug
    following = [c for c in complete if slug is None or c.collection_slug > slug]
    chosen = (following or complete)[0]
    return ScrubPosition(chosen.collection_id, chosen.collection_slug)


# --- a slice ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heal:
    """One entry's heal: the operator retry's outcome and the sources whose trust it withdrew."""

    content_id: str
    outcome: OperatorRetryOutcome
    changed: bool
    trust_withdrawn: tuple[str, ...] = ()

    @property
    def reopened(self) -> bool:
        """Work is pending for the entry now (reopened, created, or already pending)."""
        return self.outcome is OperatorRetryOutcome.PENDING


@dataclass
class SliceReport:
    """What one slice did: the last entry it handled, its counts, the differences it confirmed
    (each entry's, as verify reports them) and their heals, and whether the walk reached the end
    of the collection."""

    collection: RegisteredCollection
    read_at: str
    after: str | None
    entries_seen: int = 0
    entries_checked: int = 0
    entries_skipped: int = 0
    unconfirmed: int = 0
    confirmed: list[Difference] = field(default_factory=list)
    heals: list[Heal] = field(default_factory=list)
    reached_end: bool = False

    @property
    def healed(self) -> int:
        return sum(1 for heal in self.heals if heal.reopened)


def keys_the_work_would_skip(differences: Sequence[Difference]) -> set[str]:
    """Source keys whose differences leave the fingerprint matching, so a refresh would find
    the stored source unchanged and leave it as it is."""
    mismatched = {d.source_key for d in differences if d.kind is DriftKind.FINGERPRINT_MISMATCH}
    return {
        d.source_key
        for d in differences
        if d.kind in _BEHIND_THE_FINGERPRINT and d.source_key is not None
    } - mismatched


@dataclass(frozen=True)
class _SliceRead:
    discovery: FieldDiscovery
    rows: list[dict[str, Any]]
    open_work: set[str]
    gone: list[str]  # content ids of gone entries that still have canonical sources


def _read_slice(
    connection: Connection,
    collection: RegisteredCollection,
    discovery: FieldDiscovery,
    after: str | None,
    limit: int,
) -> _SliceRead:
    query, content = content_rows_query(collection.slug, collection.id, discovery)
    rows = audit.rows_after(connection, query, content.c.id, after, limit)
    through = rows[-1]["id"] if len(rows) == limit else None
    gone_sources = audit.canonical_sources_without_entry(
        connection, collection.id, collection.slug, after, through
    )
    gone = sorted({content_id for _, content_id in gone_sources})
    ids = [row["id"] for row in rows] + gone
    open_work = audit.entries_with_open_work(connection, collection.id, ids)
    return _SliceRead(discovery, rows, open_work, gone)


def scrub_slice(
    engine: Engine, collection: RegisteredCollection, after: str | None, limits: ScrubLimits
) -> SliceReport:
    """Compare the entries after `after` (at most `limits.entries`, within `limits.seconds`),
    then the sources in that range whose entry is gone; confirm and heal what differs."""
    budget = Budget(max_seconds=limits.seconds, guaranteed_steps=1)
    with audit.snapshot_read_transaction(engine) as connection:
        read_at = audit.database_now(connection)
        discovery = discover_fields(connection, collection.id, collection.slug)
        if isinstance(discovery, FieldDiscovery):
            read = _read_slice(connection, collection, discovery, after, limits.entries)
            stored = read_stored_index(connection, collection.id, read.rows)
    report = SliceReport(collection, read_at, after)
    if not isinstance(discovery, FieldDiscovery):
        _report_unreadable_fields(engine, report, discovery)
        return report
    report.reached_end = len(read.rows) < limits.entries
    for row in read.rows:
        if not budget.spend():
            report.reached_end = False
            break
        report.after = row["id"]
        report.entries_seen += 1
        if row["id"] in read.open_work:
            report.entries_skipped += 1
            continue
        report.entries_checked += 1
        if entry_differences(collection.id, collection.slug, discovery, row, stored):
            _confirm_and_heal(engine, report, discovery, row)
    # The gone entries of the slice's whole range, even when the budget ended the walk early:
    # ids are only ever compared in SQL (in the database's collation). One handled again by the
    # next slice has open work by then, or no sources left. At least one a tick, more while the
    # budget lasts; those left over come up again in the next sweep.
    handled = 0
    for content_id in read.gone:
        if handled and budget.exhausted():
            break
        if content_id not in read.open_work:
            handled += 1
            _confirm_and_heal_gone(engine, report, content_id)
    return report


def _report_unreadable_fields(engine: Engine, report: SliceReport, first: Difference) -> None:
    """Fields the work path cannot discover fail every entry: confirmed if a second read
    fails too; nothing to heal entry by entry. The sweep ends."""
    collection = report.collection
    with read_transaction(engine) as connection:
        again = discover_fields(connection, collection.id, collection.slug)
    if isinstance(again, Difference):
        report.confirmed.append(first)
    else:
        report.unconfirmed += 1
    report.reached_end = True


# --- confirmation and heal --------------------------------------------------------------------


@dataclass(frozen=True)
class Confirmation:
    differences: list[Difference]
    sources: Mapping[str, SourceRow]


def confirm_entry(
    engine: Engine,
    collection: RegisteredCollection,
    discovery: FieldDiscovery,
    first: Mapping[str, Any],
) -> Confirmation | None:
    """The entry's differences read again in a new snapshot, or None when they no longer
    count: its fields or content row changed since the first read, or open work appeared (an
    edit in flight), or the index now matches."""
    content_id = first["id"]
    with audit.snapshot_read_transaction(engine) as connection:
        if discover_fields(connection, collection.id, collection.slug) != discovery:
            return None
        row = content_rows(connection, collection.slug, collection.id, discovery, [content_id])
        if row.get(content_id) != first:
            return None
        if audit.entries_with_open_work(connection, collection.id, [content_id]):
            return None
        stored = read_stored_index(connection, collection.id, [first])
    differences = entry_differences(collection.id, collection.slug, discovery, first, stored)
    return Confirmation(differences, stored.sources_of(content_id)) if differences else None


def confirm_gone_entry(
    engine: Engine, collection: RegisteredCollection, content_id: str
) -> list[Difference]:
    """The canonical sources of a gone entry, read again: none when the entry is back, open
    work appeared, or its sources are gone too."""
    with audit.snapshot_read_transaction(engine) as connection:
        gone = audit.canonical_sources_without_entry(
            connection, collection.id, collection.slug, through=content_id
        )
        keys = [key for key, gone_id in gone if gone_id == content_id]
        if not keys or audit.entries_with_open_work(connection, collection.id, [content_id]):
            return []
    return [
        Difference(
            DriftKind.UNEXPECTED_SOURCE, collection.slug, content_id, key, "the entry is gone"
        )
        for key in keys
    ]


def _confirm_and_heal(
    engine: Engine, report: SliceReport, discovery: FieldDiscovery, row: Mapping[str, Any]
) -> None:
    confirmation = confirm_entry(engine, report.collection, discovery, row)
    if confirmation is None:
        report.unconfirmed += 1
        return
    report.confirmed.extend(confirmation.differences)
    report.heals.append(
        heal_entry(
            engine, report.collection, row["id"], confirmation.differences, confirmation.sources
        )
    )


def _confirm_and_heal_gone(engine: Engine, report: SliceReport, content_id: str) -> None:
    differences = confirm_gone_entry(engine, report.collection, content_id)
    if not differences:
        report.unconfirmed += 1
        return
    report.confirmed.extend(differences)
    report.heals.append(heal_entry(engine, report.collection, content_id, differences, {}))


def heal_entry(
    engine: Engine,
    collection: RegisteredCollection,
    content_id: str,
    differences: Sequence[Difference],
    stored: Mapping[str, SourceRow],
) -> Heal:
    """Reopen the entry's work through the operator retry, after withdrawing the trust of the
    sources the work would otherwise leave as they are."""
    repository = SourceRepository(engine)
    withdrawn = tuple(
        key
        for key in sorted(keys_the_work_would_skip(differences))
        if key in stored and repository.withdraw_trust(stored[key])
    )
    retried = retry_entry_work(engine, collection.id, content_id)
    return Heal(content_id, retried.outcome, retried.changed, withdrawn)


# --- a tick -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepSummary:
    """A finished sweep of one collection."""

    collection_id: str
    collection_slug: str
    started_at: str
    finished_at: str
    entries_seen: int
    entries_checked: int
    entries_skipped: int
    differences: int
    healed: int


def advance(
    position: ScrubPosition, report: SliceReport
) -> tuple[ScrubPosition, SweepSummary | None]:
    """The position after a slice, and the sweep it finished, if it did."""
    moved = replace(
        position,
        after=report.after,
        sweep_started_at=position.sweep_started_at or report.read_at,
        entries_seen=position.entries_seen + report.entries_seen,
        entries_checked=position.entries_checked + report.entries_checked,
        entries_skipped=position.entries_skipped + report.entries_skipped,
        differences=position.differences + len(report.confirmed),
        healed=position.healed + report.healed,
        paused_ticks=0,
    )
    if not report.reached_end:
        return moved, None
    summary = SweepSummary(
        report.collection.id,
        report.collection.slug,
        moved.sweep_started_at or report.read_at,
        report.read_at,
        moved.entries_seen,
        moved.entries_checked,
        moved.entries_skipped,
        moved.differences,
        moved.healed,
    )
    return replace(moved, done=True), summary


@dataclass(frozen=True)
class ScrubTick:
    """What a tick did: the position to keep, the slice it compared (None when it compared
    nothing), the sweep it finished, and in words why it compared nothing."""

    position: ScrubPosition
    slice: SliceReport | None = None
    sweep: SweepSummary | None = None
    idle_reason: str | None = None

    @property
    def has_findings(self) -> bool:
        """Worth reporting: the tick confirmed differences or finished a sweep."""
        return self.slice is not None and bool(self.slice.confirmed or self.sweep)


def _is_complete(coverage: audit.CapturedCoverage) -> bool:
    scope = CoverageScope(
        coverage.collection_slug,
        coverage.status,
        coverage.schema_version,
        coverage.reconciliation_required,
        pending_work=0,  # coverage_status reads only the status row's fields
        failed_work=0,
    )
    return coverage_status(scope) == "complete"


def collection_states(engine: Engine) -> list[CollectionState]:
    """Every captured collection, by slug, and whether its coverage is complete."""
    with read_transaction(engine) as connection:
        captured = audit.captured_coverage(connection)
    return [CollectionState(c.collection_id, c.collection_slug, _is_complete(c)) for c in captured]


def scrub_tick(
    engine: Engine, position: ScrubPosition, limits: ScrubLimits = ScrubLimits()
) -> ScrubTick:
    """One tick: the next slice of the collection `position` is on (or of the next one)."""
    plan = plan_tick(position, collection_states(engine))
    if plan is None:
        return ScrubTick(position, idle_reason="no captured collection's coverage is complete")
    if isinstance(plan, Paused):
        slug = plan.position.collection_slug
        reason = (
            f"the sweep of {slug} waits for its coverage to be complete again "
            f"({plan.position.paused_ticks} of {MAX_PAUSED_TICKS} ticks)"
        )
        return ScrubTick(plan.position, idle_reason=reason)
    collection = RegisteredCollection(plan.collection_id, plan.collection_slug)
    report = scrub_slice(engine, collection, plan.after, limits)
    moved, sweep = advance(plan, report)
    return ScrubTick(moved, report, sweep)


__all__ = [
    "MAX_PAUSED_TICKS",
    "SLICE_ENTRIES",
    "SLICE_SECONDS",
    "CollectionState",
    "Heal",
    "Paused",
    "ScrubLimits",
    "ScrubPosition",
    "ScrubTick",
    "SliceReport",
    "SweepSummary",
    "advance",
    "confirm_entry",
    "confirm_gone_entry",
    "heal_entry",
    "keys_the_work_would_skip",
    "parse_position",
    "plan_tick",
    "scrub_slice",
    "scrub_tick",
]
