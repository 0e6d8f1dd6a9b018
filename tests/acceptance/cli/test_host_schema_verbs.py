"""The host-schema contract at the command line: after a later EmDash, `init` and the verbs
that write exit 1 with one line naming the unknown migration and change nothing, the verbs that
read answer as before with that line as a warning; after an older EmDash, `init` refuses naming
the release to upgrade to; `status` shows the contract; a database without
`_emdash_migrations` behaves as before."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.host_schema import read_host_schema
from media_usage_orchestration.values.host_schema import EMDASH_RELEASE
from tests.support.cli import EXIT_OK, EXIT_PROBLEM, invoke, trusted_collection
from tests.support.emdash_migrations import (
    LATER_MIGRATION,
    REMOVED_MIGRATION,
    as_later_emdash,
    remove_migration,
)
from tests.support.media_library import add_media, create_media_table
from tests.support.operator_states import failed_work, work_row
from tests.support.states import snapshot

WRITE_VERBS = (
    ("init",),
    ("work", "retry", "--collection", "posts", "--all-failed"),
    ("work", "retry", "--collection", "posts", "--content-id", "entry-1"),
    ("deletions", "retry", "--collection", "posts"),
    ("reconciliations", "retry", "--collection", "posts"),
)
READ_VERBS = (
    ("status", "--json"),
    ("verify", "--collection", "posts"),
    ("work", "list", "--collection", "posts"),
    ("deletions", "list"),
    ("reconciliations", "list"),
    ("usage", "m-1"),
    ("unused",),
)
# EmDash 0.34.0's tables that 0.33.0 did not have yet (migrations 065 and 066).
NEWER_TABLES = (schema.collection_deletions, schema.reconciliations)


@pytest.fixture
def posts(emdash):
    """A captured collection whose entry-1 work failed (`work retry` would reopen it), and a
    media item `m-1` in EmDash's library."""
    posts = trusted_collection(emdash)
    failed_work(emdash.engine, posts, "entry-1")
    if emdash.is_postgres:  # the SQLite copy is EmDash's whole database, its library included
        create_media_table(emdash.engine)
    add_media(emdash.engine, ("m-1", 100))
    return posts


def unknown_line(database) -> str:
    line = read_host_schema(database.engine).write_refusal()
    assert line is not None and LATER_MIGRATION in line
    return line


@pytest.mark.parametrize("verb", WRITE_VERBS, ids=" ".join)
def test_a_write_verb_exits_1_naming_the_unknown_migration(emdash, posts, verb):
    as_later_emdash(emdash.engine)
    before = snapshot(emdash.engine)

    result = invoke(emdash, *verb)

    assert result.exit_code == EXIT_PROBLEM, result.output
    assert result.stderr == f"Error: {unknown_line(emdash)}\n"
    assert snapshot(emdash.engine) == before
    assert work_row(emdash.engine, posts, "entry-1")["state"] == "failed"


@pytest.mark.parametrize("verb", READ_VERBS, ids=" ".join)
def test_a_read_verb_answers_as_before_with_the_line_as_a_warning(emdash, posts, verb):
    known = invoke(emdash, *verb)
    as_later_emdash(emdash.engine)

    result = invoke(emdash, *verb)

    warning = f"Warning: {unknown_line(emdash)}\n"
    assert (result.exit_code, result.stdout) == (known.exit_code, known.stdout)
    assert result.stderr.count(warning) == 1
    assert result.stderr.replace(warning, "") == known.stderr


def test_init_refuses_on_an_older_emdash_naming_the_release(emdash):
    remove_migration(emdash.engine, "065_media_usage_collection_deletion")
    remove_migration(emdash.engine, "066_media_usage_reconciliation")
    for table in NEWER_TABLES:  # as EmDash 0.33.0 left the database
        with emdash.engine.begin() as connection:
            table.drop(connection)
    names = set(inspect(emdash.engine).get_table_names())

    result = invoke(emdash, "init")

    assert result.exit_code == EXIT_PROBLEM, result.output
    assert f"upgrade EmDash to {EMDASH_RELEASE}" in result.stderr
    assert "065_media_usage_collection_deletion, 066_media_usage_reconciliation" in result.stderr
    assert set(inspect(emdash.engine).get_table_names()) == names  # EmDash creates them


def test_init_completes_emdash_0_34_0s_database_with_the_projects_own_tables(emdash):
    # EmDash's own file lacks them; the PostgreSQL copy is an installed schema that has them.
    missing = schema.missing_tables(emdash.engine, schema.PROJECT_TABLES)
    result = invoke(emdash, "init")

    assert result.exit_code == EXIT_OK, result.output
    assert f"{len(missing)} objects added" in result.stdout
    assert all(f"+ table {name}" in result.stdout for name in missing)
    assert "0 objects added" in invoke(emdash, "init").stdout


def test_status_shows_the_contract(emdash):
    assert (
        "EmDash migrations: 69 recorded, 8 of media usage; known 8 of 8 (EmDash 0.34.0); "
        "unknown: none; missing: none"
    ) in invoke(emdash, "status").stdout

    as_later_emdash(emdash.engine)
    result = invoke(emdash, "status")

    assert result.exit_code == EXIT_OK, result.output
    assert (
        f"known 7 of 8 (EmDash 0.34.0); unknown: {LATER_MIGRATION}; missing: {REMOVED_MIGRATION}"
    ) in result.stdout
    assert result.stderr == f"Warning: {unknown_line(emdash)}\n"


def test_a_database_without_the_record_behaves_as_before(db):
    posts = trusted_collection(db)
    status = invoke(db, "status")
    failed_work(db.engine, posts, "entry-1")
    retried = invoke(db, "work", "retry", "--collection", "posts", "--content-id", "entry-1")

    assert status.exit_code == EXIT_OK and status.stderr == ""
    assert "EmDash migrations" not in status.stdout
    assert retried.exit_code == EXIT_OK, retried.output
    assert work_row(db.engine, posts, "entry-1")["state"] == "pending"
