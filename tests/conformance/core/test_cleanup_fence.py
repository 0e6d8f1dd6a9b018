"""The fence installer: EmDash's trigger names on each dialect, idempotent, and repairable."""

from media_usage_orchestration.store.core.cleanup_fence import (
    fence_triggers,
    install_cleanup_fence,
    installed_fence_triggers,
    missing_fence,
    remove_cleanup_fence,
)

POSTGRES_NAMES = {
    "emdash_media_usage_lock_cleanup_insert",
    "emdash_media_usage_lock_cleanup_update",
    "emdash_media_usage_lock_cleanup_delete",
    "emdash_media_usage_fence_source_generation_insert",
    "emdash_media_usage_fence_source_generation_update",
    "emdash_media_usage_record_cleanup_fence",
}
SQLITE_NAMES = {
    "emdash_media_usage_fence_source_generation_insert",
    "emdash_media_usage_fence_source_generation_update",
    "emdash_media_usage_record_cleanup_fence",
}


def test_install_schema_installs_emdash_fence(db):
    expected = POSTGRES_NAMES if db.is_postgres else SQLITE_NAMES
    with db.engine.begin() as connection:
        assert installed_fence_triggers(connection) == expected
        assert missing_fence(connection) == []
        assert install_cleanup_fence(connection) == []


def test_a_removed_trigger_is_reinstalled_alone(db):
    with db.engine.begin() as connection:
        remove_cleanup_fence(connection)
        assert installed_fence_triggers(connection) == set()
    with db.engine.begin() as connection:
        connection.exec_driver_sql(
            next(t for t in fence_triggers(connection) if "record" in t.name).ddl
        )
        added = install_cleanup_fence(connection)
    expected = (POSTGRES_NAMES if db.is_postgres else SQLITE_NAMES) - {
        "emdash_media_usage_record_cleanup_fence"
    }
    assert {entry.removeprefix("trigger ") for entry in added} == expected
    with db.engine.begin() as connection:
        assert missing_fence(connection) == []
