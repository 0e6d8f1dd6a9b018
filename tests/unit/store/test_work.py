"""Bad input to the work repository (seed `media-usage-work.ts`) is refused before any SQL,
on an engine of each dialect that never connects: nothing can have changed."""

from __future__ import annotations

import pytest

from media_usage_orchestration.store.work.records import WorkLease
from media_usage_orchestration.store.work.repository import WorkRepository
from media_usage_orchestration.store.work.statements import due_rows_statement

GOOD_LEASE = WorkLease("collection-1", "entry-1", 1, "token")
YEAR = 365 * 24 * 60 * 60
RUN_TOKEN = "01J0RUNTOKEN0000000000000A"
RECONCILIATION_LEASE = "01J0RECONCILIATIONLEASE00A"
TARGET_EPOCH = 4


@pytest.fixture
def repo(no_sql_engine) -> WorkRepository:
    return WorkRepository(no_sql_engine)


BAD_CALLS = [
    pytest.param(lambda r: r.find_due_work(0), r"due-work limit", id="due-limit-0"),
    pytest.param(lambda r: r.find_due_work(101), r"due-work limit", id="due-limit-101"),
    pytest.param(lambda r: r.find_due_work(True), r"due-work limit", id="due-limit-bool"),
    pytest.param(
        lambda r: r.claim_work("", "entry-1", 1, 60), r"identity", id="claim-no-collection"
    ),
    pytest.param(
        lambda r: r.claim_work("collection-1", "", 1, 60), r"identity", id="claim-no-content"
    ),
    pytest.param(
        lambda r: r.claim_work("collection-1", "entry-1", 1, YEAR + 1),
        r"one year",
        id="claim-lease-too-long",
    ),
    pytest.param(
        lambda r: r.complete_work(GOOD_LEASE.__class__("collection-1", "entry-1", 1, "")),
        r"lease token",
        id="complete-no-token",
    ),
    pytest.param(
        lambda r: r.complete_work(WorkLease("collection-1", "entry-1", 0, "t")),
        r"work version",
        id="complete-version-0",
    ),
    pytest.param(
        lambda r: r.complete_work(("collection-1", "entry-1", 1, "t")),
        r"WorkLease",
        id="complete-not-a-lease",
    ),
    pytest.param(
        lambda r: r.retry_work(GOOD_LEASE, -1, "RETRY"), r"retry delay", id="retry-negative-delay"
    ),
    pytest.param(
        lambda r: r.retry_work(GOOD_LEASE, YEAR + 1, "RETRY"),
        r"retry delay",
        id="retry-delay-too-long",
    ),
    pytest.param(
        lambda r: r.retry_work(WorkLease("", "entry-1", 1, "t"), 1, "RETRY"),
        r"identity",
        id="retry-no-identity",
    ),
    pytest.param(
        lambda r: r.fail_work(WorkLease("collection-1", "entry-1", "01", "t"), "FAILED"),
        r"work version",
        id="fail-bad-version",
    ),
    pytest.param(lambda r: r.renew_lease(GOOD_LEASE, 0), r"lease duration", id="renew-zero"),
    pytest.param(
        lambda r: r.renew_lease(WorkLease("collection-1", "entry-1", 1, None), 60),
        r"lease token",
        id="renew-no-token",
    ),
    pytest.param(lambda r: r.claim_due_batch(0, 60), r"due-work limit", id="batch-limit-0"),
    pytest.param(lambda r: r.claim_due_batch(101, 60), r"due-work limit", id="batch-limit-101"),
    pytest.param(lambda r: r.claim_due_batch(5, 0), r"lease duration", id="batch-lease-0"),
    pytest.param(
        lambda r: r.delete_work_through_epoch("", 1), r"collection ID", id="cleanup-no-collection"
    ),
    pytest.param(
        lambda r: r.delete_work_through_epoch("collection-1", -1),
        r"change epoch",
        id="cleanup-negative-epoch",
    ),
    pytest.param(
        lambda r: r.delete_work_through_epoch("collection-1", "01"),
        r"change epoch",
        id="cleanup-epoch-text",
    ),
    pytest.param(
        lambda r: r.delete_work_through_epoch("collection-1", True),
        r"change epoch",
        id="cleanup-epoch-bool",
    ),
    pytest.param(
        lambda r: r.find_work_for_content("", "entry-1"), r"lookup requires", id="lookup-no-slug"
    ),
    pytest.param(
        lambda r: r.find_work_for_content("posts", ""), r"lookup requires", id="lookup-no-content"
    ),
]


@pytest.mark.parametrize(("call", "message"), BAD_CALLS)
def test_bad_input_is_rejected_before_any_sql(repo, call, message):
    with pytest.raises(ValueError, match=message):
        call(repo)


ENQUEUE_BAD_INPUT = [
    pytest.param({"content_ids": []}, r"from 1 to 50", id="no-ids"),
    pytest.param({"content_ids": [f"e{n}" for n in range(51)]}, r"from 1 to 50", id="51-ids"),
    pytest.param({"content_ids": ["entry-1", ""]}, r"must not be empty", id="empty-id"),
    pytest.param({"content_ids": "entry-1"}, r"sequence", id="a-string-not-a-list"),
    pytest.param({"collection_id": ""}, r"exact collection and lease identity", id="no-collection"),
    pytest.param({"collection_slug": ""}, r"exact collection and lease identity", id="no-slug"),
    pytest.param({"run_token": ""}, r"exact collection and lease identity", id="no-run"),
    pytest.param({"lease_token": None}, r"exact collection and lease identity", id="no-lease"),
    pytest.param({"change_epoch": -1}, r"change epoch", id="negative-epoch"),
    pytest.param({"change_epoch": "04"}, r"change epoch", id="epoch-leading-zero"),
    pytest.param({"phase": "finalize"}, r"phase", id="unknown-phase"),
]


@pytest.mark.parametrize(("overrides", "message"), ENQUEUE_BAD_INPUT)
def test_bad_enqueue_input_is_rejected_before_any_sql(repo, overrides, message):
    arguments = {
        "collection_id": "collection-1",
        "collection_slug": "posts",
        "run_token": RUN_TOKEN,
        "lease_token": RECONCILIATION_LEASE,
        "change_epoch": TARGET_EPOCH,
        "phase": "scan",
        "content_ids": ["entry-1"],
        **overrides,
    }
    with pytest.raises(ValueError, match=message):
        repo.enqueue_reconciliation_page(**arguments)


@pytest.mark.parametrize("state", ["failed", "bogus"])
def test_due_statement_exists_only_for_due_states(state):
    with pytest.raises(ValueError):
        due_rows_statement(state, 10)


OPERATOR_BAD_CALLS = [
    pytest.param(lambda r: r.find_operator_page(""), r"collection slug", id="list-no-slug"),
    pytest.param(
        lambda r: r.find_operator_page("post", state="bogus"), r"valid state", id="list-bad-state"
    ),
    pytest.param(
        lambda r: r.find_operator_page("post", limit=0), r"operator limit", id="list-limit-0"
    ),
    pytest.param(
        lambda r: r.find_operator_page("post", limit=101), r"operator limit", id="list-limit-101"
    ),
    pytest.param(
        lambda r: r.find_operator_page("post", limit=True), r"operator limit", id="list-limit-bool"
    ),
    pytest.param(
        lambda r: r.find_operator_page("post", limit="5"), r"operator limit", id="list-limit-text"
    ),
    pytest.param(
        lambda r: r.retry_operator_work("", "entry-1"),
        r"collection and content",
        id="retry-no-collection",
    ),
    pytest.param(
        lambda r: r.retry_operator_work("x", ""), r"collection and content", id="retry-no-content"
    ),
    pytest.param(
        lambda r: r.retry_operator_work("x", None), r"collection and content", id="retry-none"
    ),
]


@pytest.mark.parametrize(("call", "message"), OPERATOR_BAD_CALLS)
def test_bad_operator_input_is_rejected_before_any_sql(repo, call, message):
    with pytest.raises(ValueError, match=message):
        call(repo)


@pytest.mark.parametrize("work_version", [0, -1, "0", "01", "1.0", 1.5, True, None])
def test_version_zero_and_non_whole_versions_are_rejected(repo, work_version):
    with pytest.raises(ValueError, match=r"work version"):
        repo.claim_work("collection-1", "entry-1", work_version, 60)
