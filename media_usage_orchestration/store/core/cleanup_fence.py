"""EmDash's projection-GC fence (migration 062): the triggers a real EmDash database carries.

The GC deletes an obsolete generation's occurrences only after marking them with its lease
token; deleting a marked row raises `_emdash_media_usage_cleanup_fence.generation_floor` to that
generation. A source write that would make a generation at or below the floor current is then
silently dropped unless that generation holds a live write lease: a publication that lost its
lease while the GC reaped its rows can never resurrect a generation without occurrences.
On PostgreSQL every source write also takes `FOR SHARE` on the cleanup row, so it waits for a
GC statement (which holds that row `FOR UPDATE`) and sees the floor it committed.

Names are EmDash's. Installing is idempotent and adds only what is missing; `missing_fence`
names what a database lacks (the EmDash fixture database ships without these triggers).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, text

from media_usage_orchestration.store.core.clock import sqlite_time_text
from media_usage_orchestration.store.core.engine import is_postgres

# Table names, not `schema` objects: the installer in `schema` calls into this module.
CLEANUP_TASK_KEY = "projection_gc"
SOURCES = "_emdash_media_usage_sources"
OCCURRENCES = "_emdash_media_usage"
CLEANUP = "_emdash_media_usage_cleanup"
FENCE = "_emdash_media_usage_cleanup_fence"
GENERATION_WRITES = "_emdash_media_usage_generation_writes"
_FLOOR_EXCEEDED = f"""EXISTS (
    SELECT 1 FROM {FENCE} AS fence
    WHERE fence.task_key = '{CLEANUP_TASK_KEY}'
      AND NEW.current_generation <= fence.generation_floor
)"""


def _no_live_write_lease(live: str) -> str:
    return f"""NOT EXISTS (
    SELECT 1 FROM {GENERATION_WRITES} AS writer
    WHERE writer.source_key = NEW.source_key
      AND writer.generation = NEW.current_generation
      AND {live}
)"""


def _raise_floor(now: str, generation: str) -> str:
    # The floor only ever moves up: the greatest generation the GC has deleted.
    table = FENCE
    return f"""INSERT INTO {table} (task_key, generation_floor, updated_at)
    VALUES ('{CLEANUP_TASK_KEY}', {generation}, {now})
    ON CONFLICT (task_key) DO UPDATE SET
      generation_floor = CASE
        WHEN excluded.generation_floor > {table}.generation_floor
        THEN excluded.generation_floor
        ELSE {table}.generation_floor
      END,
      updated_at = excluded.updated_at"""


_HELD_BY_CLEANUP_LEASE = f"""OLD.cleanup_lease_token IS NOT NULL AND EXISTS (
    SELECT 1 FROM {CLEANUP} AS cleanup
    WHERE cleanup.task_key = '{CLEANUP_TASK_KEY}'
      AND cleanup.lease_token = OLD.cleanup_lease_token
)"""


@dataclass(frozen=True)
class FenceTrigger:
    name: str
    table: str
    ddl: str


# --- SQLite -----------------------------------------------------------------------------------

_SQLITE_NOW = sqlite_time_text()
_SQLITE_LIVE = f"writer.expires_at > {_SQLITE_NOW}"

SQLITE_TRIGGERS: tuple[FenceTrigger, ...] = (
    FenceTrigger(
        "emdash_media_usage_fence_source_generation_insert",
        SOURCES,
        f"""CREATE TRIGGER IF NOT EXISTS emdash_media_usage_fence_source_generation_insert
BEFORE INSERT ON {SOURCES}
WHEN {_FLOOR_EXCEEDED} AND {_no_live_write_lease(_SQLITE_LIVE)}
BEGIN
    SELECT RAISE(IGNORE);
END""",
    ),
    FenceTrigger(
        "emdash_media_usage_fence_source_generation_update",
        SOURCES,
        f"""CREATE TRIGGER IF NOT EXISTS emdash_media_usage_fence_source_generation_update
BEFORE UPDATE OF current_generation ON {SOURCES}
WHEN NEW.current_generation <> OLD.current_generation
  AND {_FLOOR_EXCEEDED} AND {_no_live_write_lease(_SQLITE_LIVE)}
BEGIN
    SELECT RAISE(IGNORE);
END""",
    ),
    FenceTrigger(
        "emdash_media_usage_record_cleanup_fence",
        OCCURRENCES,
        f"""CREATE TRIGGER IF NOT EXISTS emdash_media_usage_record_cleanup_fence
BEFORE DELETE ON {OCCURRENCES}
WHEN {_HELD_BY_CLEANUP_LEASE}
BEGIN
    {_raise_floor(_SQLITE_NOW, "OLD.generation")};
END""",
    ),
)

# --- PostgreSQL -------------------------------------------------------------------------------

_POSTGRES_LIVE = "writer.expires_at::timestamptz > clock_timestamp()"

POSTGRES_FUNCTIONS: tuple[str, ...] = (
    f"""CREATE OR REPLACE FUNCTION emdash_media_usage_lock_cleanup()
RETURNS trigger LANGUAGE plpgsql AS $fence$
BEGIN
    PERFORM 1 FROM {CLEANUP} AS cleanup
    WHERE cleanup.task_key = '{CLEANUP_TASK_KEY}'
    FOR SHARE;
    RETURN NULL;
END;
$fence$""",
    f"""CREATE OR REPLACE FUNCTION emdash_media_usage_fence_source_generation()
RETURNS trigger LANGUAGE plpgsql AS $fence$
BEGIN
    IF {_FLOOR_EXCEEDED} AND {_no_live_write_lease(_POSTGRES_LIVE)} THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END;
$fence$""",
    f"""CREATE OR REPLACE FUNCTION emdash_media_usage_record_cleanup_fence()
RETURNS trigger LANGUAGE plpgsql AS $fence$
BEGIN
    IF {_HELD_BY_CLEANUP_LEASE} THEN
        {_raise_floor("CURRENT_TIMESTAMP::text", "OLD.generation")};
    END IF;
    RETURN OLD;
END;
$fence$""",
)


def _statement_lock(name: str, event: str) -> FenceTrigger:
    return FenceTrigger(
        name,
        SOURCES,
        f"CREATE TRIGGER {name} BEFORE {event} ON {SOURCES} "
        "FOR EACH STATEMENT EXECUTE FUNCTION emdash_media_usage_lock_cleanup()",
    )


def _row_fence(name: str, event: str) -> FenceTrigger:
    return FenceTrigger(
        name,
        SOURCES,
        f"CREATE TRIGGER {name} BEFORE {event} ON {SOURCES} "
        "FOR EACH ROW EXECUTE FUNCTION emdash_media_usage_fence_source_generation()",
    )


POSTGRES_TRIGGERS: tuple[FenceTrigger, ...] = (
    _statement_lock("emdash_media_usage_lock_cleanup_insert", "INSERT"),
    _statement_lock("emdash_media_usage_lock_cleanup_update", "UPDATE OF current_generation"),
    _statement_lock("emdash_media_usage_lock_cleanup_delete", "DELETE"),
    _row_fence("emdash_media_usage_fence_source_generation_insert", "INSERT"),
    _row_fence("emdash_media_usage_fence_source_generation_update", "UPDATE OF current_generation"),
    FenceTrigger(
        "emdash_media_usage_record_cleanup_fence",
        OCCURRENCES,
        f"CREATE TRIGGER emdash_media_usage_record_cleanup_fence BEFORE DELETE ON {OCCURRENCES} "
        "FOR EACH ROW WHEN (OLD.cleanup_lease_token IS NOT NULL) "
        "EXECUTE FUNCTION emdash_media_usage_record_cleanup_fence()",
    ),
)


def fence_triggers(connection: Connection) -> tuple[FenceTrigger, ...]:
    return POSTGRES_TRIGGERS if is_postgres(connection) else SQLITE_TRIGGERS


def installed_fence_triggers(connection: Connection) -> set[str]:
    """The names of the fence triggers present on their tables."""
    wanted = fence_triggers(connection)
    if is_postgres(connection):
        rows = connection.execute(
            text(
                "SELECT t.tgname FROM pg_trigger t "
                "WHERE NOT t.tgisinternal AND t.tgrelid IN "
                "(to_regclass(:sources), to_regclass(:occurrences))"
            ),
            {"sources": SOURCES, "occurrences": OCCURRENCES},
        )
    else:
        rows = connection.execute(
            text("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name IN (:s, :o)"),
            {"s": SOURCES, "o": OCCURRENCES},
        )
    present = {row[0] for row in rows}
    return {trigger.name for trigger in wanted if trigger.name in present}


def missing_fence(connection: Connection) -> list[str]:
    """The fence triggers this database lacks, in install order."""
    present = installed_fence_triggers(connection)
    return [t.name for t in fence_triggers(connection) if t.name not in present]


def install_cleanup_fence(connection: Connection) -> list[str]:
    """Create the missing fence triggers (and, on PostgreSQL, their functions); return what was
    added as `trigger <name>` entries, nothing when the fence is complete."""
    missing = set(missing_fence(connection))
    if not missing:
        return []
    if is_postgres(connection):
        for function in POSTGRES_FUNCTIONS:
            connection.exec_driver_sql(function)
    added = []
    for trigger in fence_triggers(connection):
        if trigger.name in missing:
            connection.exec_driver_sql(trigger.ddl)
            added.append(f"trigger {trigger.name}")
    return added


def remove_cleanup_fence(connection: Connection) -> None:
    """Drop the fence triggers (EmDash's `down` of migration 062 keeps the tables)."""
    for trigger in fence_triggers(connection):
        if is_postgres(connection):
            connection.exec_driver_sql(f"DROP TRIGGER IF EXISTS {trigger.name} ON {trigger.table}")
        else:
            connection.exec_driver_sql(f"DROP TRIGGER IF EXISTS {trigger.name}")
