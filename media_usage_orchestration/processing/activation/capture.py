"""Capture activation (spec 4.5): `expanded -> activating -> active`, one collection per
lease-guarded step.

Each step converts one registry collection atomically: its status row becomes untrusted
(`reconciliation_required = 1`) and fenced, the exact capture triggers are installed and
verified, and `capture_state` becomes `active` - all in one transaction, so a crash leaves the
collection either untouched or fully captured. Activation finalizes only when every registry
collection is active.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from media_usage_orchestration.store.core.capture_triggers import (
    CaptureIdentity,
    install_capture_triggers,
    verify_capture_triggers,
)
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.host import activation as store
from media_usage_orchestration.store.host import status as status_store
from media_usage_orchestration.store.host.registry import list_collections
from media_usage_orchestration.values.errors import ActivationError

COLLECTIONS_PER_STEP = 1


class ActivationOutcome(StrEnum):
    ACTIVE = "active"
    ACTIVATING = "activating"
    LEASE_ACTIVE = "lease_active"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class ActivationResult:
    outcome: ActivationOutcome
    processed_collections: tuple[str, ...] = ()
    collection_cursor: str | None = None
    lease_expires_at: str | None = None


def activate_step(engine: Engine) -> ActivationResult:
    """One call of EmDash's `activateMediaUsageCapture`: claim, convert one collection, hand off."""
    with engine.begin() as connection:
        current = store.read_activation(connection)
        if current is None:
            raise ActivationError("The media usage schema is not installed")
        if current.state == "active":
            return ActivationResult(ActivationOutcome.ACTIVE)
        claimed = store.claim_activation(connection)
    if claimed is None:
        return _claim_lost(engine)
    token, row = claimed
    processed: list[str] = []
    try:
        return _convert_and_hand_off(engine, token, row.collection_cursor, processed)
    except Exception as error:
        with engine.begin() as connection:
            if not store.lease_is_live(connection, token):
                return ActivationResult(ActivationOutcome.CONFLICT, tuple(processed))
            store.record_activation_failure(connection, token)
        raise ActivationError(f"Media usage activation failed: {error}") from error


def activate(engine: Engine, max_steps: int = 10_000) -> list[ActivationResult]:
    """Step until `active` (or another owner holds the lease); returns every step's result."""
    results = []
    for _ in range(max_steps):
        result = activate_step(engine)
        results.append(result)
        if result.outcome is not ActivationOutcome.ACTIVATING:
            return results
    raise ActivationError("Media usage activation did not finish within its step budget")


def _convert_and_hand_off(
    engine: Engine, token: str, cursor: str | None, processed: list[str]
) -> ActivationResult:
    with engine.connect() as connection:
        candidates = list_collections(connection, after=cursor, limit=COLLECTIONS_PER_STEP + 1)
    for collection_id, slug in candidates[:COLLECTIONS_PER_STEP]:
        _convert_collection(engine, token, collection_id, slug)
        processed.append(slug)
    next_cursor = processed[-1] if processed else cursor
    with engine.begin() as connection:
        if len(candidates) > COLLECTIONS_PER_STEP:
            _require(store.release_batch(connection, token, next_cursor), "cursor")
            return ActivationResult(ActivationOutcome.ACTIVATING, tuple(processed), next_cursor)
        if store.find_incomplete_collection(connection) is not None:
            # A collection appeared behind the cursor (or failed earlier): start a new pass.
            _require(store.release_batch(connection, token, None), "restart")
            return ActivationResult(ActivationOutcome.ACTIVATING, tuple(processed), None)
        _require(store.finalize_activation(connection, token, next_cursor), "finalization")
    return ActivationResult(ActivationOutcome.ACTIVE, tuple(processed), next_cursor)


def _convert_collection(engine: Engine, token: str, collection_id: str, slug: str) -> None:
    identity = CaptureIdentity(collection_id, slug)
    with engine.begin() as connection:
        _require(store.lease_is_live(connection, token), "lease")
        status_store.prepare_for_activation(connection, collection_id, slug, token)
        install_capture_triggers(connection, identity, replace_existing=False)
        if not verify_capture_triggers(connection, identity):
            raise ActivationError("Media usage capture trigger verification failed")
        _require(
            status_store.activate_for_activation(connection, collection_id, slug, token),
            "collection lifecycle",
        )


def _claim_lost(engine: Engine) -> ActivationResult:
    with engine.begin() as connection:
        current = store.read_activation(connection)
        if current is not None and current.state == "active":
            return ActivationResult(ActivationOutcome.ACTIVE)
        if (
            current is not None
            and current.state == "activating"
            and current.lease_token
            and store.lease_is_live(connection, current.lease_token)
        ):
            return ActivationResult(
                ActivationOutcome.LEASE_ACTIVE, lease_expires_at=current.lease_expires_at
            )
    raise ActivationError("Media usage activation state is not claimable")


def _require(held: bool, what: str) -> None:
    if not held:
        raise ActivationError(f"Media usage activation lost its fence ({what})")
