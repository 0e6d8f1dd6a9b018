"""The repository steps of EmDash's `media-usage-reconciliation-scan` scenario: a bounded,
checkpointed scan of `ec_<slug>` that enqueues entry work at the run's epoch, then a bounded
walk over the collection's canonical sources."""

from __future__ import annotations

from dataclasses import replace

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.reconciliations import (
    ReconciliationPhase,
    ReconciliationRepository,
    SourceCandidate,
)
from media_usage_orchestration.store.work import WorkRepository
from tests.factories import insert_source, insert_work, of
from tests.store.reconciliation_helpers import (
    FINGERPRINT,
    reconciliation_row,
    reload_claim,
    seed_and_claim,
    start_scan,
)
from tests.support import NO_MEDIA, all_rows, backdate, count, make_collection, set_activation

ENTRY_IDS = [f"entry-{number:03d}" for number in range(51)]


def entries_collection(db, slug: str = "posts", fields=None):
    """51 entries with an image, written before activation (no captured epoch moves)."""
    kwargs = {} if fields is None else {"fields": fields}
    collection = make_collection(db.engine, slug, **kwargs)
    rows = [{"id": content_id, "title": content_id} for content_id in ENTRY_IDS]
    if fields is None:
        for row in rows:
            row["hero"] = {"id": f"media-{row['id']}", "provider": "local"}
    CmsWriter(db.engine).insert_entries(slug, rows)
    return collection


def claimed_scan(db, slug: str = "posts", fields=None):
    return seed_and_claim_existing(db, entries_collection(db, slug, fields))


def seed_and_claim_existing(db, collection):
    set_activation(db.engine)
    repository = ReconciliationRepository(db.engine)
    assert repository.seed_next_candidate()
    run_token = reconciliation_row(db.engine, collection.id)["run_token"]
    claim = repository.claim(collection.id, run_token, 60)
    assert claim is not None
    return collection, claim


def enqueue(db, claim, epoch, ids, phase="scan"):
    WorkRepository(db.engine).enqueue_reconciliation_page(
        collection_id=claim.collection_id,
        collection_slug=claim.collection_slug,
        run_token=claim.run_token,
        lease_token=claim.lease_token,
        change_epoch=epoch,
        phase=phase,
        content_ids=ids,
    )


def work_by_id(db, collection) -> dict[str, dict]:
    rows = all_rows(db.engine, schema.work, collection_id=collection.id)
    return {row["content_id"]: row for row in rows}


def test_scan_pages_enqueue_work_at_the_run_epoch_and_checkpoint(db):
    collection = entries_collection(db)
    insert_work(db.engine, **of(collection), content_id="entry-001", state="failed", change_epoch=0)
    insert_work(
        db.engine,
        **of(collection),
        content_id="entry-002",
        state="failed",
        change_epoch=99,
        last_error_code="KEEP",
    )
    _collection, claim = seed_and_claim_existing(db, collection)
    repository = ReconciliationRepository(db.engine)

    epoch = repository.begin_run(claim)
    assert epoch == 1
    upper = repository.find_scan_upper_id(claim)
    assert upper == "entry-050"
    assert repository.initialize_scan(claim, epoch, FINGERPRINT, upper)
    claim = reload_claim(db.engine, claim)
    assert (claim.target_epoch, claim.field_fingerprint, claim.scan_upper_id) == (
        1,
        FINGERPRINT,
        "entry-050",
    )

    page = repository.find_scan_page(claim, 50)
    assert page == ENTRY_IDS[:50]
    enqueue(db, claim, epoch, page)
    assert repository.checkpoint_scan(claim, epoch, None, page[-1])
    assert reconciliation_row(db.engine, collection.id)["scan_cursor"] == "entry-049"

    work = work_by_id(db, collection)
    assert sorted(work) == ENTRY_IDS[:50]
    reopened = work["entry-001"]
    assert (reopened["change_epoch"], reopened["work_version"], reopened["state"]) == (
        1,
        2,
        "pending",
    )
    untouched = work["entry-002"]
    assert (untouched["change_epoch"], untouched["state"], untouched["last_error_code"]) == (
        99,
        "failed",
        "KEEP",
    )
    assert {row["change_epoch"] for cid, row in work.items() if cid != "entry-002"} == {1}


def test_replaying_a_page_after_resetting_the_cursor_is_idempotent(db):
    collection, claim = claimed_scan(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim, "entry-050")
    page = repository.find_scan_page(claim, 50)
    enqueue(db, claim, epoch, page)
    assert repository.checkpoint_scan(claim, epoch, None, page[-1])
    first = work_by_id(db, collection)

    with db.engine.begin() as connection:
        connection.execute(
            schema.reconciliations.update()
            .where(schema.reconciliations.c.collection_id == collection.id)
            .values(scan_cursor=None)
        )
    claim = reload_claim(db.engine, claim)
    assert repository.find_scan_page(claim, 50) == page
    enqueue(db, claim, epoch, page)
    assert repository.checkpoint_scan(claim, epoch, None, page[-1])

    assert count(db.engine, schema.work, collection_id=collection.id) == 50
    assert work_by_id(db, collection) == first


def test_the_scan_continues_to_the_upper_id_then_is_exhausted(db):
    collection, claim = claimed_scan(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim, "entry-050")
    first_page = repository.find_scan_page(claim, 50)
    enqueue(db, claim, epoch, first_page)
    assert repository.checkpoint_scan(claim, epoch, None, "entry-049")
    CmsWriter(db.engine).insert_entry("posts", {"id": "entry-051", "title": "late"})
    claim = reload_claim(db.engine, claim)

    second_page = repository.find_scan_page(claim, 50)
    assert second_page == ["entry-050"]
    enqueue(db, claim, epoch, second_page)
    assert not repository.checkpoint_scan(claim, epoch, None, "entry-050")
    assert not repository.checkpoint_scan(claim, epoch, "entry-010", "entry-050")
    assert repository.checkpoint_scan(claim, epoch, "entry-049", "entry-050")
    assert not repository.checkpoint_scan(claim, epoch, "entry-049", "entry-050")

    claim = reload_claim(db.engine, claim)
    assert claim.scan_cursor == "entry-050"
    assert repository.find_scan_page(claim, 50) == []
    assert count(db.engine, schema.work, collection_id=collection.id) == 51


def test_scan_reads_and_checkpoints_need_the_live_claim_and_the_owned_epoch(db):
    collection, claim = claimed_scan(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim, "entry-050")
    assert repository.find_scan_page(replace(claim, lease_token="stale"), 50) == []
    assert repository.find_scan_page(replace(claim, target_epoch=None), 50) == []
    assert not repository.checkpoint_scan(claim, epoch + 1, None, "entry-049")
    assert not repository.checkpoint_scan(
        replace(claim, lease_token="stale"), epoch, None, "entry-049"
    )

    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=collection.id)
    assert repository.find_scan_upper_id(claim) is None
    assert repository.find_scan_page(claim, 50) == []
    assert not repository.checkpoint_scan(claim, epoch, None, "entry-049")


def test_a_collection_without_media_fields_scans_nothing(db):
    collection, claim = claimed_scan(db, "notes", NO_MEDIA)
    repository = ReconciliationRepository(db.engine)
    epoch = repository.begin_run(claim)
    assert repository.initialize_scan(claim, epoch, FINGERPRINT, None)
    claim = reload_claim(db.engine, claim)
    assert claim.scan_upper_id is None
    assert repository.find_scan_page(claim, 50) == []
    assert count(db.engine, schema.work, collection_id=collection.id) == 0


def test_an_empty_collection_has_no_upper_id(db):
    collection = make_collection(db.engine, "empty")
    _collection, claim = seed_and_claim_existing(db, collection)
    assert ReconciliationRepository(db.engine).find_scan_upper_id(claim) is None


def _sources_fixture(db):
    collection, claim = seed_and_claim(db.engine, "posts")
    other = make_collection(db.engine, "pages")
    for number in range(5):
        insert_source(db.engine, f"content:posts:entry-{number:03d}", **of(collection))
    insert_source(
        db.engine, "content:posts:entry-001:draft", **of(collection), source_variant="draft_overlay"
    )
    insert_source(db.engine, "content:posts:zz-legacy", **of(collection), identity_version=None)
    insert_source(db.engine, "content:posts:zzz-other-collection", **of(other))
    return collection, claim


def test_source_pages_walk_canonical_sources_only(db):
    collection, claim = _sources_fixture(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim)

    upper = repository.find_source_upper_key(claim, epoch)
    assert upper == "content:posts:entry-004"
    assert repository.find_source_upper_key(claim, epoch + 1) is None
    assert repository.transition_to_sources(claim, epoch, FINGERPRINT, upper)
    claim = reload_claim(db.engine, claim)
    assert claim.phase is ReconciliationPhase.SOURCES
    # Published mid-walk below the upper key: still visited, nothing beyond it is.
    insert_source(db.engine, "content:posts:entry-003x", **of(collection))
    insert_source(db.engine, "content:posts:entry-005", **of(collection))

    keys: list[str] = []
    previous = None
    while page := repository.find_source_page(claim, 2):
        keys.extend(candidate.source_key for candidate in page)
        assert repository.checkpoint_sources(claim, epoch, previous, page[-1].source_key)
        previous = page[-1].source_key
        claim = reload_claim(db.engine, claim)
    assert keys == [
        "content:posts:entry-000",
        "content:posts:entry-001",
        "content:posts:entry-001:draft",
        "content:posts:entry-002",
        "content:posts:entry-003",
        "content:posts:entry-003x",
        "content:posts:entry-004",
    ]
    assert claim.source_cursor == upper


def test_source_page_returns_identity_and_variant_and_respects_guards(db):
    collection, claim = _sources_fixture(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim)
    assert repository.transition_to_sources(claim, epoch, FINGERPRINT, "content:posts:entry-001")
    claim = reload_claim(db.engine, claim)

    assert repository.find_source_page(claim, 50) == [
        SourceCandidate("content:posts:entry-000", "entry-000", "columns"),
        SourceCandidate("content:posts:entry-001", "entry-001", "columns"),
    ]
    assert repository.find_source_page(replace(claim, source_upper_key=None), 50) == []
    assert repository.find_source_page(replace(claim, lease_token="stale"), 50) == []
    assert not repository.checkpoint_sources(claim, epoch, "content:x", "content:posts:entry-000")
    assert not repository.checkpoint_scan(claim, epoch, None, "content:posts:entry-000")

    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=collection.id)
    assert repository.find_source_page(claim, 50) == []
    assert not repository.checkpoint_sources(claim, epoch, None, "content:posts:entry-000")


def test_find_missing_content_ids_returns_absent_ids_once_in_order(db):
    entries_collection(db)
    repository = ReconciliationRepository(db.engine)
    ids = ["entry-003", "gone-2", "entry-000", "gone-1", "gone-2"]
    assert repository.find_missing_content_ids("posts", ids) == ["gone-2", "gone-1"]
    assert repository.find_missing_content_ids("posts", []) == []
    assert repository.find_missing_content_ids("posts", ENTRY_IDS[:50]) == []


def test_enqueue_is_refused_once_the_scan_lost_its_lease(db):
    collection, claim = claimed_scan(db)
    repository = ReconciliationRepository(db.engine)
    epoch, claim = start_scan(db.engine, claim, "entry-050")
    page = repository.find_scan_page(claim, 50)
    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=collection.id)
    enqueue(db, claim, epoch, page)
    assert count(db.engine, schema.work, collection_id=collection.id) == 0
    assert reconciliation_row(db.engine, collection.id)["scan_cursor"] is None
