"""The host-schema contract's read of `_emdash_migrations`, on EmDash's own record (the fixture
database's 69 rows) and on a later and an older EmDash's, both dialects; a database without
the record has no contract."""

from __future__ import annotations

import pytest

from media_usage_orchestration.store.core.engine import create_database_engine
from media_usage_orchestration.store.core.host_schema import (
    read_host_schema,
    refuse_install,
    refuse_unknown_migrations,
)
from media_usage_orchestration.values.errors import MissingEmdashMigration, UnknownEmdashMigration
from media_usage_orchestration.values.host_schema import (
    EMDASH_RELEASE,
    MEDIA_USAGE_MIGRATIONS,
    HostSchema,
)
from tests.support.emdash_migrations import (
    LATER_MIGRATION,
    REMOVED_MIGRATION,
    as_later_emdash,
    fixture_migrations,
    remove_migration,
)


def test_the_declared_migrations_are_the_media_usage_ones_emdash_recorded():
    names = [name for name, _ in fixture_migrations()]

    assert len(names) == 69 and names[-1] == "070_collection_routable"
    assert HostSchema.from_names(names).media_usage == MEDIA_USAGE_MIGRATIONS


def test_emdash_0_34_0s_database_meets_the_contract(emdash):
    host = read_host_schema(emdash.engine)

    assert host.recorded == tuple(name for name, _ in fixture_migrations())
    assert host.known == MEDIA_USAGE_MIGRATIONS
    assert (host.unknown, host.missing) == ((), ())
    assert refuse_unknown_migrations(emdash.engine) == host
    with emdash.engine.begin() as connection:
        assert refuse_install(connection) == host


def test_a_later_emdashs_migration_refuses_writers_and_init(emdash):
    as_later_emdash(emdash.engine)

    host = read_host_schema(emdash.engine)

    assert (host.unknown, host.missing) == ((LATER_MIGRATION,), (REMOVED_MIGRATION,))
    with pytest.raises(UnknownEmdashMigration, match=LATER_MIGRATION) as refused:
        refuse_unknown_migrations(emdash.engine)
    assert refused.value.code == "MEDIA_USAGE_UNKNOWN_EMDASH_MIGRATION"
    with emdash.engine.begin() as connection, pytest.raises(UnknownEmdashMigration):
        refuse_install(connection)


def test_an_older_emdash_refuses_init_only(emdash):
    remove_migration(emdash.engine)

    assert refuse_unknown_migrations(emdash.engine).missing == (REMOVED_MIGRATION,)
    with emdash.engine.begin() as connection, pytest.raises(MissingEmdashMigration) as refused:
        refuse_install(connection)
    assert REMOVED_MIGRATION in str(refused.value) and EMDASH_RELEASE in str(refused.value)
    assert refused.value.code == "MEDIA_USAGE_MISSING_EMDASH_MIGRATION"


def test_a_database_without_the_record_has_no_contract(db):
    host = read_host_schema(db.engine)

    assert host.recorded is None
    assert refuse_unknown_migrations(db.engine) == host
    with db.engine.begin() as connection:
        assert refuse_install(connection) == host


def test_a_read_only_engine_reads_the_record(emdash):
    as_later_emdash(emdash.engine)
    engine = create_database_engine(emdash.url, read_only=True)
    try:
        assert read_host_schema(engine).unknown == (LATER_MIGRATION,)
    finally:
        engine.dispose()
