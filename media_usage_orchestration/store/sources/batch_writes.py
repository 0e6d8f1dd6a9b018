"""Canonical source projection for many sources of one collection at once.

The single-row protocol (`source_writes.SourceRepository`) writes each source in transactions
of its own; `write_collection_batch` writes a batch in a fixed number of statements, with the
rows bound as JSON relations (`JsonRows`): the write leases in a statement of their own, then
the occurrences, the new and the changed sources, the lease release and the removals in one
transaction. No transaction stays open while the rows are built, and none relies on isolation
between its statements: each write carries its guards. The single-row functions and methods
that the docstrings below name are those of `source_writes`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    Text,
    and_,
    bindparam,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement

from media_usage_orchestration.store.core.clock import lease_live_at_clock, timestamp_offset
from media_usage_orchestration.store.core.engine import guarded_writes_together, single_statement
from media_usage_orchestration.store.core.id_lists import in_text_list
from media_usage_orchestration.store.core.json_rows import JsonRows
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
    execute_many,
    lock_cleanup,
    occurrence_bytes,
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
    SourceProjection,
    SourceRow,
    new_ulids,
    occurrence_rows,
    published_values,
)

logger = logging.getLogger(__name__)


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


def write_collection_batch(
    engine: Engine,
    collection_id: str,
    collection_slug: str,
    publications: Sequence[Publication],
    removals: Sequence[Removal] = (),
    then: Callable[[Connection, BatchWriteResult], None] | None = None,
) -> BatchWriteResult:
    """`replace_source_if_matching` and the guarded deletes for many canonical sources of
    one collection, in a fixed number of statements: every row keeps its own guards (its
    write lease, its expected columns, its content row), so each row lands or not exactly as
    it would alone.

    The write leases are taken in a statement of their own (as one by one) and the rows
    built and bound with no transaction open. Then one transaction writes the occurrences,
    each kind of source write, the lease release and the removals (as `_delete_source`),
    and runs `then` with what landed (the work's completion, which must commit with the
    writes it reports). Nothing relies on isolation between those statements, only on the
    guards each one carries; committing them together spares a commit per statement, and a
    generation can no longer be seen before its source's write. Should the transaction
    fail, nothing of it landed and the leases are released on their own."""
    require_text(collection_id, "Media usage batch writes require a collection ID")
    _require_batch_members(collection_id, collection_slug, publications, removals)
    identity = {
        _BATCH_COLLECTION_ID.key: collection_id,
        _BATCH_COLLECTION_SLUG.key: collection_slug,
    }
    leased = _take_write_leases(engine, identity, _Prepared.all_of(publications))
    try:
        bound = _BoundPublications.of(engine.dialect.name, leased) if leased else None
        with guarded_writes_together(engine) as connection:
            batch = _CollectionBatch(connection, collection_slug, identity)
            published = batch.publish(bound) if bound is not None else frozenset()
            _release_in(connection, leased)
            ready = [removal for removal in removals if removal.after <= published]
            result = BatchWriteResult(published, batch.remove(ready) if ready else frozenset())
            if then is not None:
                then(connection, result)
    except BaseException:
        _release_write_leases(engine, leased)
        raise
    return result


# --- guards -----------------------------------------------------------------------------------


def _source_matches_rows(rows) -> ColumnElement[bool]:
    """`source_matches` against each batch row's `expected_<column>` values, NULL-safely."""
    return and_(
        *(
            sources.c[name] == rows.c[f"expected_{name}"]
            if name in NEVER_NULL_MATCH_COLUMNS
            else sources.c[name].is_not_distinct_from(rows.c[f"expected_{name}"])
            for name in SOURCE_MATCH_COLUMNS
        )
    )


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
    content = content_table(collection_slug).alias("content")
    revision_matches = or_(
        *(
            and_(
                rows.c.source_variant == variant,
                content.c[revision_column].is_not_distinct_from(rows.c.revision_id),
            )
            for variant, revision_column in REVISION_COLUMN_BY_VARIANT.items()
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
    content = content_table(collection_slug).alias("absent_content")
    return or_(
        rows.c.absent_content_id.is_(None),
        ~exists(
            select(literal(1)).select_from(content).where(content.c.id == rows.c.absent_content_id)
        ),
    )


# --- statements -------------------------------------------------------------------------------

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
        # The attributes themselves: the row is built once, when it is bound.
        source = item.source
        if source.identity_version != CANONICAL_IDENTITY_VERSION or (
            source.source_type != SOURCE_TYPE_CONTENT
        ):
            raise ValueError("A media usage batch publishes only canonical content sources")


def _batch_identity_is_current() -> ColumnElement[bool]:
    return registry_identity_is_current(_BATCH_COLLECTION_ID, _BATCH_COLLECTION_SLUG)


def _batch_identity_is_current_and_held(dialect_name: str) -> ColumnElement[bool]:
    """The collection identity is current and, on PostgreSQL, its registry row stays
    share-locked until the statement commits (`SourceRepository._lock_collection`), so the
    collection cannot be removed between this guard and the publication's commit."""
    if dialect_name != "postgresql":
        return _batch_identity_is_current()
    registry = collections.alias("held_collection")
    return exists(
        select(literal(1))
        .select_from(registry)
        .where(registry.c.id == _BATCH_COLLECTION_ID, registry.c.slug == _BATCH_COLLECTION_SLUG)
        .with_for_update(read=True, key_share=True)
    )


def _publication_guard(dialect_name: str, collection_slug: str, rows) -> ColumnElement[bool]:
    """The publication guard of each row: its live write lease, the collection identity (its
    registry row held), and its content row still as snapshotted."""
    return and_(
        _rows_write_lease_is_live(rows),
        _batch_identity_is_current_and_held(dialect_name),
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


# SQLite's occurrence rows go to the driver's `executemany` (see `insert_occurrences`).
_OCCURRENCE_INSERT = occurrences.insert()


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
        _publication_guard(dialect_name, collection_slug, rows)
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
            _publication_guard(dialect_name, collection_slug, rows),
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
            in_text_list(sources.c.source_key, "source_keys"),
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
    generation: str
    lease_token: str
    # The database time its write lease was granted at: the publication's timestamps.
    leased_at: str = ""

    @classmethod
    def all_of(cls, publications: Sequence[Publication]) -> list[_Prepared]:
        """Each publication with a fresh generation and write-lease token."""
        ids = new_ulids(2 * len(publications))
        return [
            cls(publication, ids[2 * index], ids[2 * index + 1])
            for index, publication in enumerate(publications)
        ]

    @property
    def source_key(self) -> str:
        return self.publication.source.source_key

    def row(self) -> dict[str, Any]:
        values = published_values(self.publication.source, self.generation, self.leased_at)
        values["lease_token"] = self.lease_token
        if self.publication.expected is not None:
            values.update(_expected_values(self.publication.expected))
        return values


def _take_write_leases(
    engine: Engine, identity: Mapping[str, str], prepared: Sequence[_Prepared]
) -> list[_Prepared]:
    """One write lease per source in one statement, granted only while the collection
    identity is current (`_take_write_lease`); returns the granted ones, each with its lease's
    `created_at` (its publication time)."""
    if not prepared:
        return []
    rows = [
        {
            "source_key": item.source_key,
            "generation": item.generation,
            "lease_token": item.lease_token,
        }
        for item in prepared
    ]
    with single_statement(engine) as connection:
        dialect = connection.dialect.name
        found = connection.execute(
            _write_lease_statement(dialect), {**identity, **_LEASE_ROWS.bind(dialect, rows)}
        ).all()
    leased_at = {row.source_key: row.created_at for row in found}
    return [
        replace(item, leased_at=leased_at[item.source_key])
        for item in prepared
        if item.source_key in leased_at
    ]


_RELEASE_WRITE_LEASES = delete(generation_writes).where(
    in_text_list(generation_writes.c.lease_token, "lease_tokens")
)


def _release_in(connection: Connection, leased: Sequence[_Prepared]) -> None:
    """`_release_write_lease` for every lease of the batch in one statement."""
    if leased:
        tokens = [item.lease_token for item in leased]
        connection.execute(_RELEASE_WRITE_LEASES, {"lease_tokens": tokens})


def _release_write_leases(engine: Engine, leased: Sequence[_Prepared]) -> None:
    """The batch's leases released on their own, after its transaction failed."""
    if not leased:
        return
    try:
        with single_statement(engine) as connection:
            _release_in(connection, leased)
    except SQLAlchemyError:
        # An unreleased lease only delays GC of these generations until it expires.
        logger.exception("Failed to release media usage generation write leases")


@dataclass(frozen=True)
class _Bound:
    """One statement's shape (its column names) and its bound rows."""

    names: tuple[str, ...]
    parameters: Any


@dataclass(frozen=True)
class _BoundPublications:
    """The leased publications' rows, built and bound before their transaction begins:
    occurrences, sources observed absent (inserted) and present (updated)."""

    occurrences: _Bound | None
    new: _Bound | None
    changed: _Bound | None

    @classmethod
    def of(cls, dialect: str, leased: Sequence[_Prepared]) -> _BoundPublications:
        rows = [item.row() for item in leased]
        return cls(
            _bind_occurrences(dialect, leased),
            _bind_sources(dialect, "new_source", [r for r in rows if _is_new(r)]),
            _bind_sources(dialect, "changed_source", [r for r in rows if not _is_new(r)]),
        )


def _is_new(row: Mapping[str, Any]) -> bool:
    return "expected_current_generation" not in row


def _bind_occurrences(dialect: str, leased: Sequence[_Prepared]) -> _Bound | None:
    """Occurrences of the fresh generations, for one statement (no guard of their own: a
    generation is only published by its source's guarded write, and collected if not).

    SQLite re-parses a JSON row's text for every value it extracts, so there the rows go to
    the driver's `executemany`; PostgreSQL reads a JSON relation in one pass, faster than one
    execution per row."""
    ids = iter(new_ulids(sum(len(item.publication.source.occurrences) for item in leased)))
    rows = [
        row
        for item in leased
        for row in occurrence_rows(
            item.source_key,
            item.generation,
            item.publication.source.occurrences,
            item.leased_at,
            [next(ids) for _ in item.publication.source.occurrences],
        )
    ]
    if not rows:
        return None
    names = tuple(rows[0])
    if dialect == "sqlite":
        return _Bound(names, rows)
    return _Bound(names, _occurrence_rows_of(names).bind(dialect, rows))


def _bind_sources(dialect: str, relation: str, rows: Sequence[dict[str, Any]]) -> _Bound | None:
    if not rows:
        return None
    names = tuple(rows[0])
    return _Bound(names, _published_rows_of(relation, names).bind(dialect, rows))


class _CollectionBatch:
    """The statements of one batch for the collection (collection_id, slug)."""

    def __init__(
        self, connection: Connection, collection_slug: str, identity: Mapping[str, str]
    ) -> None:
        self.connection = connection
        self.dialect = connection.dialect.name
        self.collection_slug = collection_slug
        self.identity = identity

    def execute(self, statement, parameters: Mapping[str, Any]):
        return self.connection.execute(statement, {**self.identity, **parameters})

    # -- publication ---------------------------------------------------------------------------

    def publish(self, bound: _BoundPublications) -> frozenset[str]:
        self.insert_occurrences(bound.occurrences)
        return frozenset(self.insert_new(bound.new) | self.update_changed(bound.changed))

    def insert_occurrences(self, bound: _Bound | None) -> None:
        if bound is None:
            return
        if self.dialect == "sqlite":
            execute_many(self.connection, _OCCURRENCE_INSERT, bound.parameters, bound.names)
        else:
            statement = _occurrence_insert_statement(self.dialect, bound.names)
            self.execute(statement, bound.parameters)

    def insert_new(self, bound: _Bound | None) -> set[str]:
        if bound is None:
            return set()
        statement = _insert_new_statement(self.dialect, self.collection_slug, bound.names)
        return set(self.execute(statement, bound.parameters).scalars())

    def update_changed(self, bound: _Bound | None) -> set[str]:
        if bound is None:
            return set()
        statement = _update_changed_statement(self.dialect, self.collection_slug, bound.names)
        return set(self.execute(statement, bound.parameters).scalars())

    # -- removal -------------------------------------------------------------------------------

    def remove(self, removals: Sequence[Removal]) -> frozenset[str]:
        """The guarded deletes, then the current occurrences of what was deleted."""
        lock_cleanup(self.connection)
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
        bound = _REMOVAL_ROWS.bind(self.dialect, rows)
        found = self.execute(statement, {**bound, "source_keys": keys})
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


# --- reads --------------------------------------------------------------------------------------


def measure_generation_deletions(
    connection: Connection, stored: Sequence[SourceRow], limit: int
) -> dict[str, DeletionMeasurement]:
    """`measure_source_generation_deletion` for many sources in one read. It counts every row
    of each generation where the single-source read stops at `limit + 1`: both agree up to
    `limit`, and both report a source past it as exceeding it."""
    if not stored:
        return {}
    pairs = [(source.source_key, source.current_generation) for source in stored]
    size = occurrence_bytes(connection.dialect.name)
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


__all__ = [
    "BatchWriteResult",
    "Publication",
    "Removal",
    "measure_generation_deletions",
    "write_collection_batch",
]
