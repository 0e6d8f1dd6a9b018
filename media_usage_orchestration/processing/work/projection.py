"""Refreshing one entry's canonical projection for a durable work item (EmDash
`content-refresh.ts`, durable mode): snapshot, admission, guarded publication, guarded deletes.

Correctness comes only from the repository's guarded statements; this module decides what to
attempt and turns every lost race into CONTENT_USAGE_GENERATION_CONFLICT, which the work
processor retries. Projection admission (`media.projection`) bounds what one claimed job may
write, so one huge entry cannot monopolise a tick.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from media_usage_orchestration.media.projection import (
    MAX_OCCURRENCE_MUTATION_UNITS,
    AdmissionBudget,
    AdmissionOutcome,
    AdmissionPlan,
    canonical_source_keys,
    plan_admission,
)
from media_usage_orchestration.media.snapshots import SnapshotError, SnapshotResult
from media_usage_orchestration.media.sources import ContentSource
from media_usage_orchestration.processing.work.content_reads import load_content_snapshots
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.host.registry import read_collection_identity_exists
from media_usage_orchestration.store.sources.writes import SourceRepository
from media_usage_orchestration.values.source_records import DeletionMeasurement, SourceRow

logger = logging.getLogger(__name__)

REFRESH_MAX_ATTEMPTS = 2


class RefreshErrorCode(StrEnum):
    CONTENT_NOT_FOUND = "CONTENT_NOT_FOUND"
    DRAFT_REVISION_NOT_FOUND = "DRAFT_REVISION_NOT_FOUND"
    DRAFT_REVISION_INVALID = "DRAFT_REVISION_INVALID"
    DRAFT_REVISION_MISMATCH = "DRAFT_REVISION_MISMATCH"
    REFRESH_ERROR = "CONTENT_USAGE_REFRESH_ERROR"
    GENERATION_CONFLICT = "CONTENT_USAGE_GENERATION_CONFLICT"
    RESOURCE_LIMIT = "CONTENT_USAGE_RESOURCE_LIMIT"


@dataclass(frozen=True)
class RefreshResult:
    success: bool
    error_code: RefreshErrorCode | None = None
    refreshed_source_count: int = 0
    deleted_source_count: int = 0


def _conflict(refreshed: int = 0, deleted: int = 0) -> RefreshResult:
    return RefreshResult(False, RefreshErrorCode.GENERATION_CONFLICT, refreshed, deleted)


# --- admission --------------------------------------------------------------------------------


def plan_projection_admission(
    repository: SourceRepository,
    snapshots: Sequence[ContentSource],
    observed: Mapping[str, SourceRow],
    canonical_keys: Sequence[str],
    budget: AdmissionBudget,
) -> AdmissionPlan:
    """Admit, defer or refuse one entry's whole refresh before anything is written."""

    def measure(source: SourceRow) -> DeletionMeasurement:
        return repository.measure_source_generation_deletion(
            source.source_key, source.current_generation, MAX_OCCURRENCE_MUTATION_UNITS
        )

    def prove_unchanged() -> frozenset[str]:
        return _unchanged_keys(repository, snapshots, observed)

    return plan_admission(snapshots, observed, canonical_keys, budget, measure, prove_unchanged)


def _unchanged_keys(
    repository: SourceRepository,
    snapshots: Sequence[ContentSource],
    observed: Mapping[str, SourceRow],
) -> frozenset[str]:
    return frozenset(
        snapshot.source_key
        for snapshot in snapshots
        if snapshot.source_key in observed
        and repository.projection_matches_expected_source(snapshot, observed[snapshot.source_key])
    )


def _admission_failure(plan: AdmissionPlan) -> RefreshResult:
    if plan.outcome is AdmissionOutcome.INTRINSIC_RESOURCE_LIMIT:
        return RefreshResult(False, RefreshErrorCode.RESOURCE_LIMIT)
    return _conflict()


# --- refresh ----------------------------------------------------------------------------------


@dataclass
class _Refresh:
    """One durable refresh of (collection_id, slug, content_id) and its admission budget."""

    engine: Engine
    collection_id: str
    collection_slug: str
    content_id: str
    budget: AdmissionBudget = field(default_factory=AdmissionBudget)

    def __post_init__(self) -> None:
        self.repository = SourceRepository(self.engine)
        self.keys = canonical_source_keys(self.collection_id, self.content_id)

    def run(self) -> RefreshResult:
        conflict = _conflict()
        for _ in range(REFRESH_MAX_ATTEMPTS):
            result = self.attempt()
            if result.error_code is not RefreshErrorCode.GENERATION_CONFLICT:
                return result
            conflict = result
            # A second attempt may only spend what the first did not reserve.
            if self.budget.has_reserved_mutation:
                break
        return _conflict(conflict.refreshed_source_count, conflict.deleted_source_count)

    def attempt(self) -> RefreshResult:
        observed = self.repository.find_sources(self.keys)
        loaded = load_content_snapshots(
            self.engine, self.collection_slug, self.content_id, self.collection_id
        )
        if loaded.error is SnapshotError.CONTENT_NOT_FOUND:
            return self.delete_for_absent_content(observed)
        if not loaded.success:
            return RefreshResult(False, RefreshErrorCode(loaded.error.value))
        return self.publish(loaded, observed)

    def identity_is_current(self) -> bool:
        return read_collection_identity_exists(
            self.engine, self.collection_id, self.collection_slug
        )

    def delete_for_absent_content(self, observed: Mapping[str, SourceRow]) -> RefreshResult:
        """The entry is gone: its canonical sources go too, only while it stays gone."""
        if not self.identity_is_current():
            return _conflict()
        plan = plan_projection_admission(self.repository, [], observed, self.keys, self.budget)
        if not plan.admitted:
            return _admission_failure(plan)
        deleted = 0
        for source in plan.absent_sources:
            result = self.repository.delete_source_if_matching_content_absent(
                source.source_key, source, self.collection_slug, self.content_id
            )
            if result.deleted:
                deleted += 1
            elif result.content_present or result.source is not None:
                return _conflict(0, deleted)
        return RefreshResult(True, deleted_source_count=deleted)

    def publish(self, loaded: SnapshotResult, observed: Mapping[str, SourceRow]) -> RefreshResult:
        if not self.identity_is_current():
            return _conflict()
        plan = plan_projection_admission(
            self.repository, loaded.snapshots, observed, self.keys, self.budget
        )
        if not plan.admitted:
            return _admission_failure(plan)
        refreshed = 0
        for snapshot in loaded.snapshots:
            if snapshot.source_key not in plan.no_op_source_keys:
                result = self.repository.replace_source_if_matching(
                    snapshot, snapshot.occurrences, observed.get(snapshot.source_key)
                )
                if not (result.replaced or result.unchanged):
                    return _conflict(refreshed)
            refreshed += 1
        # The collection may have been replaced while publishing; then nothing else is ours.
        if not self.identity_is_current():
            return _conflict(refreshed)
        return self.delete_absent(plan.absent_sources, refreshed)

    def delete_absent(self, absent: Sequence[SourceRow], refreshed: int) -> RefreshResult:
        """Sources the entry no longer produces (a draft that was published or discarded)."""
        deleted = 0
        for source in absent:
            result = self.repository.delete_source_if_matching(source.source_key, source)
            if result.deleted:
                deleted += 1
            elif result.source is not None:
                return _conflict(refreshed, deleted)
        return RefreshResult(True, None, refreshed, deleted)


def refresh_content_for_work(
    engine: Engine, collection_id: str, collection_slug: str, content_id: str
) -> RefreshResult:
    """Bring one entry's canonical sources in line with its content row, for a claimed job.

    Never raises for a failed refresh: any exception becomes CONTENT_USAGE_REFRESH_ERROR (the
    job retries), and durable mode leaves coverage and sources untouched on failure.
    """
    if not collection_id:
        raise ValueError("Durable media usage work requires a collection identity")
    refresh = _Refresh(engine, collection_id, collection_slug, content_id)
    try:
        return refresh.run()
    except Exception:
        logger.exception("Failed to refresh media usage for %s/%s", collection_slug, content_id)
        return RefreshResult(False, RefreshErrorCode.REFRESH_ERROR)


__all__ = [
    "REFRESH_MAX_ATTEMPTS",
    "RefreshErrorCode",
    "RefreshResult",
    "plan_projection_admission",
    "refresh_content_for_work",
]
