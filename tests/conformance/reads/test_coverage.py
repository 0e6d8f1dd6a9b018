"""What each collection's index holds (`store/reads/coverage.py`): the status row's fields, the
entries of its content table (trashed ones included), its canonical sources and the occurrences
of their current generations only, its work per state (stuck work by the database clock, failed
work per code), and the health the status row reads as."""

from __future__ import annotations

import pytest

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.store.reads.coverage import (
    CollectionCoverage,
    health_status,
    read_all_coverage,
    read_collection_coverage,
    read_coverage_state,
)
from media_usage_orchestration.store.reconciliation.records import PROCESSING_FAILED_CODE
from tests.support.factories import (
    backing_off,
    expired,
    failed,
    insert_occurrences,
    insert_reconciliation,
    insert_registry,
    insert_source,
    insert_works,
    leased,
    of,
)
from tests.support.states import make_collection, set_status

CODE = "MEDIA_USAGE_PROCESSING_FAILED"
LIMIT_CODE = "MEDIA_USAGE_RESOURCE_LIMIT"


@pytest.fixture
def alpha(db):
    """A captured collection with three entries (one trashed), two canonical sources with old
    generations left behind, sources that are not its canonical ones, work in every state and
    a reconciliation in progress."""
    collection = make_collection(db.engine, "alpha", change_epoch=6)
    writer = CmsWriter(db.engine)
    for content_id in ("e1", "e2", "e3"):
        writer.insert_entry("alpha", {"id": content_id, "slug": content_id, "title": content_id})
    writer.trash_entry("alpha", "e3")

    def source(key: str, generation: str = "gen-2", **overrides) -> None:
        insert_source(db.engine, key, **of(collection), current_generation=generation, **overrides)

    source("content:alpha:e1:columns")
    source("content:alpha:e2:columns", generation="gen-1")
    source("legacy:alpha:e1", identity_version=None)  # not canonical: no identity version
    source("setting:alpha:e1", source_type="setting")  # not a content source
    insert_source(db.engine, "content:other:x:columns", collection_id="id-other")
    occurrences = {
        ("content:alpha:e1:columns", "gen-2"): 2,  # current
        ("content:alpha:e1:columns", "gen-1"): 3,  # superseded, awaiting cleanup
        ("content:alpha:e2:columns", "gen-1"): 1,  # current
        ("legacy:alpha:e1", "gen-2"): 4,
        ("content:other:x:columns", "generation-1"): 5,
    }
    rows = [
        {
            "source_key": key,
            "index": index,
            "id": f"{key}-{generation}-{index}",
            "generation": generation,
        }
        for (key, generation), total in occurrences.items()
        for index in range(total)
    ]
    insert_occurrences(db.engine, rows)
    insert_works(
        db.engine,
        [
            {"content_id": "pending"},
            {"content_id": "retry", **backing_off()},
            {"content_id": "held", **leased()},
            {"content_id": "stuck-1", **expired(seconds_ago=30)},
            {"content_id": "stuck-2", **expired(seconds_ago=1)},
            {"content_id": "failed-1", **failed(CODE)},
            {"content_id": "failed-2", **failed(CODE)},
            {"content_id": "failed-3", **failed(LIMIT_CODE)},
            {"content_id": "failed-4", **failed(CODE), "last_error_code": None},
        ],
        **of(collection),
    )
    insert_works(db.engine, [{"content_id": "elsewhere"}], collection_id="id-other")
    insert_reconciliation(db.engine, **of(collection), state="leased")
    return collection


def test_a_collections_coverage_counts_its_own_index_and_work(db, alpha):
    coverage = read_collection_coverage(db.engine, alpha.id)

    assert isinstance(coverage, CollectionCoverage)
    assert (coverage.collection_id, coverage.collection_slug) == (alpha.id, "alpha")
    assert (coverage.capture_state, coverage.status) == ("active", "stale")
    assert (coverage.change_epoch, coverage.reconciliation_required) == (6, True)
    assert coverage.entries == 3  # the trashed entry included
    assert (coverage.sources, coverage.occurrences) == (2, 3)
    assert (coverage.pending_work, coverage.failed_work, coverage.stuck_work) == (5, 4, 2)
    assert coverage.failed_work_codes == {CODE: 2, LIMIT_CODE: 1, "unknown": 1}
    assert coverage.reconciliation_state == "leased"
    assert coverage.reconciliation_updated_at is not None
    assert coverage.status_updated_at is not None
    assert (coverage.problem_code, coverage.problem) == (None, None)
    assert coverage.needs_operator is True and coverage.is_complete is False


def test_a_collection_no_longer_registered_has_no_coverage(db, alpha):
    assert read_collection_coverage(db.engine, "id-gone") is None


def test_every_registered_collection_is_listed_by_slug(db, alpha):
    make_collection(db.engine, "gamma", status="complete", reconciliation_required=0)
    insert_registry(db.engine, id="id-beta", slug="beta")  # no status row, no content table

    listed = read_all_coverage(db.engine)

    assert [coverage.collection_slug for coverage in listed] == ["alpha", "beta", "gamma"]
    assert listed[0] == read_collection_coverage(db.engine, alpha.id)
    beta = listed[1]
    assert (beta.capture_state, beta.status, beta.change_epoch) == (None, None, None)
    assert (beta.reconciliation_required, beta.entries, beta.problem) == (None, None, None)
    assert (beta.sources, beta.occurrences, beta.pending_work, beta.failed_work) == (0, 0, 0, 0)
    assert beta.reconciliation_state is None and beta.failed_work_codes == {}
    gamma = listed[2]
    assert (gamma.status, gamma.reconciliation_required, gamma.entries) == ("complete", False, 0)
    assert gamma.is_complete is True and gamma.needs_operator is False


def test_a_registry_row_with_an_invalid_slug_is_reported_and_still_counted(db, alpha):
    insert_registry(db.engine, id="id-bad", slug="bad-slug")
    insert_works(db.engine, [{"content_id": "x", **failed(CODE)}], collection_id="id-bad")

    listed = {coverage.collection_slug: coverage for coverage in read_all_coverage(db.engine)}

    bad = listed["bad-slug"]
    assert (bad.entries, bad.problem_code) == (None, PROCESSING_FAILED_CODE)
    assert "Invalid collection slug" in bad.problem
    assert (bad.failed_work, bad.failed_work_codes) == (1, {CODE: 1})
    assert listed["alpha"].entries == 3  # the others are read all the same


def test_coverage_is_complete_only_without_failed_or_stuck_work(db):
    collection = make_collection(db.engine, "posts", status="complete", reconciliation_required=0)
    assert read_collection_coverage(db.engine, collection.id).is_complete is True

    insert_works(db.engine, [{"content_id": "stuck", **expired()}], **of(collection))
    stuck = read_collection_coverage(db.engine, collection.id)
    assert (stuck.stuck_work, stuck.is_complete, stuck.needs_operator) == (1, False, False)

    set_status(db.engine, "posts", status="failed")
    assert read_collection_coverage(db.engine, collection.id).needs_operator is True


def test_the_coverage_state_is_the_health_status_and_whether_work_failed(db, alpha):
    trusted = make_collection(db.engine, "trusted", status="stale", reconciliation_required=0)
    insert_registry(db.engine, id="id-beta", slug="beta")

    assert read_coverage_state(db.engine, alpha.id) == ("stale", True)
    assert read_coverage_state(db.engine, trusted.id) == ("complete", False)
    assert read_coverage_state(db.engine, "id-beta") == (None, False)
    assert read_coverage_state(db.engine, "id-gone") is None

    insert_works(db.engine, [{"content_id": "x", **failed(CODE)}], **of(trusted))
    assert read_coverage_state(db.engine, trusted.id) == ("complete", True)


@pytest.mark.parametrize(
    ("status", "required", "health"),
    [
        ("stale", False, "complete"),
        ("stale", True, "stale"),
        ("stale", None, "complete"),
        ("complete", True, "complete"),
        ("partial", False, "partial"),
        ("failed", False, "failed"),
        (None, None, None),
    ],
)
def test_health_reads_a_stale_status_that_needs_no_reconciliation_as_complete(
    status, required, health
):
    assert health_status(status, required) == health
