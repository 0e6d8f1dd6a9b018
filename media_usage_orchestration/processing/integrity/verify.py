"""The oracle: is the media usage index exactly what extraction computes from the content?

For every captured collection (capture `active`, bound to its registry identity) each entry's
canonical sources are recomputed with the same snapshot, extraction and fingerprint code the
work processor uses, and compared with the stored canonical sources (`identity_version = 1`)
and the occurrences of their `current_generation`. Everything is read in one consistent
snapshot, page by page.

Not drift: occurrence rows of other generations (abandoned by a lost publication, or replaced,
awaiting the projection GC) - they are only counted - and a source whose `source_updated_at` /
`source_version` lag behind the entry, since an edit that changes nothing projected is a no-op.
Pending work is reported alongside: while it exists, differences are expected.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from media_usage_orchestration.media.extraction import OCCURRENCE_COLUMNS
from media_usage_orchestration.media.fields import FieldDiscovery
from media_usage_orchestration.media.snapshots import SnapshotResult, build_content_snapshots
from media_usage_orchestration.media.sources import SOURCE_COLUMNS, ContentSource
from media_usage_orchestration.processing.work.content_reads import load_fields
from media_usage_orchestration.store.core.engine import Connection, Engine
from media_usage_orchestration.store.host.content import content_rows_query
from media_usage_orchestration.store.reads import audit
from media_usage_orchestration.store.reconciliation.records import PROCESSING_FAILED_CODE
from media_usage_orchestration.values.errors import (
    InvalidIdentifierError,
    MediaUsageFieldDiscoveryError,
)
from media_usage_orchestration.values.source_records import SourceRow

ENTRY_PAGE_SIZE = 200
# Compared column by column: every descriptive column of a source but its key (sources are
# matched by it), its fingerprint (a drift kind of its own), and the entry's version and time,
# which may lag behind (not drift: see above).
_NOT_COMPARED = frozenset(
    {"source_key", "source_fingerprint", "source_updated_at", "source_version"}
)
COMPARED_SOURCE_COLUMNS = tuple(name for name in SOURCE_COLUMNS if name not in _NOT_COMPARED)


class DriftKind(StrEnum):
    MISSING_SOURCE = "missing_source"
    UNEXPECTED_SOURCE = "unexpected_source"
    FINGERPRINT_MISMATCH = "fingerprint_mismatch"
    COLUMN_MISMATCH = "column_mismatch"
    MISSING_OCCURRENCE = "missing_occurrence"
    UNEXPECTED_OCCURRENCE = "unexpected_occurrence"
    SNAPSHOT_FAILED = "snapshot_failed"
    FIELD_DISCOVERY_FAILED = "field_discovery_failed"


@dataclass(frozen=True)
class Difference:
    kind: DriftKind
    collection_slug: str
    content_id: str | None
    source_key: str | None
    detail: str


@dataclass(frozen=True)
class CollectionSummary:
    collection_id: str
    collection_slug: str
    entry_count: int
    source_count: int
    abandoned_occurrence_count: int
    pending_work_count: int


@dataclass(frozen=True)
class VerifyReport:
    collections: tuple[CollectionSummary, ...]
    differences: tuple[Difference, ...]

    @property
    def has_drift(self) -> bool:
        return bool(self.differences)

    @property
    def abandoned_occurrence_count(self) -> int:
        return sum(summary.abandoned_occurrence_count for summary in self.collections)

    @property
    def pending_work_count(self) -> int:
        return sum(summary.pending_work_count for summary in self.collections)

    def count(self, kind: DriftKind) -> int:
        return sum(1 for difference in self.differences if difference.kind is kind)


def verify_index(engine: Engine, collection_slugs: Sequence[str] | None = None) -> VerifyReport:
    """Compare the stored index of every captured collection (or of `collection_slugs`) with
    the content."""
    summaries: list[CollectionSummary] = []
    differences: list[Difference] = []
    with audit.snapshot_read_transaction(engine) as connection:
        for collection_id, slug in audit.captured_collections(connection, collection_slugs):
            check = _CollectionCheck(connection, collection_id, slug)
            summaries.append(check.run())
            differences.extend(check.differences)
    return VerifyReport(tuple(summaries), tuple(differences))


def _occurrence_values(row: Mapping[str, Any]) -> tuple:
    return tuple(row[name] for name in OCCURRENCE_COLUMNS)


# --- one entry: what verify and the scrubber both compare -------------------------------------


@dataclass(frozen=True)
class StoredIndex:
    """What the index holds for some entries of one collection: their canonical sources (by
    key), the occurrences of those sources' current generations (by key), and the entries'
    draft revisions (by id)."""

    sources: Mapping[str, SourceRow]
    occurrences: Mapping[str, Counter]
    revisions: Mapping[str, dict[str, Any]]

    def sources_of(self, content_id: str) -> dict[str, SourceRow]:
        return dict(self._sources_by_entry.get(content_id, {}))

    @functools.cached_property
    def _sources_by_entry(self) -> dict[str | None, dict[str, SourceRow]]:
        by_entry: dict[str | None, dict[str, SourceRow]] = {}
        for key, source in self.sources.items():
            by_entry.setdefault(source.content_id, {})[key] = source
        return by_entry

    def revision_of(self, row: Mapping[str, Any]) -> dict[str, Any] | None:
        return self.revisions.get(row.get("draft_revision_id") or "")


def read_stored_index(
    connection: Connection, collection_id: str, rows: Sequence[Mapping[str, Any]]
) -> StoredIndex:
    """The stored index of these content rows, read in the caller's transaction."""
    content_ids = [row["id"] for row in rows]
    stored = audit.canonical_source_rows(connection, collection_id, content_ids)
    items: dict[str, Counter] = {}
    for row in audit.current_occurrence_rows(
        connection, collection_id, content_ids, OCCURRENCE_COLUMNS
    ):
        items.setdefault(row["source_key"], Counter())[_occurrence_values(row)] += 1
    revision_ids = sorted(
        {row["draft_revision_id"] for row in rows if row.get("draft_revision_id")}
    )
    revisions = audit.revisions_by_id(connection, revision_ids) if revision_ids else {}
    return StoredIndex(
        {row["source_key"]: SourceRow.from_row(row) for row in stored}, items, revisions
    )


def entry_differences(
    collection_id: str,
    slug: str,
    discovery: FieldDiscovery,
    row: Mapping[str, Any],
    stored: StoredIndex,
) -> list[Difference]:
    """How one entry's stored index differs from what extraction computes from its row."""
    comparison = _EntryComparison(collection_id, slug)
    comparison.run(discovery, row, stored)
    return comparison.differences


class _EntryComparison:
    def __init__(self, collection_id: str, slug: str) -> None:
        self.collection_id = collection_id
        self.slug = slug
        self.differences: list[Difference] = []

    def report(self, kind: DriftKind, content_id, source_key, detail: str) -> None:
        self.differences.append(Difference(kind, self.slug, content_id, source_key, detail))

    def run(self, discovery: FieldDiscovery, row: Mapping[str, Any], stored: StoredIndex) -> None:
        result = self.snapshots_of(discovery, row, stored.revision_of(row))
        if result is None:
            return
        if not result.success:
            # Durable work cannot project this entry at all; its stored sources are moot.
            self.report(DriftKind.SNAPSHOT_FAILED, row["id"], None, str(result.error))
            return
        self.check_entry(row["id"], result.snapshots, stored.sources_of(row["id"]), stored)

    def snapshots_of(
        self, discovery: FieldDiscovery, row: Mapping[str, Any], revision
    ) -> SnapshotResult | None:
        """The entry's snapshots; None (reported) when building them fails, as durable work
        would fail it, so one entry cannot stop the check of the others."""
        try:
            return build_content_snapshots(self.collection_id, self.slug, discovery, row, revision)
        except Exception as error:  # any fault in pure code is this entry's, not the run's
            detail = f"{PROCESSING_FAILED_CODE}: {type(error).__name__}: {error}"
            self.report(DriftKind.SNAPSHOT_FAILED, row["id"], None, detail)
            return None

    def check_entry(
        self,
        content_id: str,
        snapshots: Sequence[ContentSource],
        entry_sources: Mapping[str, SourceRow],
        stored: StoredIndex,
    ) -> None:
        expected = {snapshot.source_key: snapshot for snapshot in snapshots}
        for key, snapshot in expected.items():
            if key not in entry_sources:
                self.report(DriftKind.MISSING_SOURCE, content_id, key, "no stored source")
                continue
            self.check_source(snapshot, entry_sources[key])
            self.check_occurrences(snapshot, stored.occurrences.get(key, Counter()))
        for key in entry_sources.keys() - expected.keys():
            self.report(
                DriftKind.UNEXPECTED_SOURCE, content_id, key, "the entry no longer produces it"
            )

    def check_source(self, snapshot: ContentSource, stored: SourceRow) -> None:
        content_id, key = snapshot.content_id, snapshot.source_key
        if stored.source_fingerprint != snapshot.source_fingerprint:
            self.report(
                DriftKind.FINGERPRINT_MISMATCH,
                content_id,
                key,
                f"stored {stored.source_fingerprint}, computed {snapshot.source_fingerprint}",
            )
        wanted = snapshot.row_values()
        for name in COMPARED_SOURCE_COLUMNS:
            if getattr(stored, name) != wanted[name]:
                self.report(
                    DriftKind.COLUMN_MISMATCH,
                    content_id,
                    key,
                    f"{name}: stored {getattr(stored, name)!r}, computed {wanted[name]!r}",
                )
        if stored.source_completeness != "complete" or stored.last_error_code is not None:
            self.report(
                DriftKind.COLUMN_MISMATCH,
                content_id,
                key,
                f"completeness {stored.source_completeness!r}, error {stored.last_error_code!r}",
            )

    def check_occurrences(self, snapshot: ContentSource, stored: Counter) -> None:
        expected = Counter(
            _occurrence_values(occurrence.row_values()) for occurrence in snapshot.occurrences
        )
        for values in (expected - stored).elements():
            self.report(
                DriftKind.MISSING_OCCURRENCE,
                snapshot.content_id,
                snapshot.source_key,
                _describe_occurrence(values),
            )
        for values in (stored - expected).elements():
            self.report(
                DriftKind.UNEXPECTED_OCCURRENCE,
                snapshot.content_id,
                snapshot.source_key,
                _describe_occurrence(values),
            )


# --- one collection ---------------------------------------------------------------------------


def discover_fields(
    connection: Connection, collection_id: str, slug: str
) -> FieldDiscovery | Difference:
    """The collection's field discovery, or the difference saying why the work path cannot
    discover its fields (and so fails every entry)."""
    try:
        return load_fields(connection, slug, collection_id)
    except MediaUsageFieldDiscoveryError as error:
        detail = f"{error.code}: {error}"
    except InvalidIdentifierError as error:
        # A registry or field row the CMS would refuse; the work path fails it the same way.
        detail = f"{PROCESSING_FAILED_CODE}: {error}"
    return Difference(DriftKind.FIELD_DISCOVERY_FAILED, slug, None, None, detail)


class _CollectionCheck:
    """One collection: pages of entries, then sources whose entry is gone, then counts."""

    def __init__(self, connection: Connection, collection_id: str, slug: str) -> None:
        self.connection = connection
        self.collection_id = collection_id
        self.slug = slug
        self.differences: list[Difference] = []
        self.entry_count = 0
        self.source_count = 0

    def report(self, kind: DriftKind, content_id, source_key, detail: str) -> None:
        self.differences.append(Difference(kind, self.slug, content_id, source_key, detail))

    def run(self) -> CollectionSummary:
        discovery = discover_fields(self.connection, self.collection_id, self.slug)
        if isinstance(discovery, Difference):
            self.differences.append(discovery)
        else:
            for rows in self.entry_pages(discovery):
                self.check_page(discovery, rows)
            self.check_sources_without_entry()
        return CollectionSummary(
            self.collection_id,
            self.slug,
            self.entry_count,
            self.source_count,
            self.abandoned_occurrence_count(),
            self.pending_work_count(),
        )

    def entry_pages(self, discovery: FieldDiscovery) -> Iterator[list[dict[str, Any]]]:
        query, content = content_rows_query(self.slug, self.collection_id, discovery)
        return audit.row_pages(self.connection, query, content.c.id, ENTRY_PAGE_SIZE)

    def check_page(self, discovery: FieldDiscovery, rows: list[dict[str, Any]]) -> None:
        stored = read_stored_index(self.connection, self.collection_id, rows)
        self.entry_count += len(rows)
        self.source_count += len(stored.sources)
        for row in rows:
            self.differences.extend(
                entry_differences(self.collection_id, self.slug, discovery, row, stored)
            )

    def check_sources_without_entry(self) -> None:
        gone = audit.canonical_sources_without_entry(self.connection, self.collection_id, self.slug)
        for source_key, content_id in gone:
            self.source_count += 1
            self.report(DriftKind.UNEXPECTED_SOURCE, content_id, source_key, "the entry is gone")

    # -- counts --------------------------------------------------------------------------------

    def abandoned_occurrence_count(self) -> int:
        return audit.abandoned_occurrence_count(self.connection, self.collection_id)

    def pending_work_count(self) -> int:
        return audit.work_count(self.connection, self.collection_id)


def _describe_occurrence(values: tuple) -> str:
    item = dict(zip(OCCURRENCE_COLUMNS, values, strict=True))
    return (
        f"{item['field_path']} {item['reference_type']} "
        f"{item['provider']}:{item['provider_asset_id']}"
    )


__all__ = [
    "CollectionSummary",
    "Difference",
    "DriftKind",
    "StoredIndex",
    "VerifyReport",
    "discover_fields",
    "entry_differences",
    "read_stored_index",
    "verify_index",
]
