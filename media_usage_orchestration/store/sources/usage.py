"""The read side of the index (EmDash's `GET /_emdash/api/media/[id]/usage`): which entries use
a media item now, each collection's coverage, and EmDash's `media` library table.

An occurrence counts only in its source's current generation, only for canonical content
sources of a registry collection (while capture is active: the source's collection id and
identity version 1 must match the registry, as in EmDash's reads), and a `columns` source only
when the entry is published or has no draft overlay: a draft overlay hides the columns it
overlays. Entry groups are paged by (collection slug, content id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Integer,
    MetaData,
    Select,
    Table,
    Text,
    and_,
    exists,
    func,
    inspect,
    literal,
    or_,
    select,
    tuple_,
)
from sqlalchemy.sql.elements import ColumnElement

from media_usage_orchestration.store.core.engine import (
    bounded_read,
    prefer_linear_plans,
    read_transaction,
)
from media_usage_orchestration.store.core.predicates import activation_is_active
from media_usage_orchestration.store.core.schema import (
    COLLECTION_SCOPE,
    CONTENT_ADAPTER_ID,
    collections,
    index_status,
    occurrences,
    sources,
    work,
)
from media_usage_orchestration.values.records import optional, record_from_row

VARIANTS = ("columns", "draft_overlay")
# The media library summary's time limit: it takes well under a second on a library of 100,000
# rows; past this it is cancelled rather than hold up the run it ends (the projection GC's).
SUMMARY_SECONDS = 60.0

# EmDash core's media library (migration 001 and later), read only: the project never writes it
# (the EmDash double's uploads do, in the demo and the tests).
media_library = Table(
    "media",
    MetaData(),
    Column("id", Text, primary_key=True),
    Column("filename", Text, nullable=False),
    Column("mime_type", Text, nullable=False),
    Column("size", Integer),
    Column("width", Integer),
    Column("height", Integer),
    Column("alt", Text),
    Column("caption", Text),
    Column("storage_key", Text, nullable=False),
    Column("content_hash", Text),
    Column("created_at", Text),
    Column("author_id", Text),
    Column("status", Text, nullable=False),
    Column("blurhash", Text),
    Column("dominant_color", Text),
)


@dataclass(frozen=True)
class MediaReference:
    """What the reader looks for: a local media id, or a provider's asset id."""

    provider: str
    asset_id: str

    @property
    def is_local(self) -> bool:
        return self.provider == "local"

    def matches(self) -> ColumnElement[bool]:
        if self.is_local:
            return occurrences.c.media_id == self.asset_id
        return and_(
            occurrences.c.provider == self.provider,
            occurrences.c.provider_asset_id == self.asset_id,
        )


@dataclass(frozen=True)
class CoverageScope:
    collection_slug: str
    status: str | None
    schema_version: int | None
    reconciliation_required: bool
    pending_work: int
    failed_work: int


@dataclass(frozen=True)
class UsageRow:
    collection_slug: str
    content_id: str
    source_variant: str
    content_slug: str | None
    content_title: str | None
    content_status: str | None
    content_scheduled_at: str | None
    locale: str | None
    field_slug: str
    field_path: str
    occurrence_index: int
    reference_type: str


@dataclass(frozen=True)
class UsagePage:
    groups: tuple[tuple[str, str], ...]
    rows: tuple[UsageRow, ...]
    deleted_at: dict[tuple[str, str], str | None]
    has_more: bool


@dataclass(frozen=True)
class MediaItem:
    id: str
    filename: str
    mime_type: str
    size: int | None
    status: str


def _matches_active_collection(source, collection_id) -> ColumnElement[bool]:
    """EmDash's `contentSourceMatchesActiveCollection`."""
    return or_(
        ~activation_is_active(),
        and_(source.c.collection_id == collection_id, source.c.identity_version == 1),
    )


def _eligible(source, collection_id) -> ColumnElement[bool]:
    """A draft overlay always counts; the columns only if published or not overlaid."""
    overlay = sources.alias("overlay")
    overlaid = exists(
        select(literal(1)).where(
            overlay.c.source_type == "content",
            overlay.c.collection_slug == source.c.collection_slug,
            overlay.c.content_id == source.c.content_id,
            overlay.c.source_variant == "draft_overlay",
            _matches_active_collection(overlay, collection_id),
        )
    )
    return or_(
        source.c.source_variant == "draft_overlay",
        and_(
            source.c.source_variant == "columns",
            or_(source.c.content_status == "published", ~overlaid),
        ),
    )


def _current_occurrences():
    """FROM occurrences JOIN their source where it is the current generation JOIN the registry
    collection of the source, restricted to canonical content sources of both variants."""
    s = sources.alias("s")
    joined = occurrences.join(
        s,
        and_(
            s.c.source_key == occurrences.c.source_key,
            s.c.current_generation == occurrences.c.generation,
        ),
    ).join(collections, collections.c.slug == s.c.collection_slug)
    where = and_(
        s.c.source_type == "content",
        s.c.collection_slug.is_not(None),
        s.c.content_id.is_not(None),
        s.c.source_variant.in_(VARIANTS),
        _matches_active_collection(s, collections.c.id),
    )
    return s, joined, where


def _current_usage(reference: MediaReference):
    """The occurrences of `reference` EmDash's route shows."""
    s, joined, where = _current_occurrences()
    return s, joined, and_(where, reference.matches(), _eligible(s, collections.c.id))


class UsageRepository:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def has_media_library(self) -> bool:
        with self.engine.connect() as connection:
            return inspect(connection).has_table(media_library.name)

    def find_media(self, media_id: str) -> MediaItem | None:
        statement = _media_items().where(media_library.c.id == media_id)
        with read_transaction(self.engine) as connection:
            row = connection.execute(statement).first()
        return None if row is None else record_from_row(MediaItem, row._mapping)

    def coverage_scopes(self) -> list[CoverageScope]:
        """Every registry collection with its status row (if any) and its open work."""
        pending = (
            select(func.count())
            .where(work.c.collection_id == collections.c.id, work.c.state != "failed")
            .scalar_subquery()
        )
        failed = (
            select(func.count())
            .where(work.c.collection_id == collections.c.id, work.c.state == "failed")
            .scalar_subquery()
        )
        statement = (
            select(
                collections.c.slug.label("collection_slug"),
                index_status.c.status,
                index_status.c.schema_version,
                index_status.c.reconciliation_required,
                pending.label("pending_work"),
                failed.label("failed_work"),
            )
            .select_from(
                collections.outerjoin(
                    index_status,
                    and_(
                        index_status.c.adapter_id == CONTENT_ADAPTER_ID,
                        index_status.c.scope_type == COLLECTION_SCOPE,
                        index_status.c.scope_key == collections.c.slug,
                    ),
                )
            )
            .order_by(collections.c.slug)
        )
        with read_transaction(self.engine) as connection:
            rows = connection.execute(statement).all()
        return [
            record_from_row(
                CoverageScope,
                row._mapping,
                schema_version=optional(int),
                reconciliation_required=lambda value: value is not None and int(value) != 0,
                pending_work=int,
                failed_work=int,
            )
            for row in rows
        ]

    def usage_page(
        self, reference: MediaReference, after: tuple[str, str] | None, limit: int
    ) -> UsagePage:
        """Up to `limit` entry groups using the reference, after the (slug, content id)
        cursor, with their current occurrences of it and each entry's trash time."""
        with read_transaction(self.engine) as connection:
            groups, has_more = self._groups(connection, reference, after, limit)
            if not groups:
                return UsagePage((), (), {}, False)
            rows = self._rows(connection, reference, groups)
            deleted_at = self._deleted_at(connection, groups)
        return UsagePage(tuple(groups), tuple(rows), deleted_at, has_more)

    @staticmethod
    def _groups(connection: Connection, reference, after, limit):
        s, joined, where = _current_usage(reference)
        statement = select(s.c.collection_slug, s.c.content_id).select_from(joined).where(where)
        if after is not None:
            statement = statement.where(tuple_(s.c.collection_slug, s.c.content_id) > after)
        statement = (
            statement.distinct().order_by(s.c.collection_slug, s.c.content_id).limit(limit + 1)
        )
        groups = [(row[0], row[1]) for row in connection.execute(statement)]
        return groups[:limit], len(groups) > limit

    @staticmethod
    def _rows(connection: Connection, reference, groups: Sequence[tuple[str, str]]):
        s, joined, where = _current_usage(reference)
        statement = (
            select(
                s.c.collection_slug,
                s.c.content_id,
                s.c.source_variant,
                s.c.content_slug,
                s.c.content_title,
                s.c.content_status,
                s.c.content_scheduled_at,
                s.c.locale,
                occurrences.c.field_slug,
                occurrences.c.field_path,
                occurrences.c.occurrence_index,
                occurrences.c.reference_type,
            )
            .select_from(joined)
            .where(where, tuple_(s.c.collection_slug, s.c.content_id).in_(list(groups)))
            .order_by(
                s.c.collection_slug,
                s.c.content_id,
                s.c.source_variant,
                s.c.source_key,
                occurrences.c.field_path,
                occurrences.c.occurrence_index,
                occurrences.c.id,
            )
        )
        return [record_from_row(UsageRow, row._mapping) for row in connection.execute(statement)]

    @staticmethod
    def _deleted_at(connection: Connection, groups: Sequence[tuple[str, str]]):
        state = sources.alias("state")
        statement = (
            select(
                state.c.collection_slug, state.c.content_id, func.max(state.c.content_deleted_at)
            )
            .select_from(state.join(collections, collections.c.slug == state.c.collection_slug))
            .where(
                tuple_(state.c.collection_slug, state.c.content_id).in_(list(groups)),
                state.c.source_type == "content",
                state.c.source_variant.in_(VARIANTS),
                _matches_active_collection(state, collections.c.id),
            )
            .group_by(state.c.collection_slug, state.c.content_id)
        )
        return {(row[0], row[1]): row[2] for row in connection.execute(statement)}

    # -- the media library --------------------------------------------------------------------

    def unused_media(self, after: str | None, limit: int) -> tuple[list[MediaItem], bool]:
        """Media rows no current occurrence of any content source refers to, by id: an anti
        join planned without nested loops (without statistics a nested loop over the used set
        took 50 s for one page of a large library, the merge anti join 0.1 s), bounded as the
        summary is."""
        statement = unused_media_page(after, limit + 1)
        with bounded_read(self.engine, SUMMARY_SECONDS) as connection:
            prefer_linear_plans(connection)
            rows = [
                record_from_row(MediaItem, row._mapping) for row in connection.execute(statement)
            ]
        return rows[:limit], len(rows) > limit

    def media_summary(self, seconds: float = SUMMARY_SECONDS) -> MediaSummary:
        """How many media rows exist, how many are used, and the bytes of the unused ones;
        StatementTimedOut after `seconds`, having changed nothing."""
        with bounded_read(self.engine, seconds) as connection:
            prefer_linear_plans(connection)
            row = connection.execute(MEDIA_SUMMARY).one()
        return record_from_row(
            MediaSummary, row._mapping, media=int, used=int, reclaimable_bytes=int
        )


@dataclass(frozen=True)
class MediaSummary:
    media: int
    used: int
    reclaimable_bytes: int

    @property
    def unused(self) -> int:
        return self.media - self.used


def unused_media_page(after: str | None, limit: int) -> Select:
    """The next `limit` media rows by id after `after` that no current occurrence uses."""
    statement = (
        _media_items()
        .where(~_is_used(media_library.c.id))
        .order_by(media_library.c.id)
        .limit(limit)
    )
    return statement if after is None else statement.where(media_library.c.id > after)


def _media_summary() -> Select:
    """One pass over the media rows against the distinct media ids current occurrences use
    (an uncorrelated set, joined once), not a lookup per media row."""
    _, joined, where = _current_occurrences()
    used = select(occurrences.c.media_id).select_from(joined).where(where).distinct()
    used = used.subquery("used")
    unused = used.c.media_id.is_(None)
    return select(
        func.count().label("media"),
        func.count(used.c.media_id).label("used"),
        func.coalesce(func.sum(media_library.c.size).filter(unused), 0).label("reclaimable_bytes"),
    ).select_from(media_library.outerjoin(used, used.c.media_id == media_library.c.id))


MEDIA_SUMMARY = _media_summary()


def _media_items() -> Select:
    """The media library columns a `MediaItem` holds."""
    return select(*(media_library.c[field.name] for field in fields(MediaItem)))


def _is_used(media_id) -> ColumnElement[bool]:
    """Some current occurrence of a content source refers to `media_id`: either variant, and
    trashed entries too (a restore brings their media back), so nothing in use looks unused."""
    _, joined, where = _current_occurrences()
    return exists(
        select(literal(1)).select_from(joined).where(where, occurrences.c.media_id == media_id)
    )
