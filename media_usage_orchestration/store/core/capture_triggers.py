"""Capture triggers (spec section 4): every content write enqueues work in the writer's own
transaction, or is refused when capture is not active for the exact collection identity.

The DDL is EmDash's, token for token: a database EmDash activated verifies here, and triggers
installed here verify in EmDash (SQLite compares the stored DDL after collapsing whitespace;
PostgreSQL compares the catalog: function, type bits, arguments, enabled flag).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import Connection, select, text

from media_usage_orchestration.store.core.clock import (
    POSTGRES_CLOCK_UTC,
    postgres_time_text,
    sqlite_time_text,
)
from media_usage_orchestration.store.core.predicates import is_content_collection_status
from media_usage_orchestration.store.core.schema import index_status
from media_usage_orchestration.values.errors import CaptureLifecycleError
from media_usage_orchestration.values.identifiers import (
    content_table_name,
    quote_identifier,
    require_text,
    validate_identifier,
)

POSTGRES_TRIGGER_FUNCTION = "emdash_media_usage_capture_work"
POSTGRES_IDENTIFIER_LIMIT = 63
CAPTURE_TRIGGER_VERSION = 1
OWNED_TRIGGER_PREFIX = "emdash_mu_"
CAPTURE_INACTIVE_MESSAGE = "media usage capture inactive"


class CaptureOperation(StrEnum):
    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"

    @property
    def sql_keyword(self) -> str:
        return self.value.upper()

    @property
    def suffix(self) -> str:
        return {"insert": "ai", "update": "au", "delete": "ad"}[self.value]

    @property
    def postgres_tgtype(self) -> int:
        # ROW (1) + event bit (INSERT 4, DELETE 8, UPDATE 16); AFTER is the absence of BEFORE (2).
        return {"insert": 5, "update": 17, "delete": 9}[self.value]


@dataclass(frozen=True)
class CaptureIdentity:
    collection_id: str
    collection_slug: str

    @property
    def table_name(self) -> str:
        return content_table_name(self.collection_slug)

    def trigger_names(self) -> dict[CaptureOperation, str]:
        require_text(self.collection_id, "Capture triggers require a collection ID")
        digest = hashlib.sha256(
            f"{CAPTURE_TRIGGER_VERSION}:{self.collection_id}:{self.collection_slug}".encode()
        ).hexdigest()[:32]
        names = {op: f"{OWNED_TRIGGER_PREFIX}{digest}_{op.suffix}" for op in CaptureOperation}
        for name in names.values():
            validate_identifier(name, "media usage trigger")
            if len(name) > POSTGRES_IDENTIFIER_LIMIT:
                raise ValueError(
                    f"Media usage trigger name exceeds {POSTGRES_IDENTIFIER_LIMIT} bytes"
                )
        return names


def _literal(value: str) -> str:
    """A SQL string literal (DDL cannot take bound parameters)."""
    return "'" + value.replace("'", "''") + "'"


def _execute_ddl(connection: Connection, ddl: str) -> None:
    # psycopg reads `%` as a placeholder marker even inside string literals, so a collection ID
    # containing `%` would break the trigger DDL unless it is doubled.
    if connection.dialect.name == "postgresql":
        ddl = ddl.replace("%", "%%")
    connection.exec_driver_sql(ddl)


# --- install / verify / remove ----------------------------------------------------------------


def install_capture_triggers(
    connection: Connection, identity: CaptureIdentity, *, replace_existing: bool = True
) -> None:
    """Install the exact trigger set; a no-op when it is already there.

    Changing triggers requires `capture_state = 'installing'`: writes are refused while the
    set is incomplete, so no write can slip through uncaptured.
    """
    names = identity.trigger_names()
    table = identity.table_name
    if connection.dialect.name == "postgresql":
        _execute_ddl(connection, _postgres_function_sql())
    installed = list_owned_triggers(connection, table)
    if _has_exact_triggers(connection, identity, installed):
        return
    _assert_lifecycle(connection, identity, ("installing",))
    expected = set(names.values())
    retained = {name for name in installed if name in expected} if not replace_existing else set()
    _drop_triggers(connection, table, [name for name in installed if name not in retained])
    for operation, name in names.items():
        if name not in retained:
            _execute_ddl(connection, _create_trigger_sql(connection, identity, operation, name))
    if not _has_exact_triggers(connection, identity, list_owned_triggers(connection, table)):
        raise RuntimeError("Media usage capture trigger installation is incomplete")


def verify_capture_triggers(connection: Connection, identity: CaptureIdentity) -> bool:
    """True only when the table exists and carries exactly the expected, enabled triggers."""
    if not _table_exists(connection, identity.table_name):
        return False
    return _has_exact_triggers(
        connection, identity, list_owned_triggers(connection, identity.table_name)
    )


def remove_capture_triggers(connection: Connection, identity: CaptureIdentity) -> None:
    """Drop every owned trigger; allowed only while installing or deleting."""
    table = identity.table_name
    if not _table_exists(connection, table):
        return
    _assert_lifecycle(connection, identity, ("installing", "deleting"))
    _drop_triggers(connection, table, list_owned_triggers(connection, table))


def list_owned_triggers(connection: Connection, table_name: str) -> list[str]:
    validate_identifier(table_name, "content table")
    if connection.dialect.name == "postgresql":
        statement = text(
            "SELECT trigger.tgname AS name FROM pg_trigger AS trigger "
            "JOIN pg_class AS relation ON relation.oid = trigger.tgrelid "
            "JOIN pg_namespace AS namespace ON namespace.oid = relation.relnamespace "
            "WHERE namespace.nspname = current_schema() AND relation.relname = :table "
            "AND NOT trigger.tgisinternal AND left(trigger.tgname, 10) = :prefix"
        )
    else:
        statement = text(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = :table "
            "AND substr(name, 1, 10) = :prefix"
        )
    rows = connection.execute(statement, {"table": table_name, "prefix": OWNED_TRIGGER_PREFIX})
    return [row.name for row in rows]


def _table_exists(connection: Connection, table_name: str) -> bool:
    return connection.dialect.has_table(connection, table_name)


def _drop_triggers(connection: Connection, table_name: str, names: Sequence[str]) -> None:
    for name in names:
        validate_identifier(name, "media usage trigger")
        suffix = (
            f" ON {quote_identifier(table_name)}" if connection.dialect.name == "postgresql" else ""
        )
        connection.exec_driver_sql(f"DROP TRIGGER IF EXISTS {quote_identifier(name)}{suffix}")


def _assert_lifecycle(
    connection: Connection, identity: CaptureIdentity, allowed: Sequence[str]
) -> None:
    state = connection.execute(
        select(index_status.c.capture_state).where(
            is_content_collection_status(),
            index_status.c.scope_key == identity.collection_slug,
            index_status.c.collection_id == identity.collection_id,
        )
    ).scalar_one_or_none()
    if state not in allowed:
        raise CaptureLifecycleError(
            "Media usage capture trigger changes require a fenced collection lifecycle"
        )


def _has_exact_triggers(
    connection: Connection, identity: CaptureIdentity, installed: Sequence[str]
) -> bool:
    names = identity.trigger_names()
    if len(installed) != len(names) or set(installed) != set(names.values()):
        return False
    if connection.dialect.name == "postgresql":
        return _postgres_triggers_match(connection, identity, names)
    return _sqlite_triggers_match(connection, identity, names)


def _postgres_triggers_match(
    connection: Connection, identity: CaptureIdentity, names: dict[CaptureOperation, str]
) -> bool:
    rows = connection.execute(
        text(
            "SELECT trigger.tgname AS name, trigger.tgtype AS trigger_type, "
            "procedure.proname AS function_name, encode(trigger.tgargs, 'hex') AS arguments_hex, "
            "trigger.tgenabled AS enabled, trigger.tgqual IS NOT NULL AS has_when "
            "FROM pg_trigger AS trigger "
            "JOIN pg_class AS relation ON relation.oid = trigger.tgrelid "
            "JOIN pg_namespace AS namespace ON namespace.oid = relation.relnamespace "
            "JOIN pg_proc AS procedure ON procedure.oid = trigger.tgfoid "
            "JOIN pg_namespace AS function_namespace ON function_namespace.oid = procedure.pronamespace "
            "WHERE namespace.nspname = current_schema() "
            "AND function_namespace.nspname = current_schema() "
            "AND relation.relname = :table AND NOT trigger.tgisinternal "
            "AND trigger.tgconstraint = 0 AND NOT trigger.tgdeferrable "
            "AND NOT trigger.tginitdeferred AND trigger.tgattr = ''::int2vector "
            "AND left(trigger.tgname, 10) = :prefix"
        ),
        {"table": identity.table_name, "prefix": OWNED_TRIGGER_PREFIX},
    ).all()
    by_name = {row.name: row for row in rows}
    expected_arguments = f"{identity.collection_id}\0{identity.collection_slug}\0".encode().hex()
    for operation, name in names.items():
        row = by_name.get(name)
        if (
            row is None
            or row.function_name != POSTGRES_TRIGGER_FUNCTION
            or int(row.trigger_type) != operation.postgres_tgtype
            or row.arguments_hex != expected_arguments
            or row.enabled != "O"
            or row.has_when
        ):
            return False
    return True


def _sqlite_triggers_match(
    connection: Connection, identity: CaptureIdentity, names: dict[CaptureOperation, str]
) -> bool:
    rows = connection.execute(
        text(
            "SELECT name, sql AS definition FROM sqlite_master WHERE type = 'trigger' "
            "AND tbl_name = :table AND substr(name, 1, 10) = :prefix"
        ),
        {"table": identity.table_name, "prefix": OWNED_TRIGGER_PREFIX},
    ).all()
    stored = {row.name: row.definition for row in rows}
    return all(
        name in stored
        and _normalize_ddl(stored[name]) == _normalize_ddl(_sqlite_trigger_sql(identity, op, name))
        for op, name in names.items()
    )


def _normalize_ddl(definition: str) -> str:
    return re.sub(r"\s+", " ", definition).strip().removesuffix(";")


# --- DDL ------------------------------------------------------------------------------------


def _create_trigger_sql(
    connection: Connection, identity: CaptureIdentity, operation: CaptureOperation, name: str
) -> str:
    if connection.dialect.name == "postgresql":
        return (
            f"CREATE TRIGGER {quote_identifier(name)}\n"
            f"AFTER {operation.sql_keyword} ON {quote_identifier(identity.table_name)}\n"
            "FOR EACH ROW\n"
            f"EXECUTE FUNCTION {quote_identifier(POSTGRES_TRIGGER_FUNCTION)}(\n"
            f"{_literal(identity.collection_id)},\n{_literal(identity.collection_slug)}\n)"
        )
    return _sqlite_trigger_sql(identity, operation, name)


_WORK_COLUMNS = """collection_id,
collection_slug,
content_id,
change_epoch,
work_version,
state,
attempt_count,
next_attempt_at,
lease_token,
lease_expires_at,
last_attempted_at,
last_error_code,
created_at,
updated_at"""

_WORK_RESET = """collection_slug = {excluded}.collection_slug,
change_epoch = {excluded}.change_epoch,
work_version = _emdash_media_usage_work.work_version + 1,
state = 'pending',
attempt_count = 0,
next_attempt_at = {excluded}.next_attempt_at,
lease_token = NULL,
lease_expires_at = NULL,
last_attempted_at = NULL,
last_error_code = NULL,
updated_at = {excluded}.updated_at"""

_EPOCH_BUMP = """change_epoch = change_epoch + 1,
status = CASE WHEN status = 'complete' THEN 'stale' ELSE status END,
completed_at = CASE WHEN status = 'complete' THEN NULL ELSE completed_at END,
updated_at = {now}"""

_SQLITE_NOW = sqlite_time_text()


def _sqlite_trigger_sql(identity: CaptureIdentity, operation: CaptureOperation, name: str) -> str:
    content_id = "OLD.id" if operation is CaptureOperation.DELETE else "NEW.id"
    collection_id = _literal(identity.collection_id)
    slug = _literal(identity.collection_slug)
    return f"""CREATE TRIGGER {quote_identifier(name)}
AFTER {operation.sql_keyword} ON {quote_identifier(identity.table_name)}
FOR EACH ROW
BEGIN
UPDATE _emdash_media_usage_index_status
SET {_EPOCH_BUMP.format(now=_SQLITE_NOW)}
WHERE adapter_id = 'content-media'
AND scope_type = 'collection'
AND scope_key = {slug}
AND collection_id = {collection_id}
AND capture_state = 'active'
AND EXISTS (
SELECT 1
FROM _emdash_collections AS collection
WHERE collection.id = {collection_id}
AND collection.slug = {slug}
);

SELECT CASE
WHEN changes() <> 1 THEN RAISE(ABORT, '{CAPTURE_INACTIVE_MESSAGE}')
END;

INSERT INTO _emdash_media_usage_work (
{_WORK_COLUMNS}
)
SELECT
{collection_id},
{slug},
{content_id},
change_epoch,
1,
'pending',
0,
{_SQLITE_NOW},
NULL,
NULL,
NULL,
NULL,
{_SQLITE_NOW},
{_SQLITE_NOW}
FROM _emdash_media_usage_index_status
WHERE adapter_id = 'content-media'
AND scope_type = 'collection'
AND scope_key = {slug}
AND collection_id = {collection_id}
AND capture_state = 'active'
ON CONFLICT (collection_id, content_id) DO UPDATE SET
{_WORK_RESET.format(excluded="excluded")};
END"""


def _postgres_function_sql() -> str:
    now = postgres_time_text(POSTGRES_CLOCK_UTC, one_argument_per_line=True)
    return f"""CREATE OR REPLACE FUNCTION {quote_identifier(POSTGRES_TRIGGER_FUNCTION)}()
RETURNS trigger
LANGUAGE plpgsql
AS $function$
DECLARE
v_collection_id text := TG_ARGV[0];
v_collection_slug text := TG_ARGV[1];
v_content_id text;
v_epoch bigint;
v_now text := {now};
BEGIN
IF TG_OP = 'DELETE' THEN
v_content_id := OLD.id;
ELSE
v_content_id := NEW.id;
END IF;

UPDATE _emdash_media_usage_index_status
SET {_EPOCH_BUMP.format(now="v_now")}
WHERE adapter_id = 'content-media'
AND scope_type = 'collection'
AND scope_key = v_collection_slug
AND collection_id = v_collection_id
AND capture_state = 'active'
AND EXISTS (
SELECT 1
FROM _emdash_collections AS collection
WHERE collection.id = v_collection_id
AND collection.slug = v_collection_slug
)
RETURNING change_epoch INTO v_epoch;

IF NOT FOUND THEN
RAISE EXCEPTION USING
ERRCODE = 'P0001',
MESSAGE = '{CAPTURE_INACTIVE_MESSAGE}';
END IF;

INSERT INTO _emdash_media_usage_work (
{_WORK_COLUMNS}
)
VALUES (
v_collection_id,
v_collection_slug,
v_content_id,
v_epoch,
1,
'pending',
0,
v_now,
NULL,
NULL,
NULL,
NULL,
v_now,
v_now
)
ON CONFLICT (collection_id, content_id) DO UPDATE SET
{_WORK_RESET.format(excluded="EXCLUDED")};

RETURN NULL;
END;
$function$"""
