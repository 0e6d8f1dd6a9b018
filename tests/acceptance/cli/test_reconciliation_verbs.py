"""`media-usage reconciliations list` and `reconciliations retry`: the store's guarded
operator retry (failed, retrying or lease-expired rows; never a live lease), every outcome,
bad input and exit code."""

from __future__ import annotations

from media_usage_orchestration.store.core import schema
from tests.support.cli import (
    EXIT_OK,
    EXIT_PROBLEM,
    assert_all_refused,
    assert_unchanged,
    invoke,
    invoke_json,
    trusted_collection,
)
from tests.support.operator_states import (
    fail_reconciliation,
    leased_reconciliation,
    reconciliation_row,
    seeded_reconciliation,
)
from tests.support.states import backdate

TOKENS = {"run_token", "lease_token"}


def test_list_shows_each_collection_without_tokens(db):
    articles = seeded_reconciliation(db.engine, "articles")
    pages = seeded_reconciliation(db.engine, "pages")
    claim = leased_reconciliation(db.engine, pages)
    fail_reconciliation(db.engine, articles)

    listing = invoke_json(db, "reconciliations", "list")
    text = invoke(db, "reconciliations", "list")

    assert [item["collection_slug"] for item in listing["items"]] == ["articles", "pages"]
    failed, leased = listing["items"]
    assert (failed["state"], failed["phase"], failed["attempt_count"]) == ("failed", "scan", 5)
    assert failed["last_error_code"] == "MEDIA_USAGE_RECONCILIATION_FAILED"
    assert (leased["state"], leased["lease_expires_at"]) == ("leased", claim.lease_expires_at)
    assert not TOKENS & set(failed)
    assert text.exit_code == EXIT_OK and "articles" in text.stdout and "pages" in text.stdout
    for token in (claim.lease_token, claim.run_token):
        assert token not in text.stdout + str(listing)


def test_an_empty_list_says_so(db):
    result = invoke(db, "reconciliations", "list")
    assert (result.exit_code, result.stdout.strip()) == (EXIT_OK, "Reconciliations: none")


def test_retry_reopens_a_failed_run_as_a_fresh_scan(db):
    articles = seeded_reconciliation(db.engine)
    fail_reconciliation(db.engine, articles)

    result = invoke(db, "reconciliations", "retry", "--collection", "articles")

    assert result.exit_code == EXIT_OK, result.output
    expected = "Reconciliation of articles: pending (reopened, it will run again)"
    assert result.stdout.strip() == expected
    row = reconciliation_row(db.engine, articles)
    assert (row["state"], row["phase"], row["attempt_count"], row["last_error_code"]) == (
        "pending",
        "scan",
        0,
        None,
    )


def test_retry_reopens_a_run_whose_lease_expired(db):
    articles = seeded_reconciliation(db.engine)
    leased_reconciliation(db.engine, articles)
    table = schema.reconciliations
    backdate(db.engine, table, "lease_expires_at", 1, collection_id=articles.id)

    report = invoke_json(db, "reconciliations", "retry", "--collection", "articles")

    assert (report["outcome"], report["changed"]) == ("pending", True)
    assert report["item"]["state"] == "pending" and not TOKENS & set(report["item"])
    assert reconciliation_row(db.engine, articles)["lease_token"] is None


def test_retry_never_takes_a_live_lease_nor_shows_its_token(db):
    articles = seeded_reconciliation(db.engine)
    claim = leased_reconciliation(db.engine, articles)

    result = assert_unchanged(
        db, ("reconciliations", "retry", "--collection", "articles"), EXIT_PROBLEM
    )
    report = invoke_json(
        db, "reconciliations", "retry", "--collection", "articles", exit_code=EXIT_PROBLEM
    )

    assert f"lease_active (a worker holds it until {claim.lease_expires_at}" in result.stdout
    assert (report["outcome"], report["lease_expires_at"]) == (
        "lease_active",
        claim.lease_expires_at,
    )
    assert not TOKENS & set(report["item"])
    for token in (claim.lease_token, claim.run_token):
        assert token not in result.stdout + str(report)


def test_retry_of_a_pending_run_is_a_conflict(db):
    seeded_reconciliation(db.engine)
    result = assert_unchanged(
        db, ("reconciliations", "retry", "--collection", "articles"), EXIT_PROBLEM
    )
    assert "Reconciliation of articles: conflict" in result.stdout


def test_retry_without_a_reconciliation_is_not_found(db):
    trusted_collection(db, "articles")
    result = assert_unchanged(
        db, ("reconciliations", "retry", "--collection", "articles"), EXIT_PROBLEM
    )
    assert result.stdout.strip() == "Reconciliation of articles: not_found (nothing to retry)"


def test_bad_retry_input_is_a_usage_error(db):
    fail_reconciliation(db.engine, seeded_reconciliation(db.engine))
    assert_all_refused(
        db,
        ("reconciliations", "retry"),
        [
            (("--collection", "nope"), "Collection 'nope' does not exist"),
            (("--collection", "1bad"), "Invalid collection slug"),
            ((), "Missing option '--collection'"),
        ],
    )
