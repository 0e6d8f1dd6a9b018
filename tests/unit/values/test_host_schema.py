"""The host-schema contract's classification, without a database: which recorded EmDash
migrations are media usage ones, which the project knows, and what each situation refuses."""

from __future__ import annotations

import pytest

from media_usage_orchestration.values.host_schema import (
    EMDASH_RELEASE,
    MEDIA_USAGE_MIGRATIONS,
    HostSchema,
    is_media_usage_migration,
)

# Around EmDash 0.34.0's eight media usage migrations, some of its other ones.
OTHERS = ("001_initial", "002_media_status", "054_media_upload_attempts", "070_collection_routable")
RELEASED = (*OTHERS, *MEDIA_USAGE_MIGRATIONS)
LATER = "071_media_usage_something"


def test_the_project_implements_emdash_0_34_0s_eight_media_usage_migrations():
    assert EMDASH_RELEASE == "0.34.0"
    assert [name[:3] for name in MEDIA_USAGE_MIGRATIONS] == [
        "046",
        "050",
        "052",
        "061",
        "062",
        "063",
        "065",
        "066",
    ]
    assert all(is_media_usage_migration(name) for name in MEDIA_USAGE_MIGRATIONS)


@pytest.mark.parametrize(
    "name",
    # Media usage migrations EmDash's history holds besides 0.34.0's: the rule catches them.
    [LATER, "058_media_usage_deletion_cleanup_indexes", "062_media_usage_created_at_index"],
)
def test_a_later_emdashs_media_usage_migration_is_caught_by_its_name(name):
    assert is_media_usage_migration(name)
    assert HostSchema.from_names((*RELEASED, name)).unknown == (name,)


@pytest.mark.parametrize("name", OTHERS)
def test_other_migrations_of_media_are_not_media_usage_ones(name):
    assert not is_media_usage_migration(name)


def test_a_database_without_the_migration_record_has_no_contract():
    host = HostSchema.from_names(None)

    assert not host.tracked
    assert (host.media_usage, host.unknown, host.missing) == ((), (), ())
    assert host.write_refusal() is None
    assert host.install_refusal() is None
    assert host.upgrade_emdash_hint() is None
    assert host.summary() == "EmDash migrations: none recorded (no _emdash_migrations table)"


def test_emdash_0_34_0s_record_allows_everything():
    host = HostSchema.from_names(RELEASED)

    assert host.tracked
    assert host.known == MEDIA_USAGE_MIGRATIONS
    assert (host.unknown, host.missing) == ((), ())
    assert host.write_refusal() is None
    assert host.install_refusal() is None
    assert host.summary() == (
        "EmDash migrations: 12 recorded, 8 of media usage; known 8 of 8 (EmDash 0.34.0); "
        "unknown: none; missing: none"
    )


def test_an_unknown_media_usage_migration_refuses_every_writer_naming_it():
    host = HostSchema.from_names((*RELEASED, LATER))

    refusal = host.write_refusal()

    assert refusal is not None
    assert f"migration {LATER} is unknown" in refusal
    assert "upgrade media_usage_orchestration" in refusal
    assert EMDASH_RELEASE in refusal
    assert host.install_refusal() == refusal


def test_unknown_migrations_win_over_missing_ones():
    removed = "063_media_usage_incremental_work"
    names = [name for name in RELEASED if name != removed] + [LATER]
    host = HostSchema.from_names(names)

    assert (host.unknown, host.missing) == ((LATER,), (removed,))
    assert host.install_refusal() == host.write_refusal()
    assert f"unknown: {LATER}; missing: {removed}" in host.summary()


def test_an_older_emdash_refuses_only_init_naming_the_release_to_upgrade_to():
    older = [name for name in RELEASED if name[:3] not in ("065", "066")]
    host = HostSchema.from_names(older)

    assert host.write_refusal() is None
    assert host.missing == (
        "065_media_usage_collection_deletion",
        "066_media_usage_reconciliation",
    )
    refusal = host.install_refusal()
    assert refusal is not None
    assert "065_media_usage_collection_deletion, 066_media_usage_reconciliation" in refusal
    assert f"upgrade EmDash to {EMDASH_RELEASE}" in refusal


def test_an_empty_record_misses_every_known_migration():
    host = HostSchema.from_names(())

    assert host.tracked
    assert host.missing == MEDIA_USAGE_MIGRATIONS
    assert host.write_refusal() is None
    assert host.install_refusal() is not None
