"""Canonical source projection: the write protocol of EmDash's `MediaUsageRepository`.

A source row names one variant of one entry and points at its `current_generation` of
occurrence rows. A new projection is published by writing a whole new generation of
occurrences and then moving the pointer with a compare-and-swap on every column the writer
observed, so readers (which join on `current_generation`) see either the old or the new
projection, never a mix. Every write re-asserts, in the same statement, that the collection
identity is current and that the snapshot still describes the live content row; a loser leaves
its occurrences behind as an abandoned generation for the projection GC.

Each public method opens its own transactions; nothing relies on a caller's transaction.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    LargeBinary,
    Text,
    and_,
    bindparam,
    cast,
    column,
    delete,
    exists,
    false,
    func,
    literal,
    or_,
    select,
    table,
    true,
    tuple_,
    update,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement
from ulid import ULID

from .clock import lease_live_at_clock, timestamp_offset
from .engine import is_postgres, read_transaction
from .identifiers import content_table_name, require_text
from .json_rows import JsonRows
from .predicates import registry_identity_is_current
from .schema import (
    CLEANUP_TASK_KEY,
    cleanup,
    collections,
    dialect_insert,
    generation_writes,
    occurrences,
    sources,
)

logger = logging.getLogger(__name__)

GENERATION_WRITE_LEASE_SECONDS = 60 * 60
COMPLETE = "complete"
SOURCE_TYPE_CONTENT = "content"
# Far below both dialects' bind limits (13 columns per row).
OCCURRENCE_INSERT_BATCH = 500

CANONICAL_IDENTITY_VERSION = 1
_REVISION_COLUMN_BY_VARIANT = {"columns": "live_revision_id", "draft_overlay": "draft_revision_id"}
# EmDash's `isMediaUsageProjectionFingerprint`: only a v1 projection fingerprint proves a no-op.
_PROJECTION_FINGERPRINT = re.compile(r"media-usage-projection:v1:sha256:[a-f0-9]{64}")
_MEASURED_OCCURRENCE_COLUMNS = (
    "field_slug",
    "field_path",
    "reference_type",
    "media_id",
    "provider",
    "provider_asset_id",
    "media_kind",
    "mime_type",
)


# --- records ----------------------------------------------------------------------------------


class OccurrenceValues(Protocol):
    def row_values(self) -> dict[str, Any]:
        """Occurrence columns without id, source key, generation and timestamps."""
        ...


class SourceProjection(Protocol):
    """A computed source (`media.sources.ContentSource`): its descriptive columns, fingerprint
    and occurrences. The store only needs these members, not the domain type."""

    source_key: str
    collection_id: str | None
    collection_slug: str
    source_fingerprint: str | None
    occurrences: Sequence[OccurrenceValues]

    def row_values(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class SourceRow:
    """One `_emdash_media_usage_sources` row as stored (EmDash's `MediaUsageSource`).

    Fields keep `MediaUsageSource`'s order: admission charges a deletion by the length of that
    record's JSON, whose member order follows it."""

    source_key: str
    source_type: str
    collection_id: str | None
    collection_slug: str | None
    content_id: str | None
    source_variant: str
    locale: str | None
    translation_group: str | None
    content_slug: str | None
    content_title: str | None
    content_status: str | None
    content_scheduled_at: str | None
    content_deleted_at: str | None
    revision_id: str | None
    current_generation: str
    schema_version: int
    source_updated_at: str | None
    source_version: int | None
    source_fingerprint: str | None
    identity_version: int | None
    source_completeness: str
    last_attempted_at: str | None
    last_error_code: str | None
    indexed_at: str
    created_at: str | None
    updated_at: str | None

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> SourceRow:
        values = {name: row[name] for name in _SOURCE_ROW_FIELDS}
        for name in ("schema_version", "source_version", "identity_version"):
            if values[name] is not None:
                values[name] = int(values[name])
        return cls(**values)


_SOURCE_ROW_FIELDS = tuple(field.name for field in fields(SourceRow))


@dataclass(frozen=True)
class DeletionMeasurement:
    occurrence_count: int
    occurrence_bytes: int
    exceeds_occurrence_limit: bool


@dataclass(frozen=True)
class ReplaceResult:
    replaced: bool
    unchanged: bool
    # The row that won instead, when a guarded replacement lost.
    source: SourceRow | None = None


@dataclass(frozen=True)
class DeleteResult:
    deleted: bool
    # The row still present after a lost guarded delete (None if it is gone).
    source: SourceRow | None = None
    content_present: bool = False


@dataclass(frozen=True)
class Publication:
    """A batch item: publish `source` as a new generation of its own occurrences, only while
    the stored row is still `expected` (None: still absent)."""

    source: SourceProjection
    expected: SourceRow | None


@dataclass(frozen=True)
class Removal:
    """A batch item: delete the source `expected` describes, with its current occurrences,
    only while it is still that row - and, with `absent_content_id`, only while that entry's
    content row stays absent. `after` names publications of the same batch that must have
    landed first (an entry drops the sources it no longer produces only once its own snapshots
    are published)."""

    expected: SourceRow
    absent_content_id: str | None = None
    after: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class BatchWriteResult:
    """The source keys whose guarded write landed."""

    published: frozenset[str] = frozenset()
    removed: frozenset[str] = frozenset()


# --- guards -----------------------------------------------------------------------------------


def _equals_or_null(column_, value) -> ColumnElement[bool]:
    return column_.is_(None) if value is None else column_ == value


# The columns a writer's compare-and-swap re-asserts; the first two are never NULL.
SOURCE_MATCH_COLUMNS = (
    "current_generation",
    "source_completeness",
    "collection_id",
    "updated_at",
    "source_fingerprint",
    "source_updated_at",
    "source_version",
    "identity_version",
    "revision_id",
    "last_attempted_at",
    "last_error_code",
)
_NEVER_NULL_MATCH_COLUMNS = frozenset({"current_generation", "source_completeness"})


def source_matches(expected: SourceRow) -> ColumnElement[bool]:
    """The stored row is still exactly the one observed (EmDash's `sourceMatchExpression`):
    any other writer changes at least the generation, `updated_at` or an attempt column."""
    return and_(
        *(
            sources.c[name] == getattr(expected, name)
            if name in _NEVER_NULL_MATCH_COLUMNS
            else _equals_or_null(sources.c[name], getattr(expected, name))
            for name in SOURCE_MATCH_COLUMNS
        )
    )


def _source_matches_rows(rows) -> ColumnElement[bool]:
    """`source_matches` against each batch row's `expected_<column>` values, NULL-safely."""
    return and_(
        *(
            sources.c[name] == rows.c[f"expected_{name}"]
            if name in _NEVER_NULL_MATCH_COLUMNS
            else sources.c[name].is_not_distinct_from(rows.c[f"expected_{name}"])
            for name in SOURCE_MATCH_COLUMNS
        )
    )


def collection_is_current(collection_id: str | None, collection_slug: str | None):
    """Legacy (slug-keyed) sources carry no collection id and so no identity to re-check."""
    if collection_id is None:
        return true()
    return registry_identity_is_current(collection_id, collection_slug)


def _content_table(collection_slug: str):
    columns = ("id", "version", "updated_at", "live_revision_id", "draft_revision_id")
    return table(content_table_name(collection_slug), *(column(name) for name in columns))


def canonical_content_is_current(values: Mapping[str, Any]) -> ColumnElement[bool]:
    """The snapshot behind `values` still describes the live content row: same version,
    `updated_at` and revision. This is what stops a stale snapshot from being published after
    a newer write or a delete. Only canonical content sources are bound to a row."""
    if (
        values["collection_id"] is None
        or values["identity_version"] != CANONICAL_IDENTITY_VERSION
        or values["source_type"] != SOURCE_TYPE_CONTENT
    ):
        return true()
    revision_column = _REVISION_COLUMN_BY_VARIANT.get(values["source_variant"])
    if (
        not values["collection_slug"]
        or not values["content_id"]
        or values["source_version"] is None
        or values["source_updated_at"] is None
        or revision_column is None
    ):
        return false()
    content = _content_table(values["collection_slug"]).alias("content")
    return exists(
        select(literal(1))
        .select_from(content)
        .where(
            content.c.id == values["content_id"],
            content.c.version == values["source_version"],
            content.c.updated_at == values["source_updated_at"],
            _equals_or_null(content.c[revision_column], values["revision_id"]),
        )
    )


def _write_lease_is_live(source_key: str, generation: str, lease_token: str):
    lease = generation_writes.alias("generation_write")
    return exists(
        select(literal(1))
        .select_from(lease)
        .where(
            lease.c.source_key == source_key,
            lease.c.generation == generation,
            lease.c.lease_token == lease_token,
            lease_live_at_clock(lease.c.expires_at),
        )
    )


def _content_row_absent(collection_slug: str, content_id: str) -> ColumnElement[bool]:
    content = _content_table(collection_slug).alias("absent_content")
    return ~exists(select(literal(1)).select_from(content).where(content.c.id == content_id))


def _rows_write_lease_is_live(rows) -> ColumnElement[bool]:
    """`_write_lease_is_live` for each batch row's (source_key, current_generation, lease_token)."""
    lease = generation_writes.alias("generation_write")
    return exists(
        select(literal(1))
        .select_from(lease)
        .where(
            lease.c.source_key == rows.c.source_key,
            lease.c.generation == rows.c.current_generation,
            lease.c.lease_token == rows.c.lease_token,
            lease_live_at_clock(lease.c.expires_at),
        )
    )


def _rows_content_is_current(collection_slug: str, rows) -> ColumnElement[bool]:
    """`canonical_content_is_current` for each batch row (all canonical sources of one
    collection): the row's version, `updated_at` and variant's revision are still live."""
    content = _content_table(collection_slug).alias("content")
    revision_matches = or_(
        *(
            and_(
                rows.c.source_variant == variant,
                content.c[revision_column].is_not_distinct_from(rows.c.revision_id),
            )
            for variant, revision_column in _REVISION_COLUMN_BY_VARIANT.items()
        )
    )
    return exists(
        select(literal(1))
        .select_from(content)
        .where(
            content.c.id == rows.c.content_id,
            content.c.version == rows.c.source_version,
            content.c.updated_at == rows.c.source_updated_at,
            revision_matches,
        )
    )


def _rows_content_still_absent(collection_slug: str, rows) -> ColumnElement[bool]:
    """Rows without `absent_content_id` need no content check; the others only while that
    entry's content row stays absent."""
    content = _content_table(collection_slug).alias("absent_content")
    return or_(
        rows.c.absent_content_id.is_(None),
        ~exists(
            select(literal(1)).select_from(content).where(content.c.id == rows.c.absent_content_id)
        ),
    )


# --- statements -------------------------------------------------------------------------------


def _published_values(source: SourceProjection, generation: str, now: str) -> dict[str, Any]:
    """Every column a successful replacement writes (EmDash's `buildSourceRow`)."""
    values = source.row_values()
    values.update(
        current_generation=generation,
        schema_version=values["schema_version"] if values["schema_version"] is not None else 1,
        source_completeness=COMPLETE,
        last_attempted_at=now,
        last_error_code=None,
        indexed_at=now,
        updated_at=now,
    )
    return values


def _occurrence_rows(
    source_key: str, generation: str, items: Iterable[OccurrenceValues], now: str
) -> list[dict[str, Any]]:
    rows = []
    for occurrence in items:
        row = occurrence.row_values()
        row.update(id=str(ULID()), source_key=source_key, generation=generation, created_at=now)
        row["occurrence_index"] = row["occurrence_index"] or 0
        rows.append(row)
    return rows


def _typed_literal(table_column, value):
    return literal(value, Integer if isinstance(table_column.type, Integer) else Text)


def _insert_if_absent_statement(connection: Connection, values: dict[str, Any], guard):
    names = list(values)
    selected = select(*(_typed_literal(sources.c[name], values[name]) for name in names)).where(
        guard
    )
    return (
        dialect_insert(connection, sources)
        .from_select(names, selected)
        .on_conflict_do_nothing(index_elements=[sources.c.source_key])
        .returning(sources.c.source_key)
    )


def _occurrence_bytes(dialect_name: str):
    payload = func.coalesce(occurrences.c[_MEASURED_OCCURRENCE_COLUMNS[0]], "")
    for name in _MEASURED_OCCURRENCE_COLUMNS[1:]:
        payload = payload.op("||")(func.coalesce(occurrences.c[name], ""))
    if dialect_name == "postgresql":
        return func.octet_length(payload)
    return func.length(cast(payload, LargeBinary))


# --- repository -------------------------------------------------------------------------------


class SourceRepository:
    """The projection part of EmDash's `MediaUsageRepository`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- reads ---------------------------------------------------------------------------------

    def find_source(self, source_key: str) -> SourceRow | None:
        return self.find_sources([source_key]).get(source_key)

    def find_sources(self, source_keys: Sequence[str]) -> dict[str, SourceRow]:
        unique = list(dict.fromkeys(source_keys))
        if not unique:
            return {}
        with read_transaction(self.engine) as connection:
            rows = connection.execute(select(sources).where(sources.c.source_key.in_(unique)))
            return {row.source_key: SourceRow.from_mapping(row._mapping) for row in rows}

    def measure_source_generation_deletion(
        self, source_key: str, generation: str, limit: int = 12
    ) -> DeletionMeasurement:
        """What deleting one generation would cost, reading at most `limit + 1` rows."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError("Media usage deletion measurement requires a non-negative row limit")
        with read_transaction(self.engine) as connection:
            statement = (
                select(_occurrence_bytes(connection.dialect.name).label("occurrence_bytes"))
                .where(
                    occurrences.c.source_key == source_key,
                    occurrences.c.generation == generation,
                )
                .limit(limit + 1)
            )
            sizes = [int(size or 0) for size in connection.execute(statement).scalars()]
        return DeletionMeasurement(len(sizes), sum(sizes), len(sizes) > limit)

    def projection_matches_expected_source(
        self, source: SourceProjection, expected: SourceRow
    ) -> bool:
        """The stored row is the observed one and already publishes exactly this projection."""
        if not projection_is_unchanged(source, expected):
            return False
        statement = select(sources.c.source_key).where(
            sources.c.source_key == source.source_key,
            source_matches(expected),
            collection_is_current(source.collection_id, source.collection_slug),
        )
        with read_transaction(self.engine) as connection:
            return connection.execute(statement).first() is not None

    # -- replacement ---------------------------------------------------------------------------

    def replace_source_if_matching(
        self,
        source: SourceProjection,
        items: Sequence[OccurrenceValues] | None,
        expected: SourceRow | None,
    ) -> ReplaceResult:
        """Publish `source` with `items` (default: the source's own occurrences) as a new
        generation, only if the stored row is still `expected` (None: still absent)."""
        items = source.occurrences if items is None else items
        if expected is not None and self.projection_matches_expected_source(source, expected):
            return ReplaceResult(replaced=False, unchanged=True)
        generation = str(ULID())
        lease_token = str(ULID())
        lease_created_at = self._take_write_lease(source, generation, lease_token)
        if lease_created_at is None:
            return ReplaceResult(False, False, self.find_source(source.source_key))
        try:
            replaced = self._publish(
                source, items, expected, generation, lease_token, lease_created_at
            )
        finally:
            self._release_write_lease(source.source_key, generation, lease_token)
        if replaced:
            return ReplaceResult(replaced=True, unchanged=False)
        return ReplaceResult(False, False, self.find_source(source.source_key))

    def _take_write_lease(
        self, source: SourceProjection, generation: str, lease_token: str
    ) -> str | None:
        """A write lease protects the new generation from the projection GC while it is being
        published; it is only granted while the collection identity is current."""
        selected = select(
            literal(source.source_key, Text),
            literal(generation, Text),
            literal(lease_token, Text),
            timestamp_offset(GENERATION_WRITE_LEASE_SECONDS),
            timestamp_offset(0),
        ).where(collection_is_current(source.collection_id, source.collection_slug))
        statement = (
            generation_writes.insert()
            .from_select(
                ["source_key", "generation", "lease_token", "expires_at", "created_at"], selected
            )
            .returning(generation_writes.c.created_at)
        )
        with self.engine.begin() as connection:
            return connection.execute(statement).scalar_one_or_none()

    def _publish(
        self,
        source: SourceProjection,
        items: Sequence[OccurrenceValues],
        expected: SourceRow | None,
        generation: str,
        lease_token: str,
        now: str,
    ) -> bool:
        values = _published_values(source, generation, now)
        guard = and_(
            _write_lease_is_live(source.source_key, generation, lease_token),
            collection_is_current(source.collection_id, source.collection_slug),
            canonical_content_is_current(values),
        )
        with self.engine.begin() as connection:
            if not self._lock_collection(connection, source):
                return False
            self._insert_occurrences(connection, source.source_key, generation, items, now)
            if expected is None:
                statement = _insert_if_absent_statement(connection, values, guard)
                return connection.execute(statement).first() is not None
            statement = (
                update(sources)
                .where(sources.c.source_key == source.source_key, source_matches(expected), guard)
                .values({name: value for name, value in values.items() if name != "source_key"})
            )
            return connection.execute(statement).rowcount > 0

    @staticmethod
    def _lock_collection(connection: Connection, source: SourceProjection) -> bool:
        """On PostgreSQL, hold the registry row against deletion until the publication
        commits, so a collection cannot be removed between the guard and the commit."""
        if source.collection_id is None:
            return True
        if not source.collection_slug:
            return False
        if not is_postgres(connection):
            return True
        statement = (
            select(collections.c.id)
            .where(
                collections.c.id == source.collection_id,
                collections.c.slug == source.collection_slug,
            )
            .with_for_update(read=True, key_share=True)
        )
        return connection.execute(statement).first() is not None

    @staticmethod
    def _insert_occurrences(
        connection: Connection,
        source_key: str,
        generation: str,
        items: Sequence[OccurrenceValues],
        now: str,
    ) -> None:
        rows = _occurrence_rows(source_key, generation, items, now)
        for start in range(0, len(rows), OCCURRENCE_INSERT_BATCH):
            batch = rows[start : start + OCCURRENCE_INSERT_BATCH]
            connection.execute(occurrences.insert().values(batch))

    def _release_write_lease(self, source_key: str, generation: str, lease_token: str) -> None:
        statement = delete(generation_writes).where(
            generation_writes.c.source_key == source_key,
            generation_writes.c.generation == generation,
            generation_writes.c.lease_token == lease_token,
        )
        try:
            with self.engine.begin() as connection:
                connection.execute(statement)
        except SQLAlchemyError:
            # An unreleased lease only delays GC of this generation until it expires.
            logger.exception("Failed to release media usage generation write lease")

    # -- batches of one collection ------------------------------------------------------------

    def write_collection_batch(
        self,
        collection_id: str,
        collection_slug: str,
        publications: Sequence[Publication],
        removals: Sequence[Removal] = (),
    ) -> BatchWriteResult:
        """`replace_source_if_matching` and the guarded deletes for many canonical sources of
        one collection, in one transaction and a fixed number of statements: every row keeps
        its own guards (its write lease, its expected columns, its content row), so each row
        lands or not exactly as it would alone."""
        require_text(collection_id, "Media usage batch writes require a collection ID")
        _require_batch_members(collection_id, collection_slug, publications, removals)
        with self.engine.begin() as connection:
            batch = _CollectionBatch(connection, collection_id, collection_slug)
            published = batch.publish(publications) if publications else frozenset()
            ready = [removal for removal in removals if removal.after <= published]
            removed = batch.remove(ready) if ready else frozenset()
        return BatchWriteResult(published, removed)

    # -- guarded deletes -----------------------------------------------------------------------

    def delete_source_if_matching(self, source_key: str, expected: SourceRow) -> DeleteResult:
        """Delete the source (and its current occurrences) only if it is still `expected`."""
        guard = collection_is_current(expected.collection_id, expected.collection_slug)
        deleted = self._delete_source(source_key, expected, guard)
        if deleted:
            return DeleteResult(deleted=True)
        return DeleteResult(False, self.find_source(source_key))

    def delete_source_if_matching_content_absent(
        self, source_key: str, expected: SourceRow, collection_slug: str, content_id: str
    ) -> DeleteResult:
        """Delete the source of an entry whose content row is gone, only while it stays gone."""
        require_text(content_id, "Media usage content-absent delete requires a content ID")
        guard = and_(
            collection_is_current(expected.collection_id, expected.collection_slug),
            _content_row_absent(collection_slug, content_id),
        )
        if self._delete_source(source_key, expected, guard):
            return DeleteResult(deleted=True)
        if self._content_row_exists(collection_slug, content_id):
            return DeleteResult(False, None, content_present=True)
        return DeleteResult(False, self.find_source(source_key))

    def _delete_source(self, source_key: str, expected: SourceRow, guard) -> bool:
        statement = delete(sources).where(
            sources.c.source_key == source_key, source_matches(expected), guard
        )
        with self.engine.begin() as connection:
            self._lock_cleanup(connection)
            if connection.execute(statement).rowcount == 0:
                return False
            self._delete_generation(connection, source_key, expected.current_generation)
        return True

    @staticmethod
    def _lock_cleanup(connection: Connection) -> None:
        """On PostgreSQL, order source deletes against a running projection GC pass."""
        if is_postgres(connection):
            connection.execute(
                select(cleanup.c.task_key)
                .where(cleanup.c.task_key == CLEANUP_TASK_KEY)
                .with_for_update(read=True)
            )

    @staticmethod
    def _delete_generation(connection: Connection, source_key: str, generation: str) -> None:
        in_generation = and_(
            occurrences.c.source_key == source_key, occurrences.c.generation == generation
        )
        # EmDash's GC trigger raises its fence when it deletes rows carrying its lease token;
        # clearing the token first keeps this ordinary delete from touching the fence.
        connection.execute(
            update(occurrences).where(in_generation).values(cleanup_lease_token=None)
        )
        connection.execute(delete(occurrences).where(in_generation))

    def _content_row_exists(self, collection_slug: str, content_id: str) -> bool:
        content = _content_table(collection_slug)
        statement = select(content.c.id).where(content.c.id == content_id).limit(1)
        with read_transaction(self.engine) as connection:
            return connection.execute(statement).first() is not None


# --- batches of one collection -------------------------------------------------------------

_SOURCE_COLUMN_TYPES = {
    name: Integer() if isinstance(table_column.type, Integer) else Text()
    for name, table_column in sources.c.items()
}
_EXPECTED_COLUMN_TYPES = {
    f"expected_{name}": _SOURCE_COLUMN_TYPES[name] for name in SOURCE_MATCH_COLUMNS
}
_LEASE_ROWS = JsonRows.of(
    "write_lease", {"source_key": Text(), "generation": Text(), "lease_token": Text()}
)
_REMOVAL_ROWS = JsonRows.of(
    "doomed_source", {"source_key": Text(), "absent_content_id": Text(), **_EXPECTED_COLUMN_TYPES}
)
# Batch statements are built once per dialect, collection table and column set; the
# collection identity and the rows are bound at execution.
_BATCH_COLLECTION_ID = bindparam("batch_collection_id", type_=Text)
_BATCH_COLLECTION_SLUG = bindparam("batch_collection_slug", type_=Text)


def _require_batch_members(
    collection_id: str,
    collection_slug: str,
    publications: Sequence[Publication],
    removals: Sequence[Removal],
) -> None:
    """A batch is canonical sources of exactly this collection identity, each key once: the
    collection guard is then one predicate for every row, as it is for each row alone."""
    keys = [item.source.source_key for item in publications]
    keys += [item.expected.source_key for item in removals]
    if len(set(keys)) != len(keys):
        raise ValueError("A media usage batch names a source more than once")
    identities = {(item.source.collection_id, item.source.collection_slug) for item in publications}
    identities |= {
        (item.expected.collection_id, item.expected.collection_slug) for item in removals
    }
    if identities - {(collection_id, collection_slug)}:
        raise ValueError("A media usage batch holds sources of another collection identity")
    for item in publications:
        values = item.source.row_values()
        if values["identity_version"] != CANONICAL_IDENTITY_VERSION or (
            values["source_type"] != SOURCE_TYPE_CONTENT
        ):
            raise ValueError("A media usage batch publishes only canonical content sources")


def _batch_identity_is_current() -> ColumnElement[bool]:
    return registry_identity_is_current(_BATCH_COLLECTION_ID, _BATCH_COLLECTION_SLUG)


def _publication_guard(collection_slug: str, rows) -> ColumnElement[bool]:
    """`_publish`'s guard for each row: its live write lease, the collection identity, and
    its content row still as snapshotted."""
    return and_(
        _rows_write_lease_is_live(rows),
        _batch_identity_is_current(),
        _rows_content_is_current(collection_slug, rows),
    )


@functools.lru_cache(maxsize=16)
def _write_lease_statement(dialect_name: str):
    rows = _LEASE_ROWS.relation(dialect_name)
    selected = select(
        rows.c.source_key,
        rows.c.generation,
        rows.c.lease_token,
        timestamp_offset(GENERATION_WRITE_LEASE_SECONDS),
        timestamp_offset(0),
    ).where(_batch_identity_is_current())
    return (
        generation_writes.insert()
        .from_select(
            ["source_key", "generation", "lease_token", "expires_at", "created_at"], selected
        )
        .returning(generation_writes.c.source_key, generation_writes.c.created_at)
    )


@functools.lru_cache(maxsize=16)
def _occurrence_insert_statement(dialect_name: str, names: tuple[str, ...]):
    rows = _occurrence_rows_of(names).relation(dialect_name)
    return occurrences.insert().from_select(list(names), select(*(rows.c[name] for name in names)))


def _occurrence_rows_of(names: tuple[str, ...]) -> JsonRows:
    """New occurrence rows, each column typed as the relation declares it: integer or text."""
    return JsonRows.of(
        "new_occurrence",
        {
            name: Integer() if isinstance(occurrences.c[name].type, Integer) else Text()
            for name in names
        },
    )


@functools.lru_cache(maxsize=64)
def _insert_new_statement(dialect_name: str, collection_slug: str, names: tuple[str, ...]):
    """Sources observed absent: inserted only if still absent, under the guards."""
    rows = _published_rows_of("new_source", names).relation(dialect_name)
    written = [name for name in names if name != "lease_token"]
    selected = select(*(rows.c[name] for name in written)).where(
        _publication_guard(collection_slug, rows)
    )
    return (
        dialect_insert(dialect_name, sources)
        .from_select(written, selected)
        .on_conflict_do_nothing(index_elements=[sources.c.source_key])
        .returning(sources.c.source_key)
    )


@functools.lru_cache(maxsize=64)
def _update_changed_statement(dialect_name: str, collection_slug: str, names: tuple[str, ...]):
    """Sources observed present: rewritten only while every expected column still matches,
    under the guards."""
    rows = _published_rows_of("changed_source", names).relation(dialect_name)
    written = [name for name in names if name in sources.c and name != "source_key"]
    return (
        update(sources)
        .where(
            sources.c.source_key == rows.c.source_key,
            _source_matches_rows(rows),
            _publication_guard(collection_slug, rows),
        )
        .values({name: rows.c[name] for name in written})
        .returning(sources.c.source_key)
    )


@functools.lru_cache(maxsize=64)
def _removal_statement(dialect_name: str, collection_slug: str):
    """`_delete_source` for each row: still the expected row, the identity current, and (for
    an entry whose content is gone) its content row still absent."""
    rows = _REMOVAL_ROWS.relation(dialect_name)
    matching = exists(
        select(literal(1))
        .select_from(rows)
        .where(
            rows.c.source_key == sources.c.source_key,
            _source_matches_rows(rows),
            _rows_content_still_absent(collection_slug, rows),
        )
    )
    return (
        delete(sources)
        .where(
            sources.c.source_key.in_(bindparam("source_keys", expanding=True)),
            matching,
            _batch_identity_is_current(),
        )
        .returning(sources.c.source_key, sources.c.current_generation)
    )


def _published_rows_of(name: str, names: tuple[str, ...]) -> JsonRows:
    known = {**_SOURCE_COLUMN_TYPES, **_EXPECTED_COLUMN_TYPES, "lease_token": Text()}
    return JsonRows.of(name, {column_name: known[column_name] for column_name in names})


@dataclass
class _Prepared:
    publication: Publication
    generation: str = field(default_factory=lambda: str(ULID()))
    lease_token: str = field(default_factory=lambda: str(ULID()))

    @property
    def source_key(self) -> str:
        return self.publication.source.source_key

    def row(self, now: str) -> dict[str, Any]:
        values = _published_values(self.publication.source, self.generation, now)
        values["lease_token"] = self.lease_token
        if self.publication.expected is not None:
            values.update(_expected_values(self.publication.expected))
        return values


class _CollectionBatch:
    """The statements of one batch transaction for the collection (collection_id, slug)."""

    def __init__(self, connection: Connection, collection_id: str, collection_slug: str) -> None:
        self.connection = connection
        self.dialect = connection.dialect.name
        self.collection_slug = collection_slug
        self.identity = {
            _BATCH_COLLECTION_ID.key: collection_id,
            _BATCH_COLLECTION_SLUG.key: collection_slug,
        }

    def execute(self, statement, relation: JsonRows, rows, **parameters):
        bound = relation.bind(self.dialect, rows)
        return self.connection.execute(statement, {**self.identity, **bound, **parameters})

    # -- publication ---------------------------------------------------------------------------

    def publish(self, publications: Sequence[Publication]) -> frozenset[str]:
        if not self.lock_collection():
            return frozenset()
        prepared = [_Prepared(publication) for publication in publications]
        leased_at = self.take_write_leases(prepared)
        prepared = [item for item in prepared if item.source_key in leased_at]
        if not prepared:
            return frozenset()
        self.insert_occurrences(prepared, leased_at)
        rows = [item.row(leased_at[item.source_key]) for item in prepared]
        new = [row for row in rows if "expected_current_generation" not in row]
        changed = [row for row in rows if "expected_current_generation" in row]
        published = self.insert_new(new) | self.update_changed(changed)
        self.release_write_leases(prepared)
        return frozenset(published)

    def lock_collection(self) -> bool:
        """`SourceRepository._lock_collection` for the whole batch."""
        if self.dialect != "postgresql":
            return True
        statement = (
            select(collections.c.id)
            .where(
                collections.c.id == _BATCH_COLLECTION_ID,
                collections.c.slug == _BATCH_COLLECTION_SLUG,
            )
            .with_for_update(read=True, key_share=True)
        )
        return self.connection.execute(statement, self.identity).first() is not None

    def take_write_leases(self, prepared: Sequence[_Prepared]) -> dict[str, str]:
        """One write lease per source, granted only while the collection identity is current;
        returns each granted source's lease `created_at` (its publication time)."""
        rows = [
            {
                "source_key": item.source_key,
                "generation": item.generation,
                "lease_token": item.lease_token,
            }
            for item in prepared
        ]
        statement = _write_lease_statement(self.dialect)
        found = self.execute(statement, _LEASE_ROWS, rows)
        return {row.source_key: row.created_at for row in found}

    def insert_occurrences(
        self, prepared: Sequence[_Prepared], leased_at: Mapping[str, str]
    ) -> None:
        rows = [
            row
            for item in prepared
            for row in _occurrence_rows(
                item.source_key,
                item.generation,
                item.publication.source.occurrences,
                leased_at[item.source_key],
            )
        ]
        if rows:
            names = tuple(rows[0])
            statement = _occurrence_insert_statement(self.dialect, names)
            self.execute(statement, _occurrence_rows_of(names), rows)

    def insert_new(self, rows: Sequence[dict[str, Any]]) -> set[str]:
        if not rows:
            return set()
        names = tuple(rows[0])
        statement = _insert_new_statement(self.dialect, self.collection_slug, names)
        relation = _published_rows_of("new_source", names)
        return set(self.execute(statement, relation, rows).scalars())

    def update_changed(self, rows: Sequence[dict[str, Any]]) -> set[str]:
        if not rows:
            return set()
        names = tuple(rows[0])
        statement = _update_changed_statement(self.dialect, self.collection_slug, names)
        found = self.execute(statement, _published_rows_of("changed_source", names), rows)
        return set(found.scalars())

    def release_write_leases(self, prepared: Sequence[_Prepared]) -> None:
        tokens = [item.lease_token for item in prepared]
        self.connection.execute(
            delete(generation_writes).where(generation_writes.c.lease_token.in_(tokens))
        )

    # -- removal -------------------------------------------------------------------------------

    def remove(self, removals: Sequence[Removal]) -> frozenset[str]:
        """The guarded deletes, then the current occurrences of what was deleted."""
        SourceRepository._lock_cleanup(self.connection)
        rows = [
            {
                "source_key": item.expected.source_key,
                "absent_content_id": item.absent_content_id,
                **_expected_values(item.expected),
            }
            for item in removals
        ]
        statement = _removal_statement(self.dialect, self.collection_slug)
        keys = [row["source_key"] for row in rows]
        found = self.execute(statement, _REMOVAL_ROWS, rows, source_keys=keys)
        deleted = {row.source_key: row.current_generation for row in found}
        if deleted:
            self.delete_generations(deleted)
        return frozenset(deleted)

    def delete_generations(self, generations: Mapping[str, str]) -> None:
        """`SourceRepository._delete_generation` for every deleted source at once."""
        in_generation = and_(
            occurrences.c.source_key.in_(list(generations)),
            tuple_(occurrences.c.source_key, occurrences.c.generation).in_(
                list(generations.items())
            ),
        )
        self.connection.execute(
            update(occurrences).where(in_generation).values(cleanup_lease_token=None)
        )
        self.connection.execute(delete(occurrences).where(in_generation))


def _expected_values(expected: SourceRow) -> dict[str, Any]:
    return {f"expected_{name}": getattr(expected, name) for name in SOURCE_MATCH_COLUMNS}


def sources_by_key(connection: Connection, source_keys: Sequence[str]) -> dict[str, SourceRow]:
    """`find_sources` inside the caller's transaction."""
    unique = list(dict.fromkeys(source_keys))
    if not unique:
        return {}
    rows = connection.execute(select(sources).where(sources.c.source_key.in_(unique)))
    return {row.source_key: SourceRow.from_mapping(row._mapping) for row in rows}


def measure_generation_deletions(
    connection: Connection, stored: Sequence[SourceRow], limit: int
) -> dict[str, DeletionMeasurement]:
    """`measure_source_generation_deletion` for many sources in one read. It counts every row
    of each generation where the single-source read stops at `limit + 1`: both agree up to
    `limit`, and both report a source past it as exceeding it."""
    if not stored:
        return {}
    pairs = [(source.source_key, source.current_generation) for source in stored]
    size = _occurrence_bytes(connection.dialect.name)
    statement = (
        select(occurrences.c.source_key, func.count(), func.coalesce(func.sum(size), 0))
        .where(
            occurrences.c.source_key.in_([key for key, _ in pairs]),
            tuple_(occurrences.c.source_key, occurrences.c.generation).in_(pairs),
        )
        .group_by(occurrences.c.source_key)
    )
    found = {key: (int(count), int(total)) for key, count, total in connection.execute(statement)}
    measured = {}
    for key, _ in pairs:
        count, total = found.get(key, (0, 0))
        measured[key] = DeletionMeasurement(count, total, count > limit)
    return measured


def identity_is_current(connection: Connection, collection_id: str, collection_slug: str) -> bool:
    """`collection_identity_is_current` inside the caller's transaction."""
    statement = select(collections.c.id).where(
        collections.c.id == collection_id, collections.c.slug == collection_slug
    )
    return connection.execute(statement).first() is not None


def projection_is_unchanged(source: SourceProjection, expected: SourceRow) -> bool:
    """The observed row already publishes exactly this projection: a v1 projection
    fingerprint equal to the computed one, complete, without an error."""
    fingerprint = source.source_fingerprint
    return (
        isinstance(fingerprint, str)
        and _PROJECTION_FINGERPRINT.fullmatch(fingerprint) is not None
        and expected.source_fingerprint == fingerprint
        and expected.source_completeness == COMPLETE
        and expected.last_error_code is None
    )


def collection_identity_is_current(
    engine: Engine, collection_id: str, collection_slug: str
) -> bool:
    """One read of the registry: a row with exactly (id, slug) exists."""
    statement = select(collections.c.id).where(
        collections.c.id == collection_id, collections.c.slug == collection_slug
    )
    with read_transaction(engine) as connection:
        return connection.execute(statement).first() is not None


__all__ = [
    "GENERATION_WRITE_LEASE_SECONDS",
    "SOURCE_MATCH_COLUMNS",
    "BatchWriteResult",
    "DeleteResult",
    "DeletionMeasurement",
    "Publication",
    "Removal",
    "ReplaceResult",
    "SourceRepository",
    "SourceRow",
    "canonical_content_is_current",
    "collection_identity_is_current",
    "collection_is_current",
    "identity_is_current",
    "measure_generation_deletions",
    "projection_is_unchanged",
    "source_matches",
    "sources_by_key",
]
