"""EmDash's migration 062 on a copy of its fixture database, which ships without the fence
triggers a real EmDash database has (see tests/fixtures/README.md)."""

from __future__ import annotations

from sqlalchemy import Engine

from media_usage_orchestration.store.core.cleanup_fence import SQLITE_TRIGGERS, missing_fence

EMDASH_SQLITE_FENCE = (
    "emdash_media_usage_fence_source_generation_insert",
    "emdash_media_usage_fence_source_generation_update",
    "emdash_media_usage_record_cleanup_fence",
)


def restore_fence(engine: Engine) -> None:
    """Put migration 062's three SQLite triggers back, as EmDash creates them."""
    with engine.begin() as connection:
        assert missing_fence(connection) == list(EMDASH_SQLITE_FENCE)
        for trigger in SQLITE_TRIGGERS:
            connection.exec_driver_sql(trigger.ddl)
        assert missing_fence(connection) == []
