"""Capture triggers on both dialects: every content write bumps the collection's epoch and
upserts one durable job in the writer's transaction, or is refused when the registry and
lifecycle identity is not exact and active (spec section 4, EmDash's capture-trigger suite)."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import Engine, select, text, update
from sqlalchemy.exc import DBAPIError

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.capture_triggers import (
    CAPTURE_INACTIVE_MESSAGE,
    CaptureIdentity,
    CaptureOperation,
    install_capture_triggers,
    list_owned_triggers,
    remove_capture_triggers,
    verify_capture_triggers,
)
from media_usage_orchestration.values.errors import CaptureLifecycleError, InvalidIdentifierError
from tests.support.states import (
    NO_MEDIA,
    all_rows,
    assert_same_statement_time,
    count,
    set_status,
    status_row,
)

COMPLETED_AT = "2026-08-01T00:00:00.000Z"
SORTABLE_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")
REPLACEMENT_ID = "replacement-collection-id"


# --- helpers ----------------------------------------------------------------------------------


def create_active_fixture(engine: Engine, slug: str) -> CaptureIdentity:
    """A registry collection (no fields, like EmDash's bare `createCollection`) with trusted
    (`complete`) coverage and exact, active capture."""
    collection = CmsWriter(engine).create_collection(slug, ())
    set_status(
        engine,
        slug,
        collection_id=collection.id,
        status="complete",
        completed_at=COMPLETED_AT,
        reconciliation_required=0,
        capture_state="installing",
    )
    identity = CaptureIdentity(collection.id, slug)
    with engine.begin() as connection:
        install_capture_triggers(connection, identity)
    set_status(engine, slug, capture_state="active")
    return identity


def insert_entry(engine: Engine, table: str, content_id: str, slug: str) -> None:
    with engine.begin() as connection:
        connection.execute(
            text(f'INSERT INTO "{table}" (id, slug) VALUES (:id, :slug)'),
            {"id": content_id, "slug": slug},
        )


def execute(engine: Engine, statement: str, **parameters) -> None:
    with engine.begin() as connection:
        connection.execute(text(statement), parameters)


def count_entries(engine: Engine, table: str) -> int:
    with engine.connect() as connection:
        return connection.execute(text(f'SELECT COUNT(*) FROM "{table}"')).scalar_one()


def entry_slugs(engine: Engine, table: str) -> list[str]:
    with engine.connect() as connection:
        return list(connection.execute(text(f'SELECT slug FROM "{table}" ORDER BY id')).scalars())


def owned(engine: Engine, identity: CaptureIdentity) -> set[str]:
    with engine.connect() as connection:
        return set(list_owned_triggers(connection, identity.table_name))


def verified(engine: Engine, identity: CaptureIdentity) -> bool:
    with engine.connect() as connection:
        return verify_capture_triggers(connection, identity)


def install(engine: Engine, identity: CaptureIdentity, **options) -> None:
    with engine.begin() as connection:
        install_capture_triggers(connection, identity, **options)


def remove(engine: Engine, identity: CaptureIdentity) -> None:
    with engine.begin() as connection:
        remove_capture_triggers(connection, identity)


def coverage(engine: Engine, slug: str) -> dict:
    row = status_row(engine, slug)
    return {
        "change_epoch": int(row["change_epoch"]),
        "status": row["status"],
        "completed_at": row["completed_at"],
    }


def replace_insert_trigger_with_noop(engine: Engine, identity: CaptureIdentity, postgres: bool):
    """The insert trigger keeps its name but stops capturing (disabled, or a different body)."""
    name = identity.trigger_names()[CaptureOperation.INSERT]
    table = identity.table_name
    if postgres:
        execute(engine, f'ALTER TABLE "{table}" DISABLE TRIGGER "{name}"')
        return
    execute(engine, f'DROP TRIGGER "{name}"')
    execute(
        engine,
        f'CREATE TRIGGER "{name}" AFTER INSERT ON "{table}" FOR EACH ROW BEGIN SELECT 1; END',
    )


def install_rejecting_work_trigger(engine: Engine, rejected_content_id: str, postgres: bool):
    """Make the work upsert fail for one content ID, so one row of a statement cannot be captured."""
    if postgres:
        execute(
            engine,
            "CREATE OR REPLACE FUNCTION test_reject_media_usage_work() RETURNS trigger "
            "LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.content_id = '{rejected_content_id}' THEN "
            "RAISE EXCEPTION 'forced work failure'; END IF; RETURN NEW; END; $$",
        )
        execute(
            engine,
            "CREATE TRIGGER test_reject_media_usage_work BEFORE INSERT OR UPDATE ON "
            "_emdash_media_usage_work FOR EACH ROW EXECUTE FUNCTION test_reject_media_usage_work()",
        )
        return
    execute(
        engine,
        "CREATE TRIGGER test_reject_media_usage_work BEFORE INSERT ON _emdash_media_usage_work "
        f"FOR EACH ROW WHEN NEW.content_id = '{rejected_content_id}' "
        "BEGIN SELECT RAISE(ABORT, 'forced work failure'); END",
    )


# --- names ------------------------------------------------------------------------------------


def test_trigger_names_are_the_versioned_identity_digest():
    # sha256("1:01ABC:posts") = b828ab6b16e3ca73229670841aa43c03 8caafba2...
    names = CaptureIdentity("01ABC", "posts").trigger_names()
    assert names == {
        CaptureOperation.INSERT: "emdash_mu_b828ab6b16e3ca73229670841aa43c03_ai",
        CaptureOperation.UPDATE: "emdash_mu_b828ab6b16e3ca73229670841aa43c03_au",
        CaptureOperation.DELETE: "emdash_mu_b828ab6b16e3ca73229670841aa43c03_ad",
    }
    assert {len(name) for name in names.values()} == {45}
    assert CaptureIdentity("01ABC", "posts").table_name == "ec_posts"
    # Both halves of the identity are part of the digest.
    assert CaptureIdentity("01ABD", "posts").trigger_names() != names
    assert CaptureIdentity("01ABC", "post").trigger_names() != names


def test_trigger_names_require_a_collection_id_and_a_valid_slug():
    with pytest.raises(ValueError, match="collection ID"):
        CaptureIdentity("", "posts").trigger_names()
    with pytest.raises(InvalidIdentifierError):
        _ = CaptureIdentity("01ABC", "Posts; DROP TABLE x").table_name


# --- capture ----------------------------------------------------------------------------------


def test_insert_update_and_delete_coalesce_into_one_newest_pending_job(db):
    identity = create_active_fixture(db.engine, "posts")
    table = identity.table_name

    insert_entry(db.engine, table, "entry-1", "first")
    first = all_rows(db.engine, schema.work)
    assert [
        (job["content_id"], int(job["change_epoch"]), int(job["work_version"])) for job in first
    ] == [("entry-1", 1, 1)]
    # The job now looks leased by an old owner that failed before; coverage was complete.
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.work).values(
                state="leased",
                attempt_count=4,
                next_attempt_at="2099-01-01T00:00:00.000Z",
                lease_token="old-owner",
                lease_expires_at="2099-01-01T00:01:00.000Z",
                last_attempted_at="2026-08-01T00:00:00.000Z",
                last_error_code="OLD_ERROR",
            )
        )
    set_status(db.engine, "posts", status="complete", completed_at=COMPLETED_AT)

    execute(db.engine, f"UPDATE \"{table}\" SET slug = 'second' WHERE id = 'entry-1'")
    execute(db.engine, f"DELETE FROM \"{table}\" WHERE id = 'entry-1'")

    assert coverage(db.engine, "posts") == {
        "change_epoch": 3,
        "status": "stale",
        "completed_at": None,
    }
    jobs = all_rows(db.engine, schema.work)
    assert len(jobs) == 1
    job = jobs[0]
    assert {
        "collection_id": job["collection_id"],
        "collection_slug": job["collection_slug"],
        "content_id": job["content_id"],
        "change_epoch": int(job["change_epoch"]),
        "work_version": int(job["work_version"]),
        "state": job["state"],
        "attempt_count": job["attempt_count"],
        "lease_token": job["lease_token"],
        "lease_expires_at": job["lease_expires_at"],
        "last_attempted_at": job["last_attempted_at"],
        "last_error_code": job["last_error_code"],
    } == {
        "collection_id": identity.collection_id,
        "collection_slug": "posts",
        "content_id": "entry-1",
        "change_epoch": 3,
        "work_version": 3,
        "state": "pending",
        "attempt_count": 0,
        "lease_token": None,
        "lease_expires_at": None,
        "last_attempted_at": None,
        "last_error_code": None,
    }
    assert_same_statement_time(job["next_attempt_at"], job["updated_at"])
    assert job["next_attempt_at"] != "2099-01-01T00:00:00.000Z"
    assert job["updated_at"] >= first[0]["updated_at"]
    assert count_entries(db.engine, table) == 0


def test_each_write_bumps_the_epoch_and_keeps_untrusted_statuses(db):
    identity = create_active_fixture(db.engine, "pages")
    set_status(db.engine, "pages", status="never", completed_at=None)

    insert_entry(db.engine, identity.table_name, "a", "a")
    insert_entry(db.engine, identity.table_name, "b", "b")

    assert coverage(db.engine, "pages") == {
        "change_epoch": 2,
        "status": "never",
        "completed_at": None,
    }
    jobs = {job["content_id"]: int(job["change_epoch"]) for job in all_rows(db.engine, schema.work)}
    assert jobs == {"a": 1, "b": 2}
    # The status row's timestamp is database time in EmDash's sortable format.
    assert SORTABLE_TIMESTAMP.fullmatch(status_row(db.engine, "pages")["updated_at"])


def test_a_rolled_back_write_leaves_no_job_and_no_epoch(db):
    identity = create_active_fixture(db.engine, "drafts")

    with db.engine.connect() as connection:
        transaction = connection.begin()
        connection.execute(
            text(f'INSERT INTO "{identity.table_name}" (id, slug) VALUES (:id, :slug)'),
            {"id": "entry-1", "slug": "entry-1"},
        )
        assert connection.execute(select(schema.work.c.content_id)).scalars().all() == ["entry-1"]
        transaction.rollback()

    assert count_entries(db.engine, identity.table_name) == 0
    assert count(db.engine, schema.work) == 0
    assert coverage(db.engine, "drafts") == {
        "change_epoch": 0,
        "status": "complete",
        "completed_at": COMPLETED_AT,
    }


@pytest.mark.parametrize("capture_state", ["installing", "ready", "deleting", None])
def test_writes_are_rejected_unless_the_lifecycle_is_active(db, capture_state):
    identity = create_active_fixture(db.engine, "articles")
    set_status(db.engine, "articles", capture_state=capture_state)

    with pytest.raises(DBAPIError, match=CAPTURE_INACTIVE_MESSAGE):
        insert_entry(db.engine, identity.table_name, "entry-1", "entry-1")

    assert count_entries(db.engine, identity.table_name) == 0
    assert count(db.engine, schema.work) == 0
    assert coverage(db.engine, "articles") == {
        "change_epoch": 0,
        "status": "complete",
        "completed_at": COMPLETED_AT,
    }


def test_updates_and_deletes_are_rejected_while_fenced(db):
    identity = create_active_fixture(db.engine, "notes")
    table = identity.table_name
    insert_entry(db.engine, table, "entry-1", "original")
    set_status(db.engine, "notes", capture_state="deleting")

    with pytest.raises(DBAPIError, match=CAPTURE_INACTIVE_MESSAGE):
        execute(db.engine, f"UPDATE \"{table}\" SET slug = 'changed' WHERE id = 'entry-1'")
    with pytest.raises(DBAPIError, match=CAPTURE_INACTIVE_MESSAGE):
        execute(db.engine, f"DELETE FROM \"{table}\" WHERE id = 'entry-1'")

    assert entry_slugs(db.engine, table) == ["original"]
    assert [int(job["work_version"]) for job in all_rows(db.engine, schema.work)] == [1]
    assert int(status_row(db.engine, "notes")["change_epoch"]) == 1


def test_writes_are_rejected_after_the_registry_identity_changes(db):
    identity = create_active_fixture(db.engine, "articles")
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.collections)
            .where(schema.collections.c.id == identity.collection_id)
            .values(id=REPLACEMENT_ID)
        )

    with pytest.raises(DBAPIError, match=CAPTURE_INACTIVE_MESSAGE):
        insert_entry(db.engine, identity.table_name, "entry-2", "entry-2")

    assert count_entries(db.engine, identity.table_name) == 0
    assert count(db.engine, schema.work) == 0
    assert coverage(db.engine, "articles")["change_epoch"] == 0


def test_writes_are_rejected_after_the_registry_slug_changes(db):
    identity = create_active_fixture(db.engine, "articles")
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.collections)
            .where(schema.collections.c.id == identity.collection_id)
            .values(slug="renamed")
        )

    with pytest.raises(DBAPIError, match=CAPTURE_INACTIVE_MESSAGE):
        insert_entry(db.engine, identity.table_name, "entry-1", "entry-1")

    assert count_entries(db.engine, identity.table_name) == 0
    assert count(db.engine, schema.work) == 0
    assert coverage(db.engine, "articles")["change_epoch"] == 0


def test_writes_are_rejected_for_a_status_identity_mismatch(db):
    identity = create_active_fixture(db.engine, "status_mismatch")
    set_status(db.engine, "status_mismatch", collection_id="wrong-status-identity")

    with pytest.raises(DBAPIError, match=CAPTURE_INACTIVE_MESSAGE):
        insert_entry(db.engine, identity.table_name, "entry-1", "entry-1")

    assert count_entries(db.engine, identity.table_name) == 0
    assert count(db.engine, schema.work) == 0
    row = status_row(db.engine, "status_mismatch")
    assert (row["collection_id"], int(row["change_epoch"])) == ("wrong-status-identity", 0)


# --- install / verify -------------------------------------------------------------------------


def test_install_creates_exactly_the_three_named_triggers(db):
    identity = create_active_fixture(db.engine, "posts")

    assert owned(db.engine, identity) == set(identity.trigger_names().values())
    assert verified(db.engine, identity) is True
    # Another identity on the same table does not verify against these triggers.
    assert verified(db.engine, CaptureIdentity(REPLACEMENT_ID, "posts")) is False


def test_reinstalling_is_idempotent(db):
    identity = create_active_fixture(db.engine, "notes")
    before = owned(db.engine, identity)

    # The exact set exists, so no lifecycle fence is needed and nothing changes.
    install(db.engine, identity)
    install(db.engine, identity, replace_existing=False)
    insert_entry(db.engine, identity.table_name, "entry-1", "entry-1")

    assert owned(db.engine, identity) == before
    assert int(status_row(db.engine, "notes")["change_epoch"]) == 1
    assert [int(job["work_version"]) for job in all_rows(db.engine, schema.work)] == [1]


def test_stale_triggers_from_an_earlier_identity_are_replaced(db):
    previous = create_active_fixture(db.engine, "recreated_posts")
    set_status(
        db.engine, "recreated_posts", collection_id=REPLACEMENT_ID, capture_state="installing"
    )
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.collections)
            .where(schema.collections.c.id == previous.collection_id)
            .values(id=REPLACEMENT_ID)
        )
    replacement = CaptureIdentity(REPLACEMENT_ID, "recreated_posts")
    assert verified(db.engine, replacement) is False

    install(db.engine, replacement)
    set_status(db.engine, "recreated_posts", capture_state="active")
    insert_entry(db.engine, replacement.table_name, "entry-1", "entry-1")

    assert owned(db.engine, replacement) == set(replacement.trigger_names().values())
    assert owned(db.engine, replacement).isdisjoint(previous.trigger_names().values())
    assert verified(db.engine, replacement) is True
    assert verified(db.engine, previous) is False
    jobs = all_rows(db.engine, schema.work)
    assert [(job["collection_id"], job["content_id"]) for job in jobs] == [
        (REPLACEMENT_ID, "entry-1")
    ]


def test_a_disabled_or_incorrect_trigger_fails_verification_and_is_repaired_while_fenced(db):
    identity = create_active_fixture(db.engine, "corrupt_trigger")
    replace_insert_trigger_with_noop(db.engine, identity, db.is_postgres)

    assert owned(db.engine, identity) == set(identity.trigger_names().values())
    assert verified(db.engine, identity) is False
    # Capture is active: the set may not be touched until the collection is fenced.
    with pytest.raises(CaptureLifecycleError):
        install(db.engine, identity)
    assert verified(db.engine, identity) is False

    set_status(db.engine, "corrupt_trigger", capture_state="installing")
    install(db.engine, identity)
    set_status(db.engine, "corrupt_trigger", capture_state="active")
    assert verified(db.engine, identity) is True

    insert_entry(db.engine, identity.table_name, "entry-1", "entry-1")
    assert [job["content_id"] for job in all_rows(db.engine, schema.work)] == ["entry-1"]
    assert int(status_row(db.engine, "corrupt_trigger")["change_epoch"]) == 1


def test_install_without_replacement_keeps_same_named_triggers_and_fails_closed(db):
    identity = create_active_fixture(db.engine, "kept_trigger")
    replace_insert_trigger_with_noop(db.engine, identity, db.is_postgres)
    set_status(db.engine, "kept_trigger", capture_state="installing")

    with pytest.raises(RuntimeError, match="incomplete"):
        install(db.engine, identity, replace_existing=False)

    assert verified(db.engine, identity) is False


@pytest.mark.parametrize("capture_state", ["active", "ready", "deleting", None])
def test_install_outside_installing_is_refused_unless_the_exact_set_exists(db, capture_state):
    collection = CmsWriter(db.engine).create_collection("bare", NO_MEDIA)
    identity = CaptureIdentity(collection.id, "bare")
    set_status(db.engine, "bare", capture_state=capture_state)

    with pytest.raises(CaptureLifecycleError, match="fenced collection lifecycle"):
        install(db.engine, identity)

    assert owned(db.engine, identity) == set()
    assert verified(db.engine, identity) is False


def test_install_requires_the_status_row_of_the_exact_identity(db):
    collection = CmsWriter(db.engine).create_collection("bare", NO_MEDIA)
    set_status(db.engine, "bare", capture_state="installing")

    with pytest.raises(CaptureLifecycleError):
        install(db.engine, CaptureIdentity(REPLACEMENT_ID, "bare"))

    assert owned(db.engine, CaptureIdentity(collection.id, "bare")) == set()


def test_foreign_triggers_are_ignored_and_unexpected_owned_triggers_are_dropped(db):
    identity = create_active_fixture(db.engine, "shared")
    table = identity.table_name
    body = "EXECUTE FUNCTION test_noop()" if db.is_postgres else "BEGIN SELECT 1; END"
    if db.is_postgres:
        execute(
            db.engine,
            "CREATE FUNCTION test_noop() RETURNS trigger LANGUAGE plpgsql "
            "AS $$ BEGIN RETURN NULL; END; $$",
        )
    execute(db.engine, f'CREATE TRIGGER audit_posts AFTER INSERT ON "{table}" FOR EACH ROW {body}')
    assert verified(db.engine, identity) is True

    execute(
        db.engine, f'CREATE TRIGGER emdash_mu_extra AFTER INSERT ON "{table}" FOR EACH ROW {body}'
    )
    assert owned(db.engine, identity) == {*identity.trigger_names().values(), "emdash_mu_extra"}
    assert verified(db.engine, identity) is False

    set_status(db.engine, "shared", capture_state="installing")
    install(db.engine, identity, replace_existing=False)

    assert owned(db.engine, identity) == set(identity.trigger_names().values())
    assert verified(db.engine, identity) is True
    remove(db.engine, identity)
    assert owned(db.engine, identity) == set()
    if db.is_postgres:
        names = "SELECT tgname FROM pg_trigger WHERE tgrelid = CAST(:table AS regclass) AND NOT tgisinternal"
    else:
        names = "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = :table"
    with db.engine.connect() as connection:
        remaining = connection.execute(text(names), {"table": table}).scalars().all()
    assert remaining == ["audit_posts"]


def test_collection_ids_are_spliced_as_exact_literals(db):
    # Registry IDs are text: quotes and percent signs must survive the trigger DDL unchanged.
    odd_id = "50%_off'id"
    CmsWriter(db.engine).create_collection("odd", (), collection_id=odd_id)
    set_status(db.engine, "odd", capture_state="installing")
    identity = CaptureIdentity(odd_id, "odd")

    install(db.engine, identity)
    set_status(db.engine, "odd", capture_state="active")
    insert_entry(db.engine, identity.table_name, "entry-1", "entry-1")

    assert verified(db.engine, identity) is True
    assert [
        (job["collection_id"], job["content_id"]) for job in all_rows(db.engine, schema.work)
    ] == [(odd_id, "entry-1")]
    assert int(status_row(db.engine, "odd")["change_epoch"]) == 1


def test_verification_fails_when_the_table_is_missing(db):
    identity = create_active_fixture(db.engine, "dropped")
    execute(db.engine, f'DROP TABLE "{identity.table_name}"')

    assert verified(db.engine, identity) is False
    # Dropping the table dropped its triggers; removal has nothing left to do.
    remove(db.engine, identity)
    assert status_row(db.engine, "dropped")["capture_state"] == "active"


@pytest.mark.postgres_only("pg_trigger exists only on PostgreSQL")
def test_postgres_verification_reads_the_trigger_catalog(db):
    identity = create_active_fixture(db.engine, "catalog")
    names = identity.trigger_names()
    with db.engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT trigger.tgname AS name, trigger.tgtype AS type, "
                "encode(trigger.tgargs, 'hex') AS args, trigger.tgenabled AS enabled, "
                "procedure.proname AS function FROM pg_trigger AS trigger "
                "JOIN pg_proc AS procedure ON procedure.oid = trigger.tgfoid "
                "WHERE trigger.tgrelid = CAST('ec_catalog' AS regclass) AND NOT trigger.tgisinternal"
            )
        ).all()
    catalog = {row.name: (row.type, row.args, row.enabled, row.function) for row in rows}
    args = f"{identity.collection_id}\0catalog\0".encode().hex()
    function = "emdash_media_usage_capture_work"
    assert catalog == {
        names[CaptureOperation.INSERT]: (5, args, "O", function),
        names[CaptureOperation.UPDATE]: (17, args, "O", function),
        names[CaptureOperation.DELETE]: (9, args, "O", function),
    }

    # Same name, same function, wrong arguments.
    update_name = names[CaptureOperation.UPDATE]
    execute(db.engine, f'DROP TRIGGER "{update_name}" ON ec_catalog')
    execute(
        db.engine,
        f'CREATE TRIGGER "{update_name}" AFTER UPDATE ON ec_catalog FOR EACH ROW '
        f"EXECUTE FUNCTION emdash_media_usage_capture_work('{REPLACEMENT_ID}', 'catalog')",
    )
    assert verified(db.engine, identity) is False

    # Same name and arguments, but BEFORE instead of AFTER (tgtype 19, not 17).
    execute(db.engine, f'DROP TRIGGER "{update_name}" ON ec_catalog')
    execute(
        db.engine,
        f'CREATE TRIGGER "{update_name}" BEFORE UPDATE ON ec_catalog FOR EACH ROW '
        f"EXECUTE FUNCTION emdash_media_usage_capture_work('{identity.collection_id}', 'catalog')",
    )
    assert verified(db.engine, identity) is False

    # A WHEN clause makes the trigger conditional: not the exact set either.
    execute(db.engine, f'DROP TRIGGER "{update_name}" ON ec_catalog')
    execute(
        db.engine,
        f'CREATE TRIGGER "{update_name}" AFTER UPDATE ON ec_catalog FOR EACH ROW '
        "WHEN (OLD.slug IS DISTINCT FROM NEW.slug) "
        f"EXECUTE FUNCTION emdash_media_usage_capture_work('{identity.collection_id}', 'catalog')",
    )
    assert verified(db.engine, identity) is False

    set_status(db.engine, "catalog", capture_state="installing")
    install(db.engine, identity)
    assert verified(db.engine, identity) is True


@pytest.mark.sqlite_only("sqlite_master exists only on SQLite")
def test_sqlite_verification_compares_the_stored_ddl_ignoring_layout(db):
    identity = create_active_fixture(db.engine, "layout")
    name = identity.trigger_names()[CaptureOperation.INSERT]
    with db.engine.connect() as connection:
        stored = connection.execute(
            text("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = :name"),
            {"name": name},
        ).scalar_one()

    # EmDash writes the same statement indented with tabs; layout does not matter.
    execute(db.engine, f'DROP TRIGGER "{name}"')
    execute(db.engine, "\n\t\t".join(stored.splitlines()))
    assert verified(db.engine, identity) is True

    # One changed token does.
    execute(db.engine, f'DROP TRIGGER "{name}"')
    execute(db.engine, stored.replace("attempt_count = 0", "attempt_count = 1"))
    assert verified(db.engine, identity) is False


# --- atomicity --------------------------------------------------------------------------------


def test_a_multi_row_insert_rolls_back_every_row_job_and_epoch_when_one_row_fails(db):
    identity = create_active_fixture(db.engine, "bulk_posts")
    install_rejecting_work_trigger(db.engine, "entry-2", db.is_postgres)

    with pytest.raises(DBAPIError, match="forced work failure"):
        execute(
            db.engine,
            f'INSERT INTO "{identity.table_name}" (id, slug) '
            "VALUES ('entry-1', 'entry-1'), ('entry-2', 'entry-2')",
        )

    assert count_entries(db.engine, identity.table_name) == 0
    assert count(db.engine, schema.work) == 0
    assert coverage(db.engine, "bulk_posts") == {
        "change_epoch": 0,
        "status": "complete",
        "completed_at": COMPLETED_AT,
    }


def test_a_failing_statement_undoes_only_its_own_captures(db):
    identity = create_active_fixture(db.engine, "bulk_notes")
    table = identity.table_name

    with db.engine.connect() as connection, connection.begin():
        connection.execute(text(f"INSERT INTO \"{table}\" (id, slug) VALUES ('entry-0', 'kept')"))
        savepoint = connection.begin_nested()
        with pytest.raises(DBAPIError):
            # The second row violates the (slug, locale) uniqueness of the first.
            connection.execute(
                text(
                    f'INSERT INTO "{table}" (id, slug) '
                    "VALUES ('entry-1', 'duplicate'), ('entry-2', 'duplicate')"
                )
            )
        savepoint.rollback()

    assert entry_slugs(db.engine, table) == ["kept"]
    jobs = all_rows(db.engine, schema.work)
    assert [(job["content_id"], int(job["change_epoch"])) for job in jobs] == [("entry-0", 1)]
    assert coverage(db.engine, "bulk_notes") == {
        "change_epoch": 1,
        "status": "stale",
        "completed_at": None,
    }


# --- removal ----------------------------------------------------------------------------------


@pytest.mark.parametrize("capture_state", ["deleting", "installing"])
def test_triggers_can_be_removed_explicitly_while_fenced(db, capture_state):
    identity = create_active_fixture(db.engine, "scratch")
    set_status(db.engine, "scratch", capture_state=capture_state)

    remove(db.engine, identity)

    assert owned(db.engine, identity) == set()
    assert verified(db.engine, identity) is False
    insert_entry(db.engine, identity.table_name, "entry-1", "entry-1")
    assert count_entries(db.engine, identity.table_name) == 1
    assert count(db.engine, schema.work) == 0
    assert coverage(db.engine, "scratch")["change_epoch"] == 0


@pytest.mark.parametrize("capture_state", ["active", "ready", None])
def test_removal_is_refused_unless_fenced_and_writes_stay_captured(db, capture_state):
    identity = create_active_fixture(db.engine, "protected_posts")
    set_status(db.engine, "protected_posts", capture_state=capture_state)

    with pytest.raises(CaptureLifecycleError, match="fenced collection lifecycle"):
        remove(db.engine, identity)

    assert verified(db.engine, identity) is True
    set_status(db.engine, "protected_posts", capture_state="active")
    insert_entry(db.engine, identity.table_name, "entry-1", "entry-1")
    assert count_entries(db.engine, identity.table_name) == 1
    assert count(db.engine, schema.work) == 1
    assert coverage(db.engine, "protected_posts")["change_epoch"] == 1


def test_removal_is_refused_for_another_identity(db):
    identity = create_active_fixture(db.engine, "guarded")
    set_status(db.engine, "guarded", capture_state="deleting")

    with pytest.raises(CaptureLifecycleError):
        remove(db.engine, CaptureIdentity(REPLACEMENT_ID, "guarded"))

    assert owned(db.engine, identity) == set(identity.trigger_names().values())
