"""States shared by the reconciliation processing tests.

Two ways to make a collection that needs reconciling:
- `untrusted_collection`: built before activation and flipped to active by hand, as the
  upstream tests do (no capture triggers, so only the test moves the status epoch);
- `captured_collection`: created, filled, then converted by the real activation, so content
  writes through `CmsWriter` are captured by triggers and move the epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, Collection, FieldSpec
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.processing.reconciliation.model import ReconciliationOutcome
from media_usage_orchestration.processing.reconciliation.steps import claim_collection
from media_usage_orchestration.processing.reconciliation.tick import process_due_reconciliation
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.reconciliation.records import ReconciliationClaim
from tests.support.states import (
    IMAGE_ONLY,
    all_rows,
    backdate,
    make_collection,
    one,
    set_activation,
    status_row,
)

FINGERPRINT_PATTERN = r"^media-usage-fields:v1:sha256:[a-f0-9]{64}$"


def entry_ids(total: int, prefix: str = "entry") -> list[str]:
    return [f"{prefix}-{number:03d}" for number in range(total)]


def image_entry(content_id: str) -> dict[str, Any]:
    return {
        "id": content_id,
        "slug": content_id,
        "title": content_id,
        "hero": {"id": f"media-{content_id}", "provider": "local", "mimeType": "image/webp"},
    }


def untrusted_collection(
    engine,
    slug: str = "articles",
    ids: Sequence[str] = (),
    fields: Sequence[FieldSpec] = IMAGE_ONLY,
    *,
    activate_capture: bool = True,
) -> Collection:
    """Entries written before activation; coverage active but untrusted (`stale`, required)."""
    collection = make_collection(engine, slug, fields)
    with_media = any(spec.slug == "hero" for spec in fields)
    rows = [image_entry(content_id) for content_id in ids]
    if not with_media:
        rows = [{"id": row["id"], "slug": row["slug"], "title": row["title"]} for row in rows]
    CmsWriter(engine).insert_entries(slug, rows)
    if activate_capture:
        set_activation(engine)
    return collection


def captured_collection(
    engine, slug: str, entries: Sequence[dict[str, Any]], fields: Sequence[FieldSpec] = IMAGE_ONLY
) -> Collection:
    """A collection filled before activation, then converted by the real activation."""
    writer = CmsWriter(engine)
    collection = writer.create_collection(slug, fields)
    writer.insert_entries(slug, entries)
    activate(engine)
    return collection


def tick(engine) -> ReconciliationOutcome:
    return process_due_reconciliation(engine, rng=lambda: 0.0).outcome


def claimed(engine, collection: Collection, **options: Any) -> ReconciliationClaim:
    attempt = claim_collection(engine, collection.id, **options)
    assert attempt.outcome is ReconciliationOutcome.ADVANCED, attempt
    assert attempt.claim is not None
    return attempt.claim


def coordinator(engine, collection: Collection) -> dict[str, Any] | None:
    return one(engine, schema.reconciliations, collection_id=collection.id)


def coverage(engine, collection: Collection) -> dict[str, Any]:
    row = status_row(engine, collection.slug)
    assert row is not None
    return row


def make_due(engine, collection: Collection) -> None:
    """Time travel: the coordinator's next attempt is in the past."""
    backdate(engine, schema.reconciliations, "next_attempt_at", 1, collection_id=collection.id)


def expire_lease(engine, collection: Collection) -> None:
    backdate(engine, schema.reconciliations, "lease_expires_at", 1, collection_id=collection.id)


def mark_failed(engine, collection: Collection, target_epoch: int | None) -> None:
    """The coordinator as a terminal failure recorded at `target_epoch` leaves it."""
    with engine.begin() as connection:
        connection.execute(
            schema.reconciliations.update()
            .where(schema.reconciliations.c.collection_id == collection.id)
            .values(
                state="failed",
                target_epoch=target_epoch,
                lease_token=None,
                lease_expires_at=None,
                last_error_code="MEDIA_USAGE_RECONCILIATION_FAILED",
            )
        )


def work_rows(engine, collection: Collection) -> dict[str, dict[str, Any]]:
    rows = all_rows(engine, schema.work, collection_id=collection.id)
    return {row["content_id"]: row for row in rows}


def source_rows(engine, collection: Collection) -> list[dict[str, Any]]:
    return all_rows(engine, schema.sources, collection_id=collection.id)
