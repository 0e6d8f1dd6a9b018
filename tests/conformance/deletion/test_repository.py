"""Collection-deletion tombstones (upstream `…-deletion-foundation`): the repository's lease
transitions, the back-phase statements, the slug lock and bad input. The local guard has its
own file, `test_local_guard.py`.

Operator views of collection deletions (upstream `…-deletion-operator`): redacted pages with
cursors, and retry of failed, retrying and lease-expired tombstones.
"""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy.exc import IntegrityError

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.leases import LeaseState
from media_usage_orchestration.store.deletion.records import (
    DeletionClaim,
    DeletionLease,
    DeletionPhase,
    OperatorDeletionItem,
)
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from media_usage_orchestration.store.deletion.statements import find_due_statement
from media_usage_orchestration.values.cursors import encode_cursor
from media_usage_orchestration.values.errors import (
    DeletionCleanupIncomplete,
    DeletionIdentityConflict,
    DeletionLeaseLost,
    InvalidCursorError,
)
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome
from tests.support.deletions import (
    LEASE_SECONDS,
    add_reconciliation,
    add_source,
    add_work,
    claimed,
    expire_lease,
    ids,
    set_tombstone,
    tombstone,
    tombstone_row,
)
from tests.support.factories import insert_deletion
from tests.support.states import (
    all_rows,
    backdate,
    count,
    db_now,
    make_collection,
    one,
    snapshot,
    status_row,
)

ULID_LENGTH = 26


@pytest.fixture
def posts(db):
    return make_collection(db.engine, "posts")


@pytest.fixture
def repo(db):
    return DeletionRepository(db.engine)


# --- tombstones, claims and transitions ------------------------------------------------------


def test_create_tombstone_is_idempotent(db, posts, repo):
    first = repo.create_tombstone(posts.id, "posts", False)
    second = repo.create_tombstone(posts.id, "posts", False)
    assert first == second
    assert (first.state, first.phase, first.attempt_count) == (
        LeaseState.PENDING,
        DeletionPhase.FENCE,
        0,
    )
    assert first.force_delete is False and first.lease_token is None
    assert first.next_attempt_at <= db_now(db.engine)
    assert count(db.engine, schema.collection_deletions) == 1


def test_create_tombstone_refuses_a_conflicting_identity(db, posts, repo):
    repo.create_tombstone(posts.id, "posts", False)
    before = snapshot(db.engine)
    with pytest.raises(DeletionIdentityConflict, match="identity conflicts"):
        repo.create_tombstone(posts.id, "posts", True)
    with pytest.raises(DeletionIdentityConflict, match="identity conflicts"):
        repo.create_tombstone(posts.id, "articles", False)
    with pytest.raises(DeletionIdentityConflict, match="identity conflicts"):
        repo.create_tombstone("another-id", "posts", False)
    assert snapshot(db.engine) == before


def test_collection_slug_is_unique_in_the_table(db, posts):
    tombstone(db.engine, posts)
    stamp = db_now(db.engine)
    with pytest.raises(IntegrityError):
        insert_deletion(
            db.engine, collection_id="another-id", collection_slug="posts", next_attempt_at=stamp
        )


def test_slug_lock_lasts_until_finalize(db, posts, repo):
    assert not repo.is_slug_deleting("posts")
    tombstone(db.engine, posts)
    assert repo.is_slug_deleting("posts")
    assert not repo.is_slug_deleting("pages")
    assert repo.find_by_slug("posts").collection_id == posts.id
    assert repo.find_by_slug("pages") is None


def test_slug_lookups_treat_a_missing_table_as_no_tombstone(empty_db):
    repo = DeletionRepository(empty_db.engine)
    assert not repo.is_slug_deleting("posts")
    assert repo.find_by_slug("posts") is None


def test_claim_requires_the_phase_and_has_one_winner(db, posts, repo):
    tombstone(db.engine, posts)
    assert repo.claim(posts.id, DeletionPhase.REGISTRY, LEASE_SECONDS) is None
    claim = repo.claim(posts.id, "fence", LEASE_SECONDS)
    assert isinstance(claim, DeletionClaim)
    assert len(claim.lease_token) == ULID_LENGTH
    assert claim.state is LeaseState.LEASED and claim.lease_expires_at > claim.updated_at
    assert tombstone_row(db.engine, posts.id)["lease_token"] == claim.lease_token
    assert repo.claim(posts.id, DeletionPhase.FENCE, LEASE_SECONDS) is None


def test_an_expired_lease_is_taken_over_and_fences_its_old_owner(db, posts, repo):
    old = claimed(db.engine, posts)
    expire_lease(db.engine, posts.id)
    new = repo.claim(posts.id, DeletionPhase.FENCE, LEASE_SECONDS)
    assert new is not None and new.lease_token != old.lease_token
    before = snapshot(db.engine)
    assert not repo.checkpoint(old, DeletionPhase.FENCE, DeletionPhase.REGISTRY)
    assert not repo.release(old)
    assert not repo.cancel_fence(old)
    assert not repo.record_failure(old, "MEDIA_USAGE_COLLECTION_DELETION_FAILED", False, 30)
    assert repo.renew_lease(old, LEASE_SECONDS) is None
    assert snapshot(db.engine) == before


def test_expired_lease_cannot_transition(db, posts, repo):
    claim = claimed(db.engine, posts)
    expire_lease(db.engine, posts.id)
    before = snapshot(db.engine)
    assert not repo.checkpoint(claim, DeletionPhase.FENCE, DeletionPhase.REGISTRY)
    assert not repo.release(claim)
    assert not repo.cancel_fence(claim)
    assert not repo.record_failure(claim, "MEDIA_USAGE_COLLECTION_DELETION_FAILED", True, 0)
    assert snapshot(db.engine) == before


def test_checkpoint_moves_the_phase_and_resets_failures(db, posts, repo):
    claim = claimed(db.engine, posts)
    set_tombstone(db.engine, posts.id, attempt_count=3, last_error_code="SOME_ERROR")
    assert not repo.checkpoint(claim, DeletionPhase.REGISTRY, DeletionPhase.TABLE)
    assert repo.checkpoint(claim.lease, DeletionPhase.FENCE, "registry")
    row = tombstone_row(db.engine, posts.id)
    assert (row["phase"], row["state"], row["attempt_count"], row["last_error_code"]) == (
        "registry",
        "leased",
        0,
        None,
    )


def test_release_hands_back_a_due_pending_row(db, posts, repo):
    claim = claimed(db.engine, posts)
    assert not repo.release(DeletionLease(posts.id, "01STALESTALESTALESTALESTAL"))
    assert repo.release(claim)
    row = tombstone_row(db.engine, posts.id)
    assert row["state"] == "pending" and row["lease_token"] is None
    assert row["lease_expires_at"] is None and row["next_attempt_at"] <= db_now(db.engine)
    assert repo.claim(posts.id, DeletionPhase.FENCE, LEASE_SECONDS) is not None


def test_cancel_fence_deletes_the_tombstone_only_in_fence(db, posts, repo):
    claim = claimed(db.engine, posts, DeletionPhase.REGISTRY)
    assert not repo.cancel_fence(claim)
    assert tombstone_row(db.engine, posts.id) is not None
    set_tombstone(db.engine, posts.id, phase="fence")
    assert repo.cancel_fence(claim)
    assert tombstone_row(db.engine, posts.id) is None
    assert not repo.is_slug_deleting("posts")


def test_record_failure_schedules_a_retry_or_fails(db, posts, repo):
    claim = claimed(db.engine, posts, DeletionPhase.WORK)
    assert repo.record_failure(claim, "MEDIA_USAGE_COLLECTION_DELETION_FAILED", False, 30)
    row = tombstone_row(db.engine, posts.id)
    assert (row["state"], row["attempt_count"], row["phase"]) == ("retry", 1, "work")
    assert row["last_error_code"] == "MEDIA_USAGE_COLLECTION_DELETION_FAILED"
    assert row["lease_token"] is None and row["next_attempt_at"] > row["updated_at"]
    assert repo.claim(posts.id, DeletionPhase.WORK, LEASE_SECONDS) is None
    backdate(db.engine, schema.collection_deletions, "next_attempt_at", 1)
    again = repo.claim(posts.id, DeletionPhase.WORK, LEASE_SECONDS)
    assert again is not None and again.attempt_count == 1
    assert repo.record_failure(again, "MEDIA_USAGE_COLLECTION_DELETION_FAILED", True, 60)
    row = tombstone_row(db.engine, posts.id)
    assert (row["state"], row["attempt_count"], row["phase"]) == ("failed", 2, "work")
    assert repo.claim(posts.id, DeletionPhase.WORK, LEASE_SECONDS) is None


def test_renew_lease_extends_only_a_live_lease(db, posts, repo):
    claim = claimed(db.engine, posts)
    backdate(db.engine, schema.collection_deletions, "lease_expires_at", -5)
    renewed = repo.renew_lease(claim, LEASE_SECONDS)
    assert renewed is not None and renewed > db_now(db.engine, LEASE_SECONDS - 5)
    assert tombstone_row(db.engine, posts.id)["lease_expires_at"] == renewed
    expire_lease(db.engine, posts.id)
    assert repo.renew_lease(claim, LEASE_SECONDS) is None


def test_find_due_orders_by_due_time_across_states(db, repo):
    made = {name: make_collection(db.engine, name) for name in ("pend", "retr", "leas", "live")}
    made.update({name: make_collection(db.engine, name) for name in ("fail", "future")})
    for collection in made.values():
        tombstone(db.engine, collection)
    table = schema.collection_deletions
    set_tombstone(db.engine, made["retr"].id, state="retry")
    set_tombstone(db.engine, made["fail"].id, state="failed")
    set_tombstone(db.engine, made["leas"].id, state="leased", lease_token="t1")
    set_tombstone(db.engine, made["live"].id, state="leased", lease_token="t2")
    backdate(db.engine, table, "next_attempt_at", 100, collection_id=made["pend"].id)
    backdate(db.engine, table, "next_attempt_at", 200, collection_id=made["retr"].id)
    backdate(db.engine, table, "lease_expires_at", 300, collection_id=made["leas"].id)
    backdate(db.engine, table, "lease_expires_at", -300, collection_id=made["live"].id)
    backdate(db.engine, table, "next_attempt_at", -300, collection_id=made["future"].id)
    due = repo.find_due(4)
    assert [record.collection_slug for record in due] == ["leas", "retr", "pend"]
    assert [record.collection_slug for record in repo.find_due(2)] == ["leas", "retr"]


@pytest.mark.sqlite_only("EXPLAIN QUERY PLAN is SQLite's")
def test_find_due_uses_the_declared_indexes_on_sqlite(db):
    statement = find_due_statement(4).compile(
        dialect=db.engine.dialect, compile_kwargs={"literal_binds": True}
    )
    with db.engine.connect() as connection:
        plan = " ".join(
            str(row[-1]) for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}")
        )
    assert "idx__emdash_media_usage_collection_deletions_due" in plan
    assert "idx__emdash_media_usage_collection_deletions_lease" in plan
    assert "SCAN _emdash_media_usage_collection_deletions" not in plan


# --- registry phase ---------------------------------------------------------------------------


def test_registry_phase_removes_registry_and_fields_and_moves_to_table(db, posts, repo):
    pages = make_collection(db.engine, "pages")
    claim = claimed(db.engine, posts, DeletionPhase.REGISTRY)
    assert count(db.engine, schema.fields, collection_id=posts.id) == 2
    assert repo.delete_registry_and_checkpoint(claim, "posts")
    assert count(db.engine, schema.collections, id=posts.id) == 0
    assert count(db.engine, schema.fields, collection_id=posts.id) == 0
    assert tombstone_row(db.engine, posts.id)["phase"] == "table"
    assert count(db.engine, schema.collections, id=pages.id) == 1
    assert count(db.engine, schema.fields, collection_id=pages.id) == 2


@pytest.mark.parametrize("how", ["expired", "wrong_phase", "wrong_token", "wrong_slug"])
def test_registry_phase_needs_the_live_lease(db, posts, repo, how):
    phase = DeletionPhase.FENCE if how == "wrong_phase" else DeletionPhase.REGISTRY
    claim = claimed(db.engine, posts, phase)
    lease = claim.lease
    if how == "expired":
        expire_lease(db.engine, posts.id)
    if how == "wrong_token":
        lease = DeletionLease(posts.id, "01STALESTALESTALESTALESTAL")
    slug = "pages" if how == "wrong_slug" else "posts"
    before = snapshot(db.engine)
    assert not repo.delete_registry_and_checkpoint(lease, slug)
    assert snapshot(db.engine) == before


# --- back phases ------------------------------------------------------------------------------


def test_work_phase_deletes_fifty_rows_per_batch(db, posts, repo):
    pages = make_collection(db.engine, "pages")
    add_work(db.engine, posts, ids("entry", 54))
    add_work(db.engine, posts, ["entry-054"], state="leased")
    add_work(db.engine, pages, ids("entry", 3))
    claim = claimed(db.engine, posts, DeletionPhase.WORK)

    first = repo.delete_work_batch(claim)
    assert (first.phase, first.deleted, first.work_cursor) == ("work", 50, "entry-049")
    remaining = all_rows(db.engine, schema.work, collection_id=posts.id)
    assert sorted(row["content_id"] for row in remaining) == ids("entry", 55)[50:]
    row = tombstone_row(db.engine, posts.id)
    assert (row["phase"], row["work_cursor"], row["state"]) == ("work", "entry-049", "leased")

    second = repo.delete_work_batch(claim)
    assert (second.phase, second.deleted, second.work_cursor) == ("sources", 5, None)
    assert count(db.engine, schema.work, collection_id=posts.id) == 0
    row = tombstone_row(db.engine, posts.id)
    assert (row["phase"], row["work_cursor"]) == ("sources", None)
    assert count(db.engine, schema.work, collection_id=pages.id) == 3


def test_a_work_batch_resumes_from_the_stored_cursor_after_a_reclaim(db, posts, repo):
    add_work(db.engine, posts, ids("entry", 55))
    claim = claimed(db.engine, posts, DeletionPhase.WORK)
    assert repo.delete_work_batch(claim, batch=10).work_cursor == "entry-009"
    assert repo.release(claim)
    again = repo.claim(posts.id, DeletionPhase.WORK, LEASE_SECONDS)
    assert again.work_cursor == "entry-009"
    result = repo.delete_work_batch(again, batch=40)
    assert (result.deleted, result.work_cursor) == (40, "entry-049")
    remaining = all_rows(db.engine, schema.work, collection_id=posts.id)
    assert sorted(row["content_id"] for row in remaining) == ids("entry", 55)[50:]


def test_sources_phase_empties_one_source_at_a_time(db, posts, repo):
    pages = make_collection(db.engine, "pages")
    add_source(
        db.engine,
        "a-source",
        collection_id=posts.id,
        collection_slug="posts",
        occurrence_ids=ids("usage", 55),
    )
    add_source(
        db.engine,
        "legacy-source",
        collection_id=None,
        collection_slug="posts",
        identity_version=None,
        occurrence_ids=["legacy-1"],
    )
    add_source(
        db.engine,
        "other-source",
        collection_id=pages.id,
        collection_slug="pages",
        occurrence_ids=["other-1"],
    )
    claim = claimed(db.engine, posts, DeletionPhase.SOURCES)

    first = repo.delete_sources_batch(claim)
    assert (first.phase, first.deleted, first.source_key, first.occurrence_cursor) == (
        "sources",
        50,
        "a-source",
        "usage-049",
    )
    remaining = all_rows(db.engine, schema.occurrences, source_key="a-source")
    assert sorted(row["id"] for row in remaining) == ids("usage", 55)[50:]
    row = tombstone_row(db.engine, posts.id)
    assert (row["source_key"], row["occurrence_cursor"]) == ("a-source", "usage-049")

    second = repo.delete_sources_batch(claim)
    assert (second.phase, second.deleted, second.source_deleted) == ("sources", 5, True)
    assert count(db.engine, schema.occurrences, source_key="a-source") == 0
    assert count(db.engine, schema.sources, source_key="a-source") == 0
    row = tombstone_row(db.engine, posts.id)
    assert (row["phase"], row["source_key"], row["occurrence_cursor"]) == ("sources", None, None)

    third = repo.delete_sources_batch(claim)
    assert (third.phase, third.deleted) == ("status", 0)
    assert tombstone_row(db.engine, posts.id)["phase"] == "status"
    for key, occurrence in (("legacy-source", "legacy-1"), ("other-source", "other-1")):
        assert count(db.engine, schema.sources, source_key=key) == 1
        assert count(db.engine, schema.occurrences, id=occurrence) == 1


def test_sources_phase_is_not_filtered_by_identity_version(db, posts, repo):
    add_source(
        db.engine,
        "unversioned",
        collection_id=posts.id,
        collection_slug="posts",
        identity_version=None,
        occurrence_ids=["usage-1"],
    )
    claim = claimed(db.engine, posts, DeletionPhase.SOURCES)
    assert repo.delete_sources_batch(claim).source_deleted
    assert count(db.engine, schema.sources, source_key="unversioned") == 0


def test_status_phase_refuses_while_work_or_sources_remain(db, posts, repo):
    claim = claimed(db.engine, posts, DeletionPhase.STATUS)
    add_reconciliation(db.engine, posts)
    add_work(db.engine, posts, ["entry-000"])
    before = snapshot(db.engine)
    with pytest.raises(DeletionCleanupIncomplete, match="incomplete"):
        repo.delete_status(claim)
    assert snapshot(db.engine) == before
    with db.engine.begin() as connection:
        connection.execute(schema.work.delete())
    add_source(db.engine, "a-source", collection_id=posts.id, collection_slug="posts")
    before = snapshot(db.engine)
    with pytest.raises(DeletionCleanupIncomplete):
        repo.delete_status(claim)
    assert snapshot(db.engine) == before


def test_status_phase_removes_status_and_reconciliation_rows(db, posts, repo):
    pages = make_collection(db.engine, "pages")
    add_reconciliation(db.engine, posts)
    add_reconciliation(db.engine, pages)
    claim = claimed(db.engine, posts, DeletionPhase.STATUS)
    repo.delete_status(claim)
    assert status_row(db.engine, "posts") is None
    assert count(db.engine, schema.reconciliations, collection_id=posts.id) == 0
    assert status_row(db.engine, "pages") is not None
    assert count(db.engine, schema.reconciliations, collection_id=pages.id) == 1
    row = tombstone_row(db.engine, posts.id)
    assert (row["phase"], row["state"], row["attempt_count"]) == ("finalize", "leased", 0)


def _detached(db, collection):
    """The state after the front phases: registry row and content table gone."""
    with db.engine.begin() as connection:
        connection.execute(
            schema.fields.delete().where(schema.fields.c.collection_id == collection.id)
        )
        connection.execute(
            schema.collections.delete().where(schema.collections.c.id == collection.id)
        )
        connection.exec_driver_sql(f'DROP TABLE "ec_{collection.slug}"')


@pytest.mark.parametrize("leftover", ["table", "registry", "status", "work", "source"])
def test_finalize_refuses_while_anything_remains(db, posts, repo, leftover):
    claim = claimed(db.engine, posts, DeletionPhase.FINALIZE)
    if leftover not in ("table", "registry"):
        _detached(db, posts)
    if leftover == "registry":
        with db.engine.begin() as connection:
            connection.exec_driver_sql('DROP TABLE "ec_posts"')
    if leftover != "status":
        with db.engine.begin() as connection:
            connection.execute(schema.index_status.delete())
    if leftover == "work":
        add_work(db.engine, posts, ["entry-000"])
    if leftover == "source":
        add_source(db.engine, "a-source", collection_id=posts.id, collection_slug="posts")
    before = snapshot(db.engine)
    with pytest.raises(DeletionCleanupIncomplete):
        repo.finalize(claim)
    assert snapshot(db.engine) == before


def test_finalize_deletes_the_tombstone_and_frees_the_slug(db, posts, repo):
    claim = claimed(db.engine, posts, DeletionPhase.FINALIZE)
    _detached(db, posts)
    with db.engine.begin() as connection:
        connection.execute(schema.index_status.delete())
    repo.finalize(claim)
    assert tombstone_row(db.engine, posts.id) is None
    assert not repo.is_slug_deleting("posts")
    with pytest.raises(DeletionLeaseLost):
        repo.finalize(claim)


BACK_PHASE_CALLS = {
    DeletionPhase.WORK: lambda repo, lease: repo.delete_work_batch(lease),
    DeletionPhase.SOURCES: lambda repo, lease: repo.delete_sources_batch(lease),
    DeletionPhase.STATUS: lambda repo, lease: repo.delete_status(lease),
    DeletionPhase.FINALIZE: lambda repo, lease: repo.finalize(lease),
}
OTHER_PHASE = {
    DeletionPhase.WORK: DeletionPhase.SOURCES,
    DeletionPhase.SOURCES: DeletionPhase.WORK,
    DeletionPhase.STATUS: DeletionPhase.WORK,
    DeletionPhase.FINALIZE: DeletionPhase.STATUS,
}


def _ready_for(db, collection, phase):
    """Rows the phase would act on, so a refusal is visible as "nothing changed"."""
    if phase is DeletionPhase.WORK:
        add_work(db.engine, collection, ids("entry", 3))
    if phase is DeletionPhase.SOURCES:
        add_source(
            db.engine,
            "a-source",
            collection_id=collection.id,
            collection_slug=collection.slug,
            occurrence_ids=ids("usage", 3),
        )
    if phase is DeletionPhase.STATUS:
        add_reconciliation(db.engine, collection)
    if phase is DeletionPhase.FINALIZE:
        _detached(db, collection)
        with db.engine.begin() as connection:
            connection.execute(schema.index_status.delete())


@pytest.mark.parametrize("phase", list(BACK_PHASE_CALLS))
@pytest.mark.parametrize("how", ["wrong_token", "expired", "wrong_phase", "released"])
def test_back_phase_with_a_lost_lease_changes_nothing(db, posts, repo, phase, how):
    claim = claimed(db.engine, posts, OTHER_PHASE[phase] if how == "wrong_phase" else phase)
    _ready_for(db, posts, phase)
    lease = claim.lease
    if how == "wrong_token":
        lease = DeletionLease(posts.id, "01STALESTALESTALESTALESTAL")
    if how == "expired":
        expire_lease(db.engine, posts.id)
    if how == "released":
        assert repo.release(claim)
    before = snapshot(db.engine)
    with pytest.raises(DeletionLeaseLost, match="lease was lost"):
        BACK_PHASE_CALLS[phase](repo, lease)
    assert snapshot(db.engine) == before


# ==================================================================================================
# The operator's deletion page and retry
# ==================================================================================================


FAILED_CODE = "MEDIA_USAGE_COLLECTION_DELETION_FAILED"


def failed_tombstone(db, slug, phase=DeletionPhase.WORK):
    collection = make_collection(db.engine, slug)
    claim = claimed(db.engine, collection, phase)
    assert DeletionRepository(db.engine).record_failure(claim, FAILED_CODE, True, 0)
    return collection


def stamp_all(db, updated_at):
    """Equal `updated_at` everywhere, so the collection id alone orders the page."""
    with db.engine.begin() as connection:
        connection.execute(schema.collection_deletions.update().values(updated_at=updated_at))


def test_pages_are_redacted_ordered_and_bounded(db, repo):
    made = [failed_tombstone(db, f"coll_{index}") for index in range(5)]
    stamp_all(db, "2026-01-01T00:00:00.000Z")
    expected = sorted((collection.id for collection in made), reverse=True)

    first = repo.find_operator_page(limit=2)
    assert all(isinstance(item, OperatorDeletionItem) for item in first.items)
    field_names = {field.name for field in dataclasses.fields(OperatorDeletionItem)}
    assert "lease_token" not in field_names and "force_delete" not in field_names
    assert first.next_cursor is not None
    second = repo.find_operator_page(limit=2, cursor=first.next_cursor)
    third = repo.find_operator_page(limit=2, cursor=second.next_cursor)
    assert third.next_cursor is None
    walked = [item.collection_id for page in (first, second, third) for item in page.items]
    assert walked == expected

    item = first.items[0]
    assert (item.state, item.phase, item.attempt_count, item.last_error_code) == (
        LeaseState.FAILED,
        DeletionPhase.WORK,
        1,
        FAILED_CODE,
    )


def test_an_exact_full_page_has_no_cursor(db, repo):
    for index in range(3):
        failed_tombstone(db, f"coll_{index}")
    page = repo.find_operator_page(limit=3)
    assert len(page.items) == 3 and page.next_cursor is None


def test_newest_updates_come_first(db, repo):
    older = failed_tombstone(db, "older")
    newer = failed_tombstone(db, "newer")
    with db.engine.begin() as connection:
        table = schema.collection_deletions
        connection.execute(
            table.update()
            .where(table.c.collection_id == older.id)
            .values(updated_at="2026-01-01T00:00:00.000Z")
        )
        connection.execute(
            table.update()
            .where(table.c.collection_id == newer.id)
            .values(updated_at="2026-01-02T00:00:00.000Z")
        )
    page = repo.find_operator_page(limit=1)
    assert page.items[0].collection_id == newer.id
    rest = repo.find_operator_page(limit=1, cursor=page.next_cursor)
    assert [item.collection_id for item in rest.items] == [older.id]
    assert rest.next_cursor is None


def test_state_filter_defaults_to_failed(db, repo):
    failed = failed_tombstone(db, "failed_one")
    pending = make_collection(db.engine, "pending_one")
    tombstone(db.engine, pending)
    assert [item.collection_id for item in repo.find_operator_page().items] == [failed.id]
    pending_page = repo.find_operator_page(state="pending")
    assert [item.collection_id for item in pending_page.items] == [pending.id]
    assert repo.find_operator_page(state=LeaseState.RETRY).items == ()


@pytest.mark.parametrize(
    "cursor",
    ["not base64!", "", encode_cursor("x", "y")[:-2] + "@@", "eyJmb28iOiAxfQ==", "W10="],
)
def test_a_malformed_cursor_is_rejected(db, repo, cursor):
    with pytest.raises(InvalidCursorError):
        repo.find_operator_page(cursor=cursor)


@pytest.mark.parametrize("state", ["failed", "retry", "expired"])
def test_retry_reopens_with_the_phase_unchanged(db, repo, state):
    collection = make_collection(db.engine, "posts")
    claim = claimed(db.engine, collection, DeletionPhase.SOURCES)
    if state == "expired":
        expire_lease(db.engine, collection.id)
    else:
        assert repo.record_failure(claim, FAILED_CODE, state == "failed", 600)

    result = repo.retry_operator_deletion(collection.id)

    assert result.outcome is OperatorRetryOutcome.PENDING and result.changed
    row = one(db.engine, schema.collection_deletions, collection_id=collection.id)
    assert (row["state"], row["phase"], row["attempt_count"]) == ("pending", "sources", 0)
    assert row["lease_token"] is None and row["lease_expires_at"] is None
    assert row["last_error_code"] is None and row["next_attempt_at"] <= db_now(db.engine)
    assert result.row.collection_id == collection.id
    assert result.row.phase is DeletionPhase.SOURCES and result.row.state is LeaseState.PENDING
    assert repo.claim(collection.id, DeletionPhase.SOURCES, LEASE_SECONDS) is not None


def test_retry_does_not_steal_a_live_lease(db, repo):
    collection = make_collection(db.engine, "posts")
    claimed(db.engine, collection, DeletionPhase.WORK)
    row = one(db.engine, schema.collection_deletions, collection_id=collection.id)
    before = snapshot(db.engine)
    result = repo.retry_operator_deletion(collection.id)
    assert result.outcome is OperatorRetryOutcome.LEASE_ACTIVE and not result.changed
    assert result.lease_expires_at == row["lease_expires_at"]
    assert result.row is None
    assert snapshot(db.engine) == before


def test_retry_of_a_missing_tombstone_is_not_found(db, repo):
    assert repo.retry_operator_deletion("missing-id").outcome is OperatorRetryOutcome.NOT_FOUND


def test_retry_of_a_pending_tombstone_is_a_conflict(db, repo):
    collection = make_collection(db.engine, "posts")
    tombstone(db.engine, collection, DeletionPhase.WORK)
    set_tombstone(db.engine, collection.id, attempt_count=2)
    before = snapshot(db.engine)
    result = repo.retry_operator_deletion(collection.id)
    assert result.outcome is OperatorRetryOutcome.CONFLICT and not result.changed
    assert snapshot(db.engine) == before
