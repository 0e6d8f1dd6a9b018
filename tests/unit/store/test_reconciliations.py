"""Bad input to the reconciliation repository (seed `reconciliation.ts`) is refused before any
SQL, on an engine of each dialect that never connects: nothing can have changed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from tests.support.reconciliations import FINGERPRINT
from tests.support.records import reconciliation_claim

FAILED_CODE = "MEDIA_USAGE_RECONCILIATION_FAILED"


def _bad_calls(repository: ReconciliationRepository, claim):
    cid, run, lease = claim.collection_id, claim.run_token, claim.lease_token
    injected = replace(claim, collection_slug="x; drop table ec_articles")
    return [
        (lambda: repository.find_due(0), "candidate limit"),
        (lambda: repository.find_due(101), "candidate limit"),
        (lambda: repository.find_failed(True), "candidate limit"),
        (lambda: repository.find_stuck_failed(101), "candidate limit"),
        (lambda: repository.find_scan_page(claim, 0), "scan page limit"),
        (lambda: repository.find_scan_page(claim, 51), "scan page limit"),
        (lambda: repository.find_source_page(claim, 51), "source page limit"),
        (lambda: repository.find_by_identity("", run), "exact collection and run token"),
        (lambda: repository.find_by_identity(cid, ""), "exact collection and run token"),
        (lambda: repository.claim(cid, run, 0), "lease duration"),
        (lambda: repository.claim(cid, run, 31_536_001), "lease duration"),
        (lambda: repository.claim(cid, run, 1.5), "lease duration"),
        (lambda: repository.claim("", run, 60), "exact collection and run token"),
        (lambda: repository.release(cid, run, "", 0), "lease token"),
        (lambda: repository.release(cid, run, lease, -1), "release delay"),
        (lambda: repository.record_failure(cid, run, lease, "boom: at x.py:3", 0, True), "stable"),
        (lambda: repository.record_failure(cid, run, lease, "lower_case", 0, True), "stable"),
        (lambda: repository.record_failure(cid, run, lease, FAILED_CODE, -1, True), "retry delay"),
        (lambda: repository.record_failure(cid, run, lease, FAILED_CODE, 0, "yes"), "terminal"),
        (lambda: repository.renew_lease(claim, 0), "lease duration"),
        (lambda: repository.renew_lease(replace(claim, lease_token=None), 60), "lease token"),
        (lambda: repository.begin_run(replace(claim, lease_token="")), "lease token"),
        (lambda: repository.initialize_scan(claim, -1, FINGERPRINT, None), "epoch"),
        (lambda: repository.initialize_scan(claim, "01", FINGERPRINT, None), "epoch"),
        (lambda: repository.initialize_scan(claim, 1, "", None), "fingerprint"),
        (lambda: repository.checkpoint_scan(claim, 1, None, ""), "next cursor"),
        (lambda: repository.finalize_coverage(claim, 1, FINGERPRINT, 0), "schema version"),
        (lambda: repository.find_work_barrier(""), "collection ID"),
        (lambda: repository.finish_failed_coverage(cid, ""), "exact collection and run token"),
        (lambda: repository.retry_failed_by_operator(""), "collection ID"),
        (lambda: repository.reset_stuck_failed(""), "collection ID"),
        (lambda: repository.pin_stuck_failed_epoch(cid, ""), "exact collection and run token"),
        (lambda: repository.find_missing_content_ids("articles", ["a", ""]), "content identity"),
        (lambda: repository.find_missing_content_ids("articles", "entry-1"), "content identity"),
        (
            lambda: repository.find_missing_content_ids("articles", [f"e{n}" for n in range(51)]),
            "content identity",
        ),
        (lambda: repository.find_missing_content_ids("x; drop table ec_articles", ["a"]), "slug"),
        (lambda: repository.find_missing_content_ids("Articles", ["a"]), "slug"),
        (lambda: repository.find_scan_upper_id(injected), "slug"),
        (lambda: repository.find_scan_page(replace(claim, collection_slug="Articles"), 10), "slug"),
    ]


def test_bad_input_raises_before_any_sql(no_sql_engine):
    repository = ReconciliationRepository(no_sql_engine)
    claim = reconciliation_claim(collection_slug="articles")
    for call, message in _bad_calls(repository, claim):
        with pytest.raises(ValueError, match=message):
            call()
