"""Bad input to the collection-deletion repository (seed `collection-deletion.ts`) and its
guards is refused before any SQL, on an engine of each dialect that never connects: nothing can
have changed."""

from __future__ import annotations

import pytest

from media_usage_orchestration.store.deletion.local_guard import (
    execute_local_deletion_guard,
    is_slug_deleting,
)
from media_usage_orchestration.store.deletion.records import DeletionLease, DeletionPhase
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from tests.support.records import deletion_claim

TOKEN = "01STALESTALESTALESTALESTAL"
CODE = "MEDIA_USAGE_COLLECTION_DELETION_FAILED"
INJECTION = "x; drop table ec_posts"


def _guard_call(**overrides):
    def call(repo, claim):
        arguments = {
            "action": "fence",
            "collection_id": claim.collection_id,
            "collection_slug": claim.collection_slug,
            "lease_token": claim.lease_token,
            "force_delete": False,
        }
        arguments.update(overrides)
        return execute_local_deletion_guard(repo.engine, **arguments)

    return call


BAD_INPUT = {
    "tombstone without id": (
        lambda repo, claim: repo.create_tombstone("", "pages", False),
        "requires a collection ID",
    ),
    "tombstone upper-case slug": (
        lambda repo, claim: repo.create_tombstone("id", "Posts", False),
        "Invalid collection slug",
    ),
    "tombstone injected slug": (
        lambda repo, claim: repo.create_tombstone("id", INJECTION, False),
        "Invalid collection slug",
    ),
    "tombstone non-boolean force": (
        lambda repo, claim: repo.create_tombstone("id", "pages", "yes"),
        "force_delete must be a boolean",
    ),
    "claim without id": (lambda repo, claim: repo.claim("", "fence", 300), "exact identity"),
    "claim unknown phase": (
        lambda repo, claim: repo.claim(claim.collection_id, "deleting", 300),
        "Invalid collection deletion phase",
    ),
    "claim zero lease": (
        lambda repo, claim: repo.claim(claim.collection_id, "work", 0),
        "lease duration",
    ),
    "claim fractional lease": (
        lambda repo, claim: repo.claim(claim.collection_id, "work", 1.5),
        "lease duration",
    ),
    "claim lease over a year": (
        lambda repo, claim: repo.claim(claim.collection_id, "work", 31_536_001),
        "lease duration",
    ),
    "claim boolean lease": (
        lambda repo, claim: repo.claim(claim.collection_id, "work", True),
        "lease duration",
    ),
    "renew zero lease": (lambda repo, claim: repo.renew_lease(claim, 0), "lease duration"),
    "renew without token": (
        lambda repo, claim: repo.renew_lease(DeletionLease(claim.collection_id, ""), 300),
        "lease token",
    ),
    "find_by_slug upper-case": (lambda repo, claim: repo.find_by_slug("Posts"), "Invalid"),
    "slug lock injected slug": (
        lambda repo, claim: is_slug_deleting(repo.engine, INJECTION),
        "Invalid collection slug",
    ),
    "find_due zero": (lambda repo, claim: repo.find_due(0), "from 1 to 100"),
    "find_due over 100": (lambda repo, claim: repo.find_due(101), "from 1 to 100"),
    "find_due text": (lambda repo, claim: repo.find_due("4"), "from 1 to 100"),
    "page unknown state": (
        lambda repo, claim: repo.find_operator_page(state="deleting"),
        "Invalid collection deletion state",
    ),
    "page zero limit": (
        lambda repo, claim: repo.find_operator_page(limit=0),
        "from 1 to 100",
    ),
    "page limit over 100": (
        lambda repo, claim: repo.find_operator_page(limit=101),
        "from 1 to 100",
    ),
    "page malformed cursor": (
        lambda repo, claim: repo.find_operator_page(cursor="%%%"),
        "Invalid cursor",
    ),
    "retry without id": (lambda repo, claim: repo.retry_operator_deletion(""), "requires an ID"),
    "checkpoint unknown phase": (
        lambda repo, claim: repo.checkpoint(claim, "work", "gone"),
        "Invalid collection deletion phase",
    ),
    "checkpoint without id": (
        lambda repo, claim: repo.checkpoint(DeletionLease("", TOKEN), "work", "sources"),
        "collection ID",
    ),
    "release without token": (
        lambda repo, claim: repo.release(DeletionLease(claim.collection_id, "")),
        "lease token",
    ),
    "cancel_fence without token": (
        lambda repo, claim: repo.cancel_fence(DeletionLease(claim.collection_id, "")),
        "lease token",
    ),
    "failure raw error text": (
        lambda repo, claim: repo.record_failure(claim, "lease lost: boom", False, 30),
        "SCREAMING_SNAKE_CASE",
    ),
    "failure negative delay": (
        lambda repo, claim: repo.record_failure(claim, CODE, False, -1),
        "retry delay",
    ),
    "failure delay over a year": (
        lambda repo, claim: repo.record_failure(claim, CODE, False, 31_536_001),
        "retry delay",
    ),
    "failure non-boolean terminal": (
        lambda repo, claim: repo.record_failure(claim, CODE, "no", 30),
        "terminal must be a boolean",
    ),
    "registry upper-case slug": (
        lambda repo, claim: repo.delete_registry_and_checkpoint(claim, "Posts"),
        "Invalid collection slug",
    ),
    "work batch over 50": (
        lambda repo, claim: repo.delete_work_batch(claim, batch=51),
        "from 1 to 50",
    ),
    "work batch zero": (
        lambda repo, claim: repo.delete_work_batch(claim, batch=0),
        "from 1 to 50",
    ),
    "sources batch over 50": (
        lambda repo, claim: repo.delete_sources_batch(claim, batch=51),
        "from 1 to 50",
    ),
    "status without token": (
        lambda repo, claim: repo.delete_status(DeletionLease(claim.collection_id, "")),
        "lease token",
    ),
    "finalize without id": (
        lambda repo, claim: repo.finalize(DeletionLease("", TOKEN)),
        "collection ID",
    ),
    "guard unknown action": (_guard_call(action="explode"), "guard action"),
    "guard injected slug": (_guard_call(collection_slug=INJECTION), "Invalid collection slug"),
    "guard upper-case slug": (_guard_call(collection_slug="Posts"), "Invalid collection slug"),
    "guard without token": (_guard_call(lease_token=""), "lease token"),
    "guard without id": (_guard_call(collection_id=""), "collection ID"),
    "guard non-boolean force": (_guard_call(force_delete=1), "force_delete must be a boolean"),
}


@pytest.mark.parametrize("label", list(BAD_INPUT))
def test_bad_input_is_refused_before_any_sql(no_sql_engine, label):
    call, message = BAD_INPUT[label]
    claim = deletion_claim(phase=DeletionPhase.WORK.value)
    with pytest.raises(ValueError, match=message):
        call(DeletionRepository(no_sql_engine), claim)
