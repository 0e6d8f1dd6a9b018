"""A small CMS writer that changes the database the way EmDash's registry and content
repository do: collections (registry row, fields, `ec_<slug>` table, index status row),
entries, edits, trash, hard deletes and draft revisions.

The demo, the benchmark and the tests use it to produce data exactly shaped like EmDash's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import JSON, Connection, Engine, delete, func, insert, select, update
from ulid import ULID

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.capture_triggers import (
    CaptureIdentity,
    install_capture_triggers,
    verify_capture_triggers,
)
from media_usage_orchestration.store.core.clock import now
from media_usage_orchestration.store.core.schema import (
    COLLECTION_SCOPE,
    CONTENT_ADAPTER_ID,
    ContentField,
    field_column_type,
)
from media_usage_orchestration.store.host import status as status_store
from media_usage_orchestration.store.host.activation import writable_activation_state
from media_usage_orchestration.store.host.registry import collection_id_for_slug
from media_usage_orchestration.values.errors import CmsError
from media_usage_orchestration.values.identifiers import content_table_name, validate_identifier

FIELD_TYPES = frozenset(
    {
        "string",
        "text",
        "number",
        "integer",
        "boolean",
        "datetime",
        "select",
        "multiSelect",
        "portableText",
        "image",
        "file",
        "reference",
        "json",
        "slug",
        "url",
        "repeater",
    }
)


@dataclass(frozen=True)
class SubField:
    slug: str
    type: str
    label: str = ""


@dataclass(frozen=True)
class FieldSpec:
    slug: str
    type: str
    label: str = ""
    sub_fields: tuple[SubField, ...] = ()

    def validation_json(self) -> str | None:
        if self.type != "repeater":
            return None
        items = [
            {"slug": sub.slug, "type": sub.type, "label": sub.label or sub.slug.title()}
            for sub in self.sub_fields
        ]
        return json.dumps({"subFields": items}, separators=(",", ":"))


@dataclass(frozen=True)
class Collection:
    id: str
    slug: str
    fields: tuple[FieldSpec, ...] = field(default_factory=tuple)

    @property
    def table(self) -> str:
        return content_table_name(self.slug)


@dataclass(frozen=True)
class EntryStamp:
    """What an edit wrote: the entry's new version and its `updated_at` (database time)."""

    version: int
    updated_at: str


def new_id() -> str:
    return str(ULID())


def _validate_fields(fields: Sequence[FieldSpec]) -> None:
    seen: set[str] = set()
    for spec in fields:
        validate_identifier(spec.slug, "field slug")
        if spec.type not in FIELD_TYPES:
            raise CmsError(f"Unknown field type {spec.type!r}", "VALIDATION_ERROR")
        if spec.slug in seen or spec.slug in schema.SYSTEM_COLUMNS:
            raise CmsError(f"Duplicate or reserved field slug {spec.slug!r}", "VALIDATION_ERROR")
        seen.add(spec.slug)
        for sub in spec.sub_fields:
            validate_identifier(sub.slug, "repeater sub-field slug")


class CmsWriter:
    """Writes through one engine; every method is one transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- collections ----------------------------------------------------------------------

    def create_collection(
        self,
        slug: str,
        fields: Sequence[FieldSpec],
        *,
        collection_id: str | None = None,
        label: str | None = None,
    ) -> Collection:
        """EmDash's `createCollection`. Before activation: registry, fields, table and a status
        row (coverage `never`, no capture). After activation, EmDash's capture sequence - status
        `installing` -> table -> exact triggers -> `ready` -> registry -> `active` - runs in one
        transaction, so the collection never exists uncaptured."""
        validate_identifier(slug, "collection slug")
        content_table_name(slug)
        _validate_fields(fields)
        collection = Collection(collection_id or new_id(), slug, tuple(fields))
        columns = [ContentField(spec.slug, field_column_type(spec.type)) for spec in fields]
        with self.engine.begin() as connection:
            state = writable_activation_state(connection, share_lock=True)
            self._refuse_held_slug(connection, slug)
            if state == "active":
                self._create_captured(connection, collection, columns, label)
            else:
                self._insert_registry(connection, collection, label)
                schema.create_content_table(connection, slug, columns)
                self._upsert_legacy_status(connection, collection)
        return collection

    def _create_captured(self, connection, collection, columns, label) -> None:
        identity = CaptureIdentity(collection.id, collection.slug)
        status_store.insert_installing_for_new_collection(
            connection, collection.id, collection.slug
        )
        schema.create_content_table(connection, collection.slug, columns)
        install_capture_triggers(connection, identity, replace_existing=False)
        if not verify_capture_triggers(connection, identity):
            raise CmsError("Capture trigger verification failed", "MEDIA_USAGE_CAPTURE_FAILED")
        status_store.mark_capture_ready(connection, collection.id, collection.slug)
        self._insert_registry(connection, collection, label)
        status_store.finalize_collection_capture(connection, collection.id, collection.slug)

    def _refuse_held_slug(self, connection: Connection, slug: str) -> None:
        # The slug lock is checked before and again after the registry read, as EmDash does:
        # a tombstone written while the registry was being read still refuses the create.
        self._refuse_tombstoned_slug(connection, slug)
        registered_id = collection_id_for_slug(connection, slug)
        self._refuse_tombstoned_slug(connection, slug)
        if registered_id is not None:
            raise CmsError(f"Collection {slug!r} already exists", "COLLECTION_EXISTS")

    @staticmethod
    def _refuse_tombstoned_slug(connection: Connection, slug: str) -> None:
        tombstone = connection.execute(
            select(schema.collection_deletions.c.collection_id).where(
                schema.collection_deletions.c.collection_slug == slug
            )
        ).first()
        if tombstone is not None:
            raise CmsError(
                f"Collection {slug!r} is still being deleted; the slug is held until it finishes",
                "COLLECTION_EXISTS",
            )

    def _insert_registry(
        self, connection: Connection, collection: Collection, label: str | None
    ) -> None:
        connection.execute(
            insert(schema.collections).values(
                id=collection.id,
                slug=collection.slug,
                label=label or collection.slug,
                supports=json.dumps(["drafts", "revisions"], separators=(",", ":")),
                source="manual",
            )
        )
        for order, spec in enumerate(collection.fields):
            self._insert_field(connection, collection.id, spec, order)

    def _insert_field(
        self, connection: Connection, collection_id: str, spec: FieldSpec, order: int
    ) -> None:
        connection.execute(
            insert(schema.fields).values(
                id=new_id(),
                collection_id=collection_id,
                slug=spec.slug,
                label=spec.label or spec.slug.title(),
                type=spec.type,
                column_type=field_column_type(spec.type),
                validation=spec.validation_json(),
                sort_order=order,
            )
        )

    def _upsert_legacy_status(self, connection: Connection, collection: Collection) -> None:
        status = schema.index_status
        connection.execute(
            schema.dialect_insert(connection, status)
            .values(
                adapter_id=CONTENT_ADAPTER_ID,
                scope_type=COLLECTION_SCOPE,
                scope_key=collection.slug,
                status="never",
                collection_id=collection.id,
                updated_at=now(),
            )
            .on_conflict_do_nothing()
        )

    def collection(self, slug: str) -> Collection:
        with self.engine.connect() as connection:
            return load_collection(connection, slug)

    def add_field(self, slug: str, spec: FieldSpec) -> None:
        """A schema change: a new field and its column; once capture is active the collection's
        coverage becomes untrusted (EmDash's `invalidateIndexStatusForSchemaChange`)."""
        _validate_fields([spec])
        with self.engine.begin() as connection:
            state = writable_activation_state(connection, share_lock=True)
            collection = load_collection(connection, slug)
            order = len(collection.fields)
            self._insert_field(connection, collection.id, spec, order)
            schema.add_content_column(
                connection, slug, ContentField(spec.slug, field_column_type(spec.type))
            )
            if state == "active":
                status_store.invalidate_for_schema_change(connection, collection.id, slug)

    # -- entries --------------------------------------------------------------------------

    def insert_entries(self, slug: str, entries: Iterable[Mapping[str, Any]]) -> list[str]:
        """Insert entries in one transaction (one multi-row statement, like an import)."""
        table = self._table(slug)
        entries = list(entries)
        if not entries:
            return []
        with self.engine.begin() as connection:
            writable_activation_state(connection)
            stamp = connection.execute(select(now())).scalar_one()
            rows = [self._entry_row(table, entry, stamp) for entry in entries]
            connection.execute(insert(table), rows)
        return [row["id"] for row in rows]

    def insert_entry(self, slug: str, entry: Mapping[str, Any]) -> str:
        return self.insert_entries(slug, [entry])[0]

    def update_entry(self, slug: str, content_id: str, values: Mapping[str, Any]) -> EntryStamp:
        """An edit: new values, `version + 1`, `updated_at` = database time; returns the
        version and time the edit's transaction wrote."""
        table = self._table(slug)
        changes = {key: _column_value(table, key, value) for key, value in values.items()}
        with self.engine.begin() as connection:
            writable_activation_state(connection)
            written = connection.execute(
                update(table)
                .where(table.c.id == content_id)
                .values(**changes, version=func.coalesce(table.c.version, 1) + 1, updated_at=now())
                .returning(table.c.version, table.c.updated_at)
            ).all()
            if len(written) != 1:
                raise CmsError(f"Entry {content_id!r} not found in {slug!r}", "NOT_FOUND")
        return EntryStamp(written[0].version, written[0].updated_at)

    def trash_entry(self, slug: str, content_id: str) -> None:
        with self.engine.connect() as connection:
            stamp = connection.execute(select(now())).scalar_one()
        self.update_entry(slug, content_id, {"deleted_at": stamp})

    def delete_entry(self, slug: str, content_id: str) -> None:
        """A permanent delete."""
        table = self._table(slug)
        with self.engine.begin() as connection:
            writable_activation_state(connection)
            connection.execute(delete(table).where(table.c.id == content_id))

    def save_draft(self, slug: str, content_id: str, data: Mapping[str, Any]) -> str:
        """A draft revision (`revisions` row) referenced by `draft_revision_id`."""
        revision_id = new_id()
        table = self._table(slug)
        with self.engine.begin() as connection:
            writable_activation_state(connection)
            connection.execute(
                insert(schema.revisions).values(
                    id=revision_id,
                    collection=slug,
                    entry_id=content_id,
                    data=json.dumps(dict(data), separators=(",", ":"), ensure_ascii=False),
                )
            )
            connection.execute(
                update(table)
                .where(table.c.id == content_id)
                .values(
                    draft_revision_id=revision_id,
                    version=func.coalesce(table.c.version, 1) + 1,
                    updated_at=now(),
                )
            )
        return revision_id

    def _table(self, slug: str):
        collection = self.collection(slug)
        return schema.content_table(
            slug,
            [ContentField(spec.slug, field_column_type(spec.type)) for spec in collection.fields],
        )

    def _entry_row(self, table, entry: Mapping[str, Any], stamp: str) -> dict[str, Any]:
        row = {key: _column_value(table, key, value) for key, value in entry.items()}
        row.setdefault("id", new_id())
        row.setdefault("created_at", stamp)
        row.setdefault("updated_at", stamp)
        row.setdefault("status", "draft")
        row.setdefault("locale", "en")
        row.setdefault("translation_group", row["id"])
        row.setdefault("version", 1)
        return row


def _column_value(table, key: str, value: Any) -> Any:
    """Media objects in TEXT columns are stored as compact JSON text, as EmDash stores them;
    `json` columns take the structure itself (the engine serializes it compactly)."""
    if key not in table.c:
        raise CmsError(f"Unknown column {key!r} for {table.name}", "VALIDATION_ERROR")
    if isinstance(value, (dict, list)) and not isinstance(table.c[key].type, JSON):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return value


def load_collection(connection: Connection, slug: str) -> Collection:
    collection_id = collection_id_for_slug(connection, slug)
    if collection_id is None:
        raise CmsError(f"Collection {slug!r} not found", "COLLECTION_NOT_FOUND")
    rows = connection.execute(
        select(schema.fields.c.slug, schema.fields.c.type, schema.fields.c.validation)
        .where(schema.fields.c.collection_id == collection_id)
        .order_by(schema.fields.c.sort_order, schema.fields.c.slug)
    ).all()
    specs = []
    for row in rows:
        subs: tuple[SubField, ...] = ()
        if row.type == "repeater" and row.validation:
            try:
                parsed = json.loads(row.validation)
                subs = tuple(
                    SubField(item["slug"], item["type"], item.get("label", ""))
                    for item in parsed.get("subFields", [])
                )
            except (ValueError, KeyError, TypeError, AttributeError):
                subs = ()
        specs.append(FieldSpec(row.slug, row.type, sub_fields=subs))
    return Collection(collection_id, slug, tuple(specs))
