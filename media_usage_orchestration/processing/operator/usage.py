"""Where is this media used? (EmDash's `GET /_emdash/api/media/[id]/usage`), and which media
is used nowhere, Dagster-free.

"Not used" is only ever claimed when coverage allows it: every collection's index complete,
current with the schema, and without pending or failed work. The index covers media
references in content fields only (image and file fields, portable text images, repeaters);
bylines, SEO images, sections and settings are not indexed, so "unused" means "not referenced
by any content field".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from media_usage_orchestration.media.sources import (
    COLUMNS,
    CONTENT_SOURCE_SCHEMA_VERSION,
    DRAFT_OVERLAY,
)
from media_usage_orchestration.processing.operator.actions import listing_limit
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.sources.usage import (
    CoverageScope,
    MediaItem,
    MediaReference,
    MediaSummary,
    UsageRepository,
    UsageRow,
)
from media_usage_orchestration.values.cursors import PageCursor, decode_cursor, encode_cursor
from media_usage_orchestration.values.errors import (
    CoverageIncomplete,
    InvalidCursorError,
    OperatorInputError,
)

DEFAULT_USAGE_LIMIT = 50
MEDIA_CURSOR_ORDER = "media"
MAX_ID_LENGTH = 2048
NOT_INDEXED = (
    "references outside content fields (bylines, SEO images, sections, settings) are not indexed"
)
REFERENCE_TYPES = ("image_field", "file_field", "portable_text_image")
VARIANT_LABELS = {COLUMNS: "published", DRAFT_OVERLAY: "draft"}


def coverage_status(scope: CoverageScope) -> str:
    """EmDash's `normalizeMediaUsageCoverageStatus`."""
    if scope.status is None:
        return "never"
    if scope.status == "complete":
        current = scope.schema_version == CONTENT_SOURCE_SCHEMA_VERSION
        return "complete" if current and not scope.reconciliation_required else "stale"
    if scope.status in ("never", "running", "partial", "failed", "stale"):
        return scope.status
    return "unknown"


def aggregate_coverage(statuses: Sequence[str]) -> str:
    """EmDash's `aggregateMediaUsageCoverageStatus` over every content collection."""
    if all(status == "complete" for status in statuses):
        return "complete"
    for status in ("unknown", "running", "stale", "partial"):
        if status in statuses:
            return status
    if all(status == "never" for status in statuses):
        return "never"
    if all(status == "failed" for status in statuses):
        return "failed"
    return "partial"


@dataclass(frozen=True)
class CollectionCoverageView:
    collection: str
    coverage: str
    pending_work: int
    failed_work: int

    @property
    def proves_absence(self) -> bool:
        return self.coverage == "complete" and self.pending_work == 0 and self.failed_work == 0


@dataclass(frozen=True)
class Coverage:
    status: str
    collections: tuple[CollectionCoverageView, ...]
    scope: str = "all_content_collections"

    @property
    def proves_absence(self) -> bool:
        return all(view.proves_absence for view in self.collections)

    @property
    def incomplete(self) -> tuple[CollectionCoverageView, ...]:
        return tuple(view for view in self.collections if not view.proves_absence)


def read_coverage(repository: UsageRepository) -> Coverage:
    views = tuple(
        CollectionCoverageView(
            scope.collection_slug, coverage_status(scope), scope.pending_work, scope.failed_work
        )
        for scope in repository.coverage_scopes()
    )
    return Coverage(aggregate_coverage([view.coverage for view in views]), views)


@dataclass(frozen=True)
class OccurrenceView:
    field_slug: str
    field_path: str
    occurrence_index: int
    reference_type: str


@dataclass(frozen=True)
class SourceView:
    variant: str
    occurrences: tuple[OccurrenceView, ...]

    @property
    def label(self) -> str:
        return VARIANT_LABELS.get(self.variant, self.variant)


@dataclass(frozen=True)
class EntryUsage:
    collection: str
    content_id: str
    title: str | None
    slug: str | None
    locale: str | None
    status: str | None
    scheduled_at: str | None
    deleted_at: str | None
    sources: tuple[SourceView, ...]


@dataclass(frozen=True)
class UsageReport:
    provider: str
    media_id: str
    media: MediaItem | None
    media_library_checked: bool
    entries: tuple[EntryUsage, ...]
    next_cursor: str | None
    coverage: Coverage

    @property
    def proven_unused(self) -> bool:
        """Nothing found, and the coverage says nothing could have been missed."""
        return not self.entries and self.next_cursor is None and self.coverage.proves_absence

    def as_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "media_id": self.media_id,
            "media": None if self.media is None else asdict(self.media),
            "items": [asdict(entry) for entry in self.entries],
            "next_cursor": self.next_cursor,
            "coverage": asdict(self.coverage),
            "unused": self.proven_unused,
            "not_indexed": NOT_INDEXED,
        }


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_LENGTH:
        raise OperatorInputError(f"A {what} is required (1 to {MAX_ID_LENGTH} characters)")
    return value


def _page_cursor(cursor: str) -> PageCursor:
    try:
        decoded = decode_cursor(cursor)
    except InvalidCursorError:
        decoded = None
    if decoded is None or not decoded.order_value or not decoded.id:
        raise OperatorInputError(
            "Invalid cursor: pass the next cursor of a previous page unchanged", "INVALID_CURSOR"
        )
    return decoded


def _group_cursor(cursor: str | None) -> tuple[str, str] | None:
    """EmDash's entry-group cursor: orderValue is the collection slug, id the content id."""
    if cursor is None:
        return None
    decoded = _page_cursor(cursor)
    return decoded.order_value, decoded.id


def _media_cursor(cursor: str | None) -> str | None:
    if cursor is None:
        return None
    decoded = _page_cursor(cursor)
    if decoded.order_value != MEDIA_CURSOR_ORDER:
        raise OperatorInputError(
            "Invalid cursor: pass the next cursor of a previous page unchanged", "INVALID_CURSOR"
        )
    return decoded.id


def _entries(page) -> tuple[EntryUsage, ...]:
    by_group: dict[tuple[str, str], list[UsageRow]] = {group: [] for group in page.groups}
    for row in page.rows:
        by_group[(row.collection_slug, row.content_id)].append(row)
    return tuple(
        _entry(group, rows, page.deleted_at.get(group)) for group, rows in by_group.items()
    )


def _entry(group: tuple[str, str], rows: list[UsageRow], deleted_at: str | None) -> EntryUsage:
    variants: dict[str, list[UsageRow]] = {}
    for row in rows:
        variants.setdefault(row.source_variant, []).append(row)
    preferred = (variants.get(DRAFT_OVERLAY) or variants.get(COLUMNS) or rows)[0]
    return EntryUsage(
        collection=group[0],
        content_id=group[1],
        title=preferred.content_title,
        slug=preferred.content_slug,
        locale=preferred.locale,
        status=preferred.content_status,
        scheduled_at=preferred.content_scheduled_at,
        deleted_at=deleted_at,
        sources=tuple(
            SourceView(
                variant,
                tuple(
                    OccurrenceView(
                        row.field_slug,
                        row.field_path,
                        int(row.occurrence_index),
                        row.reference_type if row.reference_type in REFERENCE_TYPES else "unknown",
                    )
                    for row in variant_rows
                ),
            )
            for variant, variant_rows in variants.items()
        ),
    )


def media_usage(
    engine: Engine,
    media_id: object,
    *,
    provider: object = "local",
    limit: object = DEFAULT_USAGE_LIMIT,
    cursor: str | None = None,
) -> UsageReport:
    """One page of the entries using a media item now, with the coverage that qualifies it.
    A local media id must exist in EmDash's media table when the database has one."""
    reference = MediaReference(_text(provider, "provider"), _text(media_id, "media id"))
    page_size, after = listing_limit(limit), _group_cursor(cursor)
    repository = UsageRepository(engine)
    checked = reference.is_local and repository.has_media_library()
    media = repository.find_media(reference.asset_id) if checked else None
    if checked and media is None:
        raise OperatorInputError(f"Media item not found: {reference.asset_id}", "NOT_FOUND")
    coverage = read_coverage(repository)
    page = repository.usage_page(reference, after, page_size)
    entries = _entries(page)
    next_cursor = None
    if page.has_more and entries:
        next_cursor = encode_cursor(entries[-1].collection, entries[-1].content_id)
    return UsageReport(
        reference.provider, reference.asset_id, media, checked, entries, next_cursor, coverage
    )


@dataclass(frozen=True)
class UnusedReport:
    items: tuple[MediaItem, ...]
    next_cursor: str | None
    summary: MediaSummary
    coverage: Coverage
    not_indexed: str = field(default=NOT_INDEXED)

    def as_dict(self) -> dict[str, Any]:
        return {
            "items": [asdict(item) for item in self.items],
            "next_cursor": self.next_cursor,
            "media": self.summary.media,
            "used": self.summary.used,
            "unused": self.summary.unused,
            "reclaimable_bytes": self.summary.reclaimable_bytes,
            "coverage": asdict(self.coverage),
            "not_indexed": self.not_indexed,
        }


def require_media_library(repository: UsageRepository) -> None:
    if not repository.has_media_library():
        raise CoverageIncomplete("this database has no EmDash `media` table to compare with")


def unused_media(
    engine: Engine, *, limit: object = DEFAULT_USAGE_LIMIT, cursor: str | None = None
) -> UnusedReport:
    """A page of media rows no content field refers to, with the library's totals; refused
    (CoverageIncomplete) unless every collection's coverage proves absence. Deletes nothing."""
    page_size = listing_limit(limit)
    after = _media_cursor(cursor)
    repository = UsageRepository(engine)
    require_media_library(repository)
    coverage = read_coverage(repository)
    if not coverage.proves_absence:
        names = ", ".join(_why(view) for view in coverage.incomplete)
        raise CoverageIncomplete(
            f"cannot call any media unused while coverage is incomplete: {names}"
        )
    items, has_more = repository.unused_media(after, page_size)
    summary = repository.media_summary()
    next_cursor = encode_cursor(MEDIA_CURSOR_ORDER, items[-1].id) if has_more and items else None
    return UnusedReport(tuple(items), next_cursor, summary, coverage)


def _why(view: CollectionCoverageView) -> str:
    if view.coverage != "complete":
        return f"{view.collection} {view.coverage}"
    parts = []
    if view.pending_work:
        parts.append(f"{view.pending_work} pending")
    if view.failed_work:
        parts.append(f"{view.failed_work} failed")
    return f"{view.collection} ({' and '.join(parts)} work)"


def media_library_summary(engine: Engine) -> tuple[MediaSummary, Coverage] | None:
    """The library's totals with the coverage they stand on; None without a media table."""
    repository = UsageRepository(engine)
    if not repository.has_media_library():
        return None
    return repository.media_summary(), read_coverage(repository)
