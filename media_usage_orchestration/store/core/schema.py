"""EmDash's media usage schema (spec section 3) as SQLAlchemy Core tables, and its installer.

Table, column, default, constraint and index names are EmDash's own, so the project runs on a
database EmDash created (`fixtures/emdash-schema.*.sql` is the ground truth) and EmDash can run
on one the project created. The installer is idempotent: it creates what is missing (tables,
columns, indexes, seed rows) and leaves everything else alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Connection,
    Engine,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    inspect,
    text,
)
from sqlalchemy import column as sql_column
from sqlalchemy import table as sql_table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateColumn
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.selectable import TableClause

from media_usage_orchestration.store.core.cleanup_fence import install_cleanup_fence
from media_usage_orchestration.store.core.clock import (
    POSTGRES_CLOCK_UTC,
    postgres_time_text,
    sqlite_time_text,
)
from media_usage_orchestration.values.identifiers import (
    content_table_name,
    quote_identifier,
    validate_identifier,
)

ACTIVATION_KEY = "incremental_capture"
CLEANUP_TASK_KEY = "projection_gc"
CONTENT_ADAPTER_ID = "content-media"
COLLECTION_SCOPE = "collection"


class _sortable_now_default(FunctionElement):
    """EmDash's "sortable-now" column default."""

    type = Text()
    inherit_cache = True
    name = "sortable_now_default"


@compiles(_sortable_now_default, "postgresql")
def _sortable_now_postgres(element, compiler, **kw):
    return postgres_time_text(f"({POSTGRES_CLOCK_UTC})")


@compiles(_sortable_now_default, "sqlite")
def _sortable_now_sqlite(element, compiler, **kw):
    return sqlite_time_text()


class _current_timestamp_default(FunctionElement):
    """Kysely's `currentTimestamp` default of the older tables (046/050/061)."""

    type = Text()
    inherit_cache = True
    name = "current_timestamp_default"


@compiles(_current_timestamp_default, "postgresql")
def _current_timestamp_postgres(element, compiler, **kw):
    return "CURRENT_TIMESTAMP"


@compiles(_current_timestamp_default, "sqlite")
def _current_timestamp_sqlite(element, compiler, **kw):
    return "datetime('now')"


def _sortable_now() -> _sortable_now_default:
    return _sortable_now_default()


def _current_timestamp() -> _current_timestamp_default:
    return _current_timestamp_default()


def _literal_default(value: str | int) -> text:
    return text(f"'{value}'") if isinstance(value, str) else text(str(value))


metadata = MetaData()

collections = Table(
    "_emdash_collections",
    metadata,
    Column("id", Text, primary_key=True, nullable=True),
    Column("slug", Text, nullable=False, unique=True),
    Column("label", Text, nullable=False),
    Column("label_singular", Text),
    Column("description", Text),
    Column("icon", Text),
    Column("supports", Text),
    Column("source", Text),
    Column("created_at", Text, server_default=_current_timestamp()),
    Column("updated_at", Text, server_default=_current_timestamp()),
    Column("search_config", Text),
    Column("has_seo", Integer, nullable=False, server_default=_literal_default(0)),
    Column("url_pattern", Text),
    Column("comments_enabled", Integer, server_default=_literal_default(0)),
    Column("comments_moderation", Text, server_default=_literal_default("first_time")),
    Column("comments_closed_after_days", Integer, server_default=_literal_default(90)),
    Column("comments_auto_approve_users", Integer, server_default=_literal_default(1)),
    Column("hidden", Integer, nullable=False, server_default=_literal_default(0)),
    Column("sort_order", Integer),
    Column("admin_config", Text),
    Column("title_field", Text),
    Column("date_field", Text),
    Column("routable", Integer, nullable=False, server_default=_literal_default(1)),
)

fields = Table(
    "_emdash_fields",
    metadata,
    Column("id", Text, primary_key=True, nullable=True),
    Column(
        "collection_id",
        Text,
        ForeignKey("_emdash_collections.id", ondelete="CASCADE", name="fields_collection_fk"),
        nullable=False,
    ),
    Column("slug", Text, nullable=False),
    Column("label", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("column_type", Text, nullable=False),
    Column("required", Integer, server_default=_literal_default(0)),
    Column("unique", Integer, server_default=_literal_default(0)),
    Column("default_value", Text),
    Column("validation", Text),
    Column("widget", Text),
    Column("options", Text),
    Column("sort_order", Integer, server_default=_literal_default(0)),
    Column("created_at", Text, server_default=_current_timestamp()),
    Column("searchable", Integer, server_default=_literal_default(0)),
    Column("translatable", Integer, nullable=False, server_default=_literal_default(1)),
    Column("indexed", Integer, nullable=False, server_default=_literal_default(0)),
    Index("idx_fields_collection", "collection_id"),
    Index("idx_fields_collection_slug", "collection_id", "slug", unique=True),
    Index("idx_fields_sort", "collection_id", "sort_order"),
)

revisions = Table(
    "revisions",
    metadata,
    Column("id", Text, primary_key=True, nullable=True),
    Column("collection", Text, nullable=False),
    Column("entry_id", Text, nullable=False),
    Column("data", Text, nullable=False),
    Column("author_id", Text),
    Column("created_at", Text, server_default=_current_timestamp()),
    Index("idx_revisions_entry", "collection", "entry_id"),
)

sources = Table(
    "_emdash_media_usage_sources",
    metadata,
    Column("source_key", Text, primary_key=True, nullable=True),
    Column("source_type", Text, nullable=False),
    Column("collection_slug", Text),
    Column("content_id", Text),
    Column("source_variant", Text, nullable=False),
    Column("locale", Text),
    Column("translation_group", Text),
    Column("content_slug", Text),
    Column("content_title", Text),
    Column("content_status", Text),
    Column("content_scheduled_at", Text),
    Column("content_deleted_at", Text),
    Column("revision_id", Text),
    Column("current_generation", Text, nullable=False),
    Column("schema_version", Integer, nullable=False, server_default=_literal_default(1)),
    Column("indexed_at", Text, nullable=False, server_default=_current_timestamp()),
    Column("created_at", Text, server_default=_current_timestamp()),
    Column("updated_at", Text, server_default=_current_timestamp()),
    Column("source_updated_at", Text),
    Column("source_version", Integer),
    Column("source_fingerprint", Text),
    Column("source_completeness", Text, nullable=False, server_default=_literal_default("unknown")),
    Column("last_attempted_at", Text),
    Column("last_error_code", Text),
    Column("collection_id", Text),
    Column("identity_version", Integer),
    Index(
        "idx__emdash_media_usage_sources_content", "source_type", "collection_slug", "content_id"
    ),
    Index("idx__emdash_media_usage_sources_variant", "source_type", "source_variant"),
    Index("idx__emdash_media_usage_sources_locale", "collection_slug", "locale"),
    Index("idx__emdash_media_usage_sources_deleted", "content_deleted_at"),
    Index(
        "idx__emdash_media_usage_sources_translation_group", "collection_slug", "translation_group"
    ),
    Index(
        "idx__emdash_media_usage_sources_completeness",
        "source_type",
        "collection_slug",
        "source_completeness",
    ),
    Index("idx__emdash_media_usage_sources_fingerprint", "source_fingerprint"),
    Index(
        "idx__emdash_media_usage_sources_identity",
        "source_type",
        "collection_id",
        "content_id",
        "source_variant",
    ),
    Index(
        "idx__emdash_media_usage_sources_collection_cursor",
        "source_type",
        "collection_id",
        "source_key",
    ),
)

occurrences = Table(
    "_emdash_media_usage",
    metadata,
    Column("id", Text, primary_key=True, nullable=True),
    Column("source_key", Text, nullable=False),
    Column("generation", Text, nullable=False),
    Column("field_slug", Text, nullable=False),
    Column("field_path", Text, nullable=False),
    Column("occurrence_index", Integer, nullable=False, server_default=_literal_default(0)),
    Column("reference_type", Text, nullable=False),
    Column("media_id", Text),
    Column("provider", Text, nullable=False, server_default=_literal_default("local")),
    Column("provider_asset_id", Text, nullable=False),
    Column("media_kind", Text),
    Column("mime_type", Text),
    Column("created_at", Text, server_default=_current_timestamp()),
    Column("cleanup_lease_token", Text),
    Index(
        "idx__emdash_media_usage_unique_occurrence",
        "source_key",
        "generation",
        "field_path",
        "occurrence_index",
        unique=True,
    ),
    Index(
        "idx__emdash_media_usage_media_source_generation", "media_id", "source_key", "generation"
    ),
    Index("idx__emdash_media_usage_provider_asset", "provider", "provider_asset_id"),
    Index("idx__emdash_media_usage_source_generation", "source_key", "generation"),
    Index("idx__emdash_media_usage_cleanup_scan", "created_at", "id", "source_key", "generation"),
    Index("idx__emdash_media_usage_source_cursor", "source_key", "id"),
)

index_status = Table(
    "_emdash_media_usage_index_status",
    metadata,
    Column("adapter_id", Text, nullable=False),
    Column("scope_type", Text, nullable=False),
    Column("scope_key", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("schema_version", Integer, nullable=False, server_default=_literal_default(1)),
    Column("started_at", Text),
    Column("completed_at", Text),
    Column("cursor", Text),
    Column("indexed_source_count", Integer, nullable=False, server_default=_literal_default(0)),
    Column("failed_source_count", Integer, nullable=False, server_default=_literal_default(0)),
    Column("last_error_code", Text),
    Column("updated_at", Text, nullable=False, server_default=_current_timestamp()),
    Column("collection_id", Text),
    Column("change_epoch", BigInteger, nullable=False, server_default=_literal_default(0)),
    Column("reconciliation_required", Integer, nullable=False, server_default=_literal_default(0)),
    Column("last_incremental_success_at", Text),
    Column("capture_state", Text),
    PrimaryKeyConstraint(
        "adapter_id", "scope_type", "scope_key", name="_emdash_media_usage_index_status_pk"
    ),
    Index("idx__emdash_media_usage_index_status_status", "adapter_id", "status"),
    Index(
        "idx__emdash_media_usage_status_collection",
        "adapter_id",
        "scope_type",
        "collection_id",
        unique=True,
    ),
    Index(
        "idx__emdash_media_usage_status_reconciliation",
        "adapter_id",
        "scope_type",
        "capture_state",
        "reconciliation_required",
        "collection_id",
    ),
)

activation = Table(
    "_emdash_media_usage_activation",
    metadata,
    Column("task_key", Text, primary_key=True, nullable=True),
    Column("state", Text, nullable=False, server_default=_literal_default("expanded")),
    Column("runtime_generation", Integer, nullable=False, server_default=_literal_default(1)),
    Column("collection_cursor", Text),
    Column("drain_confirmed_at", Text),
    Column("lease_token", Text),
    Column("lease_expires_at", Text),
    Column("attempt_count", Integer, nullable=False, server_default=_literal_default(0)),
    Column("last_attempted_at", Text),
    Column("last_error_code", Text),
    Column("activated_at", Text),
    Column("created_at", Text, nullable=False, server_default=_sortable_now()),
    Column("updated_at", Text, nullable=False, server_default=_sortable_now()),
    Column(
        "media_usage_maintenance_turn", Integer, nullable=False, server_default=_literal_default(2)
    ),
)

work = Table(
    "_emdash_media_usage_work",
    metadata,
    Column("collection_id", Text, nullable=False),
    Column("collection_slug", Text, nullable=False),
    Column("content_id", Text, nullable=False),
    Column("change_epoch", BigInteger, nullable=False),
    Column("work_version", BigInteger, nullable=False, server_default=_literal_default(1)),
    Column("state", Text, nullable=False, server_default=_literal_default("pending")),
    Column("attempt_count", Integer, nullable=False, server_default=_literal_default(0)),
    Column("next_attempt_at", Text, nullable=False),
    Column("lease_token", Text),
    Column("lease_expires_at", Text),
    Column("last_attempted_at", Text),
    Column("last_error_code", Text),
    Column("created_at", Text, nullable=False, server_default=_sortable_now()),
    Column("updated_at", Text, nullable=False, server_default=_sortable_now()),
    PrimaryKeyConstraint("collection_id", "content_id", name="_emdash_media_usage_work_pk"),
    Index(
        "idx__emdash_media_usage_work_due",
        "state",
        "next_attempt_at",
        "updated_at",
        "collection_id",
        "content_id",
    ),
    Index(
        "idx__emdash_media_usage_work_lease",
        "state",
        "lease_expires_at",
        "collection_id",
        "content_id",
    ),
    Index(
        "idx__emdash_media_usage_work_operator",
        "collection_id",
        "state",
        "updated_at",
        "content_id",
    ),
)

reconciliations = Table(
    "_emdash_media_usage_reconciliations",
    metadata,
    Column("collection_id", Text, primary_key=True),
    Column("collection_slug", Text, nullable=False),
    Column("run_token", Text, nullable=False),
    Column("target_epoch", BigInteger),
    Column("field_fingerprint", Text),
    Column("state", Text, nullable=False, server_default=_literal_default("pending")),
    Column("phase", Text, nullable=False, server_default=_literal_default("scan")),
    Column("scan_cursor", Text),
    Column("scan_upper_id", Text),
    Column("source_cursor", Text),
    Column("source_upper_key", Text),
    Column("attempt_count", Integer, nullable=False, server_default=_literal_default(0)),
    Column("next_attempt_at", Text, nullable=False),
    Column("lease_token", Text),
    Column("lease_expires_at", Text),
    Column("last_error_code", Text),
    Column("created_at", Text, nullable=False, server_default=_sortable_now()),
    Column("updated_at", Text, nullable=False, server_default=_sortable_now()),
    Index(
        "idx__emdash_media_usage_reconciliations_due",
        "state",
        "next_attempt_at",
        "updated_at",
        "collection_id",
    ),
    Index(
        "idx__emdash_media_usage_reconciliations_lease",
        "state",
        "lease_expires_at",
        "updated_at",
        "collection_id",
    ),
    Index("idx__emdash_media_usage_reconciliations_failed", "state", "updated_at", "collection_id"),
)

collection_deletions = Table(
    "_emdash_media_usage_collection_deletions",
    metadata,
    Column("collection_id", Text, primary_key=True),
    Column("collection_slug", Text, nullable=False, unique=True),
    Column("force_delete", Integer, nullable=False),
    Column("state", Text, nullable=False, server_default=_literal_default("pending")),
    Column("phase", Text, nullable=False, server_default=_literal_default("fence")),
    Column("work_cursor", Text),
    Column("source_key", Text),
    Column("occurrence_cursor", Text),
    Column("attempt_count", Integer, nullable=False, server_default=_literal_default(0)),
    Column("next_attempt_at", Text, nullable=False),
    Column("lease_token", Text),
    Column("lease_expires_at", Text),
    Column("last_error_code", Text),
    Column("created_at", Text, nullable=False, server_default=_sortable_now()),
    Column("updated_at", Text, nullable=False, server_default=_sortable_now()),
    Index(
        "idx__emdash_media_usage_collection_deletions_due",
        "state",
        "next_attempt_at",
        "updated_at",
        "collection_id",
    ),
    Index(
        "idx__emdash_media_usage_collection_deletions_lease",
        "state",
        "lease_expires_at",
        "updated_at",
        "collection_id",
    ),
    Index(
        "idx__emdash_media_usage_collection_deletions_operator",
        "state",
        "updated_at",
        "collection_id",
    ),
)

generation_writes = Table(
    "_emdash_media_usage_generation_writes",
    metadata,
    Column("source_key", Text, nullable=False),
    Column("generation", Text, nullable=False),
    Column("lease_token", Text, primary_key=True, nullable=True),
    Column("expires_at", Text, nullable=False),
    Column("created_at", Text, nullable=False, server_default=_current_timestamp()),
    UniqueConstraint(
        "source_key", "generation", name="_emdash_media_usage_generation_writes_source_generation"
    ),
    Index("idx__emdash_media_usage_generation_writes_expiry", "expires_at", "lease_token"),
)

cleanup = Table(
    "_emdash_media_usage_cleanup",
    metadata,
    Column("task_key", Text, primary_key=True, nullable=True),
    Column("lease_token", Text),
    Column("lease_expires_at", Text),
    Column("next_eligible_at", Text, nullable=False),
    Column("cursor_created_at", Text),
    Column("cursor_id", Text),
    Column("scan_before_at", Text),
    Column("consecutive_failures", Integer, nullable=False, server_default=_literal_default(0)),
    Column("last_started_at", Text),
    Column("last_completed_at", Text),
    Column("last_candidate_count", Integer, nullable=False, server_default=_literal_default(0)),
    Column("last_deleted_orphans", Integer, nullable=False, server_default=_literal_default(0)),
    Column("last_deleted_stale", Integer, nullable=False, server_default=_literal_default(0)),
    Column("last_deleted_abandoned", Integer, nullable=False, server_default=_literal_default(0)),
    Column(
        "last_deleted_write_leases", Integer, nullable=False, server_default=_literal_default(0)
    ),
    Column("last_backlog_lower_bound", Integer, nullable=False, server_default=_literal_default(0)),
    Column("last_scan_has_more", Integer, nullable=False, server_default=_literal_default(0)),
    Column("last_duration_ms", Integer, nullable=False, server_default=_literal_default(0)),
    Column("last_error_code", Text),
    Column("updated_at", Text, nullable=False, server_default=_current_timestamp()),
)

cleanup_fence = Table(
    "_emdash_media_usage_cleanup_fence",
    metadata,
    Column("task_key", Text, primary_key=True, nullable=True),
    Column("generation_floor", Text, nullable=False),
    Column("updated_at", Text, nullable=False, server_default=_current_timestamp()),
)

EMDASH_TABLES: tuple[Table, ...] = tuple(metadata.sorted_tables)

# --- the project's own tables (`_muo_`, never a column on an EmDash table) --------------------

project_metadata = MetaData()

# One row per Dagster run that is executing against this database: its run lease. The run
# worker renews it every few seconds while its process lives; a run whose lease expired (its
# worker or code server died) is failed by the run-health sensor, so it stops holding its
# collection's place in the run queue. No EmDash code reads or writes it.
run_leases = Table(
    "_muo_run_leases",
    project_metadata,
    Column("run_id", Text, primary_key=True),
    Column("job_name", Text, nullable=False),
    Column("lease_token", Text, nullable=False),
    Column("started_at", Text, nullable=False),
    Column("heartbeat_at", Text, nullable=False),
    Column("lease_expires_at", Text, nullable=False),
    Index("idx_muo_run_leases_expires", "lease_expires_at"),
)

PROJECT_TABLES: tuple[Table, ...] = tuple(project_metadata.sorted_tables)
# Everything `media-usage init` installs: EmDash's schema, then the project's own tables.
ALL_TABLES: tuple[Table, ...] = EMDASH_TABLES + PROJECT_TABLES


# --- content tables (`ec_<slug>`) -------------------------------------------------------------

SYSTEM_COLUMNS: tuple[str, ...] = (
    "id",
    "slug",
    "status",
    "author_id",
    "primary_byline_id",
    "created_at",
    "updated_at",
    "published_at",
    "scheduled_at",
    "deleted_at",
    "version",
    "live_revision_id",
    "draft_revision_id",
    "locale",
    "translation_group",
)

# EmDash's column type per field type: media fields hold JSON text or a bare id, structured
# fields are `json`, scalars keep their natural type.
_FIELD_COLUMN_TYPES = {
    "image": "TEXT",
    "file": "TEXT",
    "portableText": "JSON",
    "repeater": "JSON",
    "json": "JSON",
    "multiSelect": "JSON",
    "number": "REAL",
    "integer": "INTEGER",
    "boolean": "INTEGER",
}


def field_column_type(field_type: str) -> str:
    return _FIELD_COLUMN_TYPES.get(field_type, "TEXT")


@dataclass(frozen=True)
class ContentField:
    slug: str
    column_type: str  # TEXT | JSON | REAL | INTEGER


def content_table(collection_slug: str, field_columns: Sequence[ContentField] = ()) -> Table:
    """A Core `Table` for `ec_<slug>` with EmDash's system columns and one column per field."""
    name = content_table_name(collection_slug)
    table_metadata = MetaData()
    Table("revisions", table_metadata, Column("id", Text, primary_key=True, nullable=True))
    columns = [
        Column("id", Text, primary_key=True, nullable=True),
        Column("slug", Text),
        Column("status", Text, server_default=_literal_default("draft")),
        Column("author_id", Text),
        Column("primary_byline_id", Text),
        Column("created_at", Text, server_default=_current_timestamp()),
        Column("updated_at", Text, server_default=_current_timestamp()),
        Column("published_at", Text),
        Column("scheduled_at", Text),
        Column("deleted_at", Text),
        Column("version", Integer, server_default=_literal_default(1)),
        Column("live_revision_id", Text, ForeignKey("revisions.id")),
        Column("draft_revision_id", Text, ForeignKey("revisions.id")),
        Column("locale", Text, nullable=False, server_default=_literal_default("en")),
        Column("translation_group", Text),
    ]
    for field in field_columns:
        validate_identifier(field.slug, "field slug")
        if field.slug in SYSTEM_COLUMNS:
            raise ValueError(f"Field slug {field.slug!r} collides with a system column")
        columns.append(Column(field.slug, _sqlalchemy_type(field.column_type)))
    return Table(
        name,
        table_metadata,
        *columns,
        UniqueConstraint("slug", "locale", name=f"{name}_slug_locale_unique"),
        Index(f"idx_{name}_deleted_updated_id", "deleted_at", "updated_at", "id"),
        Index(f"idx_{name}_deleted_status", "deleted_at", "status"),
        Index(f"idx_{name}_live_revision", "live_revision_id"),
        Index(f"idx_{name}_draft_revision", "draft_revision_id"),
        Index(f"idx_{name}_locale", "locale"),
        Index(f"idx_{name}_slug", "slug"),
        Index(f"idx_{name}_tg_locale", "translation_group", "locale"),
    )


def _sqlalchemy_type(column_type: str):
    return {"TEXT": Text, "JSON": JSON, "REAL": postgresql.DOUBLE_PRECISION, "INTEGER": Integer}[
        column_type
    ]


@compiles(postgresql.DOUBLE_PRECISION, "sqlite")
def _double_on_sqlite(element, compiler, **kw):
    return "REAL"


def create_content_table(
    connection: Connection, collection_slug: str, field_columns: Sequence[ContentField] = ()
) -> Table:
    table = content_table(collection_slug, field_columns)
    table.create(connection)
    return table


def add_content_column(connection: Connection, collection_slug: str, field: ContentField) -> None:
    table = content_table_name(collection_slug)
    column = Column(field.slug, _sqlalchemy_type(field.column_type))
    ddl = CreateColumn(column).compile(dialect=connection.dialect)
    connection.exec_driver_sql(f"ALTER TABLE {quote_identifier(table)} ADD COLUMN {ddl}")


# --- installer --------------------------------------------------------------------------------


def missing_tables(engine: Engine, tables: Iterable[Table] = EMDASH_TABLES) -> list[str]:
    """The tables of `tables` (EmDash's schema unless told) this database lacks: all of them
    before `media-usage init` on a new database; the project's own `_muo_` tables on one
    EmDash created, until `media-usage init` adds them."""
    with engine.connect() as connection:
        existing = set(inspect(connection).get_table_names())
    return [table.name for table in tables if table.name not in existing]


def install_schema(connection: Connection, tables: Iterable[Table] = ALL_TABLES) -> list[str]:
    """Create every missing table, column and index, then the seed rows; return what was added.

    Safe to run on a database EmDash created (only the project's own `_muo_` tables are added)
    and on a half-installed one.
    """
    added: list[str] = []
    inspector = inspect(connection)
    existing_tables = set(inspector.get_table_names())
    for table in tables:
        if table.name not in existing_tables:
            table.create(connection)
            added.append(f"table {table.name}")
            continue
        added.extend(_add_missing_columns(connection, table, inspector))
        added.extend(_add_missing_indexes(connection, table, inspector))
    added.extend(_seed_rows(connection))
    added.extend(install_cleanup_fence(connection))
    return added


def _add_missing_columns(connection: Connection, table: Table, inspector) -> list[str]:
    present = {column["name"] for column in inspector.get_columns(table.name)}
    added = []
    for column in table.columns:
        if column.name in present:
            continue
        ddl = CreateColumn(column).compile(dialect=connection.dialect)
        connection.exec_driver_sql(f'ALTER TABLE "{table.name}" ADD COLUMN {ddl}')
        added.append(f"column {table.name}.{column.name}")
    return added


def _add_missing_indexes(connection: Connection, table: Table, inspector) -> list[str]:
    present = {index["name"] for index in inspector.get_indexes(table.name)}
    added = []
    for index in table.indexes:
        if index.name in present:
            continue
        index.create(connection)
        added.append(f"index {index.name}")
    return added


def _seed_rows(connection: Connection) -> list[str]:
    seeds = (
        (activation, {"task_key": ACTIVATION_KEY, "state": "expanded"}),
        (cleanup, {"task_key": CLEANUP_TASK_KEY, "next_eligible_at": "1970-01-01T00:00:00.000Z"}),
    )
    added = []
    for table, values in seeds:
        # RETURNING, not rowcount: psycopg reports -1 for a Core INSERT.
        statement = _insert_ignore(connection.dialect.name, table).values(**values)
        if connection.execute(statement.returning(table.c.task_key)).first() is not None:
            added.append(f"row {table.name}.{values['task_key']}")
    return added


def _insert_ignore(dialect_name: str, table: Table):
    module = postgresql if dialect_name == "postgresql" else sqlite
    return module.insert(table).on_conflict_do_nothing()


def narrow(source: Table, *names: str) -> TableClause:
    """`source` naming only `names`: the same SQL, but an alias of it proxies just these
    columns. Guards alias a table on every statement they are built into, and proxying every
    column of a wide table costs more than running the statement."""
    return sql_table(source.name, *(sql_column(name, source.c[name].type) for name in names))


def dialect_insert(connection_or_dialect, table: Table):
    """`INSERT` with `ON CONFLICT` support for the connection's dialect (or dialect name)."""
    if isinstance(connection_or_dialect, str):
        name = connection_or_dialect
    else:
        name = getattr(connection_or_dialect, "name", None) or connection_or_dialect.dialect.name
    return (postgresql if name == "postgresql" else sqlite).insert(table)
