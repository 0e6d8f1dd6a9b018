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

import contextlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Engine, and_, column, exists, func, literal, select, table

from ..media.fields import FieldDiscovery, MediaUsageFieldDiscoveryError
from ..media.snapshots import build_content_snapshots
from ..media.sources import CANONICAL_IDENTITY_VERSION, SOURCE_TYPE, ContentSource
from ..store.content import content_rows_query
from ..store.engine import is_postgres, read_transaction
from ..store.identifiers import content_table_name
from ..store.predicates import is_content_collection_status
from ..store.schema import collections, index_status, occurrences, revisions, sources, work
from ..store.source_rows import SourceRow
from .content_reads import load_fields

ENTRY_PAGE_SIZE = 200
COMPARED_SOURCE_COLUMNS = (
    "source_type",
    "collection_id",
    "collection_slug",
    "content_id",
    "source_variant",
    "locale",
    "translation_group",
    "content_slug",
    "content_title",
    "content_status",
    "content_scheduled_at",
    "content_deleted_at",
    "revision_id",
    "schema_version",
    "identity_version",
)
OCCURRENCE_COLUMNS = (
    "field_slug",
    "field_path",
    "occurrence_index",
    "reference_type",
    "media_id",
    "provider",
    "provider_asset_id",
    "media_kind",
    "mime_type",
)


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
    with _consistent_read(engine) as connection:
        for collection_id, slug in _captured_collections(connection, collection_slugs):
            check = _CollectionCheck(connection, collection_id, slug)
            summaries.append(check.run())
            differences.extend(check.differences)
    return VerifyReport(tuple(summaries), tuple(differences))


@contextlib.contextmanager
def _consistent_read(engine: Engine) -> Iterator[Connection]:
    """One snapshot for the whole comparison: PostgreSQL's READ COMMITTED would let pages see
    different states; a SQLite read transaction already is a snapshot."""
    if not is_postgres(engine):
        with read_transaction(engine) as connection:
            yield connection
        return
    with engine.connect() as connection:
        connection = connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            connection.exec_driver_sql("SET TRANSACTION READ ONLY")
            yield connection


def _captured_collections(
    connection: Connection, slugs: Sequence[str] | None
) -> list[tuple[str, str]]:
    statement = (
        select(collections.c.id, collections.c.slug)
        .join(
            index_status,
            and_(
                index_status.c.collection_id == collections.c.id,
                index_status.c.scope_key == collections.c.slug,
            ),
        )
        .where(is_content_collection_status(), index_status.c.capture_state == "active")
        .order_by(collections.c.slug)
    )
    if slugs:
        statement = statement.where(collections.c.slug.in_(list(slugs)))
    return [(row.id, row.slug) for row in connection.execute(statement)]


def _canonical_sources(collection_id: str):
    return and_(
        sources.c.source_type == SOURCE_TYPE,
        sources.c.collection_id == collection_id,
        sources.c.identity_version == CANONICAL_IDENTITY_VERSION,
    )


def _occurrence_values(row: Mapping[str, Any]) -> tuple:
    return tuple(row[name] for name in OCCURRENCE_COLUMNS)


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
        try:
            discovery = load_fields(self.connection, self.slug, self.collection_id)
        except MediaUsageFieldDiscoveryError as error:
            self.report(DriftKind.FIELD_DISCOVERY_FAILED, None, None, str(error))
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

    # -- reads ---------------------------------------------------------------------------------

    def entry_pages(self, discovery: FieldDiscovery) -> Iterator[list[dict[str, Any]]]:
        query, content = content_rows_query(self.slug, self.collection_id, discovery)
        cursor = None
        while True:
            page = query.order_by(content.c.id).limit(ENTRY_PAGE_SIZE)
            if cursor is not None:
                page = page.where(content.c.id > cursor)
            rows = [dict(row._mapping) for row in self.connection.execute(page)]
            if not rows:
                return
            yield rows
            cursor = rows[-1]["id"]

    def revisions_of(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        ids = sorted({row["draft_revision_id"] for row in rows if row.get("draft_revision_id")})
        if not ids:
            return {}
        statement = select(
            revisions.c.id, revisions.c.collection, revisions.c.entry_id, revisions.c.data
        ).where(revisions.c.id.in_(ids))
        return {row.id: dict(row._mapping) for row in self.connection.execute(statement)}

    def stored_sources(self, content_ids: Sequence[str]) -> dict[str, SourceRow]:
        statement = select(sources).where(
            _canonical_sources(self.collection_id), sources.c.content_id.in_(content_ids)
        )
        rows = self.connection.execute(statement)
        return {row.source_key: SourceRow.from_mapping(row._mapping) for row in rows}

    def stored_occurrences(self, content_ids: Sequence[str]) -> dict[str, Counter]:
        statement = (
            select(occurrences.c.source_key, *(occurrences.c[name] for name in OCCURRENCE_COLUMNS))
            .join(
                sources,
                and_(
                    sources.c.source_key == occurrences.c.source_key,
                    sources.c.current_generation == occurrences.c.generation,
                ),
            )
            .where(_canonical_sources(self.collection_id), sources.c.content_id.in_(content_ids))
        )
        found: dict[str, Counter] = {}
        for row in self.connection.execute(statement):
            found.setdefault(row.source_key, Counter())[_occurrence_values(row._mapping)] += 1
        return found

    # -- comparison ----------------------------------------------------------------------------

    def check_page(self, discovery: FieldDiscovery, rows: list[dict[str, Any]]) -> None:
        content_ids = [row["id"] for row in rows]
        revisions_by_id = self.revisions_of(rows)
        stored = self.stored_sources(content_ids)
        stored_items = self.stored_occurrences(content_ids)
        self.entry_count += len(rows)
        self.source_count += len(stored)
        for row in rows:
            revision = revisions_by_id.get(row.get("draft_revision_id") or "")
            result = build_content_snapshots(
                self.collection_id, self.slug, discovery, row, revision
            )
            entry_sources = {
                key: source for key, source in stored.items() if source.content_id == row["id"]
            }
            if not result.success:
                # Durable work cannot project this entry at all; its stored sources are moot.
                self.report(DriftKind.SNAPSHOT_FAILED, row["id"], None, str(result.error))
                continue
            self.check_entry(row["id"], result.snapshots, entry_sources, stored_items)

    def check_entry(
        self,
        content_id: str,
        snapshots: Sequence[ContentSource],
        stored: Mapping[str, SourceRow],
        stored_items: Mapping[str, Counter],
    ) -> None:
        expected = {snapshot.source_key: snapshot for snapshot in snapshots}
        for key, snapshot in expected.items():
            if key not in stored:
                self.report(DriftKind.MISSING_SOURCE, content_id, key, "no stored source")
                continue
            self.check_source(snapshot, stored[key])
            self.check_occurrences(snapshot, stored_items.get(key, Counter()))
        for key in stored.keys() - expected.keys():
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

    def check_sources_without_entry(self) -> None:
        content = table(content_table_name(self.slug), column("id")).alias("content")
        statement = (
            select(sources.c.source_key, sources.c.content_id)
            .where(
                _canonical_sources(self.collection_id),
                ~exists(
                    select(literal(1))
                    .select_from(content)
                    .where(content.c.id == sources.c.content_id)
                ),
            )
            .order_by(sources.c.source_key)
        )
        for row in self.connection.execute(statement):
            self.source_count += 1
            self.report(
                DriftKind.UNEXPECTED_SOURCE, row.content_id, row.source_key, "the entry is gone"
            )

    # -- counts --------------------------------------------------------------------------------

    def abandoned_occurrence_count(self) -> int:
        """Rows outside every current generation: of a canonical source's other generations,
        or under this collection's key prefix with no source row at all."""
        stale = (
            select(func.count())
            .select_from(occurrences)
            .join(sources, sources.c.source_key == occurrences.c.source_key)
            .where(
                _canonical_sources(self.collection_id),
                occurrences.c.generation != sources.c.current_generation,
            )
        )
        prefix = f"content:{self.collection_id}:"
        orphaned = (
            select(func.count())
            .select_from(occurrences)
            .where(
                func.substr(occurrences.c.source_key, 1, len(prefix)) == prefix,
                ~exists(
                    select(literal(1))
                    .select_from(sources)
                    .where(sources.c.source_key == occurrences.c.source_key)
                ),
            )
        )
        return sum(self.connection.execute(query).scalar_one() for query in (stale, orphaned))

    def pending_work_count(self) -> int:
        statement = (
            select(func.count()).select_from(work).where(work.c.collection_id == self.collection_id)
        )
        return self.connection.execute(statement).scalar_one()


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
    "VerifyReport",
    "verify_index",
]
