"""Builders for reconciliation states shared by the reconciliation repository tests.

Collections are created before activation, so no capture trigger moves the status epoch:
the tests drive every epoch change themselves, as the upstream tests do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from media_usage_orchestration.emdash_double.cms_writer import Collection, FieldSpec
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.reconciliation.records import ReconciliationClaim
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository
from tests.support.states import IMAGE_ONLY, make_collection, one, set_activation

FINGERPRINT = "media-usage-fields:v1:sha256:" + "a" * 64
OTHER_FINGERPRINT = "media-usage-fields:v1:sha256:" + "b" * 64


def seed_and_claim(
    engine,
    slug: str = "articles",
    fields: Sequence[FieldSpec] = IMAGE_ONLY,
    **collection_options: Any,
) -> tuple[Collection, ReconciliationClaim]:
    """An active collection, capture activated, its coordinator seeded and claimed."""
    collection = make_collection(engine, slug, fields, **collection_options)
    set_activation(engine)
    repository = ReconciliationRepository(engine)
    assert repository.seed_next_candidate()
    row = reconciliation_row(engine, collection.id)
    claim = repository.claim(collection.id, row["run_token"], 60)
    assert claim is not None
    return collection, claim


def start_scan(
    engine, claim: ReconciliationClaim, scan_upper_id: str | None = None
) -> tuple[int, ReconciliationClaim]:
    """`begin_run` + `initialize_scan`; returns the epoch and the reloaded claim."""
    repository = ReconciliationRepository(engine)
    epoch = repository.begin_run(claim)
    assert epoch is not None
    assert repository.initialize_scan(claim, epoch, FINGERPRINT, scan_upper_id)
    return epoch, reload_claim(engine, claim)


def reload_claim(engine, claim: ReconciliationClaim) -> ReconciliationClaim:
    record = ReconciliationRepository(engine).find_by_identity(claim.collection_id, claim.run_token)
    assert record is not None and record.lease_token == claim.lease_token
    return claim.__class__(**record.__dict__)


def reconciliation_row(engine, collection_id: str) -> dict[str, Any] | None:
    return one(engine, schema.reconciliations, collection_id=collection_id)
