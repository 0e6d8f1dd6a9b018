"""Canonical source projection, one source at a time: the write protocol of EmDash's
`MediaUsageRepository`.

A source row names one variant of one entry and points at its `current_generation` of
occurrence rows. A new projection is published by writing a whole new generation of
occurrences and then moving the pointer with a compare-and-swap on every column the writer
observed, so readers (which join on `current_generation`) see either the old or the new
projection, never a mix. Every write re-asserts, in the same statement, that the collection
identity is current and that the snapshot still describes the live content row; a loser leaves
its occurrences behind as an abandoned generation for the projection GC.

Each public method opens its own transactions; nothing relies on a caller's transaction. The
same protocol for many sources of one collection at once is `source_batch_writes`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    Text,
    and_,
    delete,
    exists,
    false,
    literal,
    select,
    true,
    update,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement
from ulid import ULID

from media_usage_orchestration.store.core.clock import lease_live_at_clock, timestamp_offset
from media_usage_orchestration.store.core.engine import (
    is_postgres,
    read_transaction,
    single_statement,
)
from media_usage_orchestration.store.core.predicates import registry_identity_is_current
from media_usage_orchestration.store.core.schema import (
    collections,
    dialect_insert,
    generation_writes,
    occurrences,
    sources,
)
from media_usage_orchestration.store.sources.rows import (
    content_table,
    lock_cleanup,
    occurrence_bytes,
    sources_by_key,
)
from media_usage_orchestration.values.identifiers import require_text
from media_usage_orchestration.values.source_records import (
    CANONICAL_IDENTITY_VERSION,
    GENERATION_WRITE_LEASE_SECONDS,
    NEVER_NULL_MATCH_COLUMNS,
    REVISION_COLUMN_BY_VARIANT,
    SOURCE_MATCH_COLUMNS,
    SOURCE_TYPE_CONTENT,
    DeletionMeasurement,
    OccurrenceValues,
    SourceProjection,
    SourceRow,
    occurrence_rows,
    projection_is_unchanged,
    published_values,
)

logger = logging.getLogger(__name__)

# EmDash's column default: what a row is until a successful projection says `complete`.
UNKNOWN_COMPLETENESS = "unknown"

# Far below both dialects' bind limits (13 columns per row).
OCCURRENCE_INSERT_BATCH = 500


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


# --- guards -----------------------------------------------------------------------------------


def _equals_or_null(column_, value) -> ColumnElement[bool]:
    return column_.is_(None) if value is None else column_ == value


def source_matches(expected: SourceRow) -> ColumnElement[bool]:
    """The stored row is still exactly the one observed (EmDash's `sourceMatchExpression`):
    any other writer changes at least the generation, `updated_at` or an attempt column."""
    return and_(
        *(
            sources.c[name] == getattr(expected, name)
            if name in NEVER_NULL_MATCH_COLUMNS
            else _equals_or_null(sources.c[name], getattr(expected, name))
            for name in SOURCE_MATCH_COLUMNS
        )
    )


def collection_is_current(collection_id: str | None, collection_slug: str | None):
    """Legacy (slug-keyed) sources carry no collection id and so no identity to re-check."""
    if collection_id is None:
        return true()
    return registry_identity_is_current(collection_id, collection_slug)


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
    revision_column = REVISION_COLUMN_BY_VARIANT.get(values["source_variant"])
    if (
        not values["collection_slug"]
        or not values["content_id"]
        or values["source_version"] is None
        or values["source_updated_at"] is None
        or revision_column is None
    ):
        return false()
    content = content_table(values["collection_slug"]).alias("content")
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
    content = content_table(collection_slug).alias("absent_content")
    return ~exists(select(literal(1)).select_from(content).where(content.c.id == content_id))


# --- statements -------------------------------------------------------------------------------


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


# --- repository -------------------------------------------------------------------------------


class SourceRepository:
    """The projection part of EmDash's `MediaUsageRepository`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- reads ---------------------------------------------------------------------------------

    def find_source(self, source_key: str) -> SourceRow | None:
        return self.find_sources([source_key]).get(source_key)

    def find_sources(self, source_keys: Sequence[str]) -> dict[str, SourceRow]:
        if not source_keys:
            return {}
        with read_transaction(self.engine) as connection:
            return sources_by_key(connection, source_keys)

    def measure_source_generation_deletion(
        self, source_key: str, generation: str, limit: int = 12
    ) -> DeletionMeasurement:
        """What deleting one generation would cost, reading at most `limit + 1` rows."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError("Media usage deletion measurement requires a non-negative row limit")
        with read_transaction(self.engine) as connection:
            statement = (
                select(occurrence_bytes(connection.dialect.name).label("occurrence_bytes"))
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
        with single_statement(self.engine) as connection:
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
        values = published_values(source, generation, now)
        guard = and_(
            _write_lease_is_live(source.source_key, generation, lease_token),
            collection_is_current(source.collection_id, source.collection_slug),
            canonical_content_is_current(values),
        )
        rows = occurrence_rows(source.source_key, generation, items, now)
        with self.engine.begin() as connection:
            if not self._lock_collection(connection, source):
                return False
            self._insert_occurrences(connection, rows)
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
    def _insert_occurrences(connection: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
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
            with single_statement(self.engine) as connection:
                connection.execute(statement)
        except SQLAlchemyError:
            # An unreleased lease only delays GC of this generation until it expires.
            logger.exception("Failed to release media usage generation write lease")

    # -- trust ---------------------------------------------------------------------------------

    def withdraw_trust(self, expected: SourceRow) -> bool:
        """Mark the source `expected`, only while it is still exactly that row, as of unknown
        completeness, so the next refresh of its entry republishes it rather than find it
        unchanged. For a row whose fingerprint still matches the content while its occurrences
        or columns do not (changed behind the write protocol's back): the unchanged check reads
        only the fingerprint. Nothing else is written; False when the row has changed since."""
        statement = (
            update(sources)
            .where(
                sources.c.source_key == expected.source_key,
                source_matches(expected),
                collection_is_current(expected.collection_id, expected.collection_slug),
            )
            .values(source_completeness=UNKNOWN_COMPLETENESS, updated_at=timestamp_offset(0))
        )
        with self.engine.begin() as connection:
            return connection.execute(statement).rowcount == 1

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
            lock_cleanup(connection)
            if connection.execute(statement).rowcount == 0:
                return False
            self._delete_generation(connection, source_key, expected.current_generation)
        return True

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
        content = content_table(collection_slug)
        statement = select(content.c.id).where(content.c.id == content_id).limit(1)
        with read_transaction(self.engine) as connection:
            return connection.execute(statement).first() is not None


__all__ = [
    "OCCURRENCE_INSERT_BATCH",
    "UNKNOWN_COMPLETENESS",
    "DeleteResult",
    "ReplaceResult",
    "SourceRepository",
    "canonical_content_is_current",
    "collection_is_current",
    "source_matches",
]
