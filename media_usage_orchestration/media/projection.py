"""Projection admission (EmDash `content-refresh.ts`): what one claimed job may write.

Admission bounds a refresh (12 occurrence units, 512 KiB) before anything is written, so one
huge entry cannot monopolise a tick. The decisions here are pure: deletion measurements and the
proof that a projection is unchanged come in as functions, and the refresh that acts on them is
`processing.projection`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum

from media_usage_orchestration.media.canonical import canonical_json, utf8_bytes
from media_usage_orchestration.media.sources import SOURCE_VARIANTS, ContentSource, source_key
from media_usage_orchestration.values.source_records import DeletionMeasurement, SourceRow

MAX_OCCURRENCE_MUTATION_UNITS = 12
MAX_PROJECTION_MUTATION_BYTES = 512 * 1024


@dataclass
class AdmissionBudget:
    """What one claimed job may still mutate. Mutable: each admitted plan draws from it."""

    remaining_units: int = MAX_OCCURRENCE_MUTATION_UNITS
    remaining_bytes: int = MAX_PROJECTION_MUTATION_BYTES
    has_reserved_mutation: bool = False


class AdmissionOutcome(StrEnum):
    ADMITTED = "admitted"
    INTRINSIC_RESOURCE_LIMIT = "intrinsic_resource_limit"
    CLAIM_BUDGET_DEFERRED = "claim_budget_deferred"


@dataclass(frozen=True)
class AdmissionPlan:
    outcome: AdmissionOutcome
    no_op_source_keys: frozenset[str] = frozenset()
    absent_sources: tuple[SourceRow, ...] = ()
    occurrence_mutation_units: int = 0
    projection_mutation_bytes: int = 0

    @property
    def admitted(self) -> bool:
        return self.outcome is AdmissionOutcome.ADMITTED


@dataclass(frozen=True)
class _Cost:
    units: int
    bytes: int

    def exceeds_limits(self) -> bool:
        return (
            self.units > MAX_OCCURRENCE_MUTATION_UNITS or self.bytes > MAX_PROJECTION_MUTATION_BYTES
        )

    def exceeds(self, budget: AdmissionBudget) -> bool:
        return self.units > budget.remaining_units or self.bytes > budget.remaining_bytes


def stored_source_byte_length(source: SourceRow) -> int:
    """UTF-8 length of EmDash's `JSON.stringify(source)` for a stored source: camelCase keys in
    declaration order, JavaScript string and number output."""
    members = (
        f"{canonical_json(_camel_case(item.name))}:{canonical_json(getattr(source, item.name))}"
        for item in fields(SourceRow)
    )
    return len(utf8_bytes("{" + ",".join(members) + "}"))


def _camel_case(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _limit_outcome(budget: AdmissionBudget) -> AdmissionPlan:
    """Over the per-claim limits: terminal for a fresh claim; a claim that already reserved a
    mutation defers instead, since the entry may fit a claim of its own."""
    if budget.has_reserved_mutation:
        return AdmissionPlan(AdmissionOutcome.CLAIM_BUDGET_DEFERRED)
    return AdmissionPlan(AdmissionOutcome.INTRINSIC_RESOURCE_LIMIT)


def _absent_sources(
    snapshots: Sequence[ContentSource],
    observed: Mapping[str, SourceRow],
    canonical_keys: Sequence[str],
) -> tuple[SourceRow, ...]:
    produced = {snapshot.source_key for snapshot in snapshots}
    return tuple(observed[key] for key in canonical_keys if key not in produced and key in observed)


def _snapshot_cost(
    snapshots: Sequence[ContentSource], no_op_keys: frozenset[str], deletion: _Cost
) -> _Cost:
    units, size = deletion.units, deletion.bytes
    for snapshot in snapshots:
        if snapshot.source_key not in no_op_keys:
            units += len(snapshot.occurrences)
            size += snapshot.projection_byte_length
    return _Cost(units, size)


def admits_outright(
    snapshots: Sequence[ContentSource],
    observed: Mapping[str, SourceRow],
    canonical_keys: Sequence[str],
    measurements: Mapping[str, DeletionMeasurement],
) -> bool:
    """Whether a fresh claim admits this refresh in full, with every snapshot counted (no
    unchanged projection proven away), the deletions measured as given. Anything else - a
    refresh over the limits, one that fits only once unchanged snapshots are discounted - is
    for `plan_projection_admission` to decide."""
    plan = plan_admission(
        snapshots,
        observed,
        canonical_keys,
        AdmissionBudget(),
        lambda source: measurements[source.source_key],
        frozenset,
    )
    return plan.admitted and not plan.no_op_source_keys


def plan_admission(
    snapshots: Sequence[ContentSource],
    observed: Mapping[str, SourceRow],
    canonical_keys: Sequence[str],
    budget: AdmissionBudget,
    measure: Callable[[SourceRow], DeletionMeasurement],
    prove_unchanged: Callable[[], frozenset[str]],
) -> AdmissionPlan:
    absent = _absent_sources(snapshots, observed, canonical_keys)
    deletion = _Cost(0, 0)
    for source in absent:
        measured = measure(source)
        if measured.exceeds_occurrence_limit:
            return _limit_outcome(budget)
        deletion = _Cost(
            deletion.units + measured.occurrence_count,
            deletion.bytes + stored_source_byte_length(source) + 2 * measured.occurrence_bytes,
        )
    no_op_keys: frozenset[str] = frozenset()
    cost = _snapshot_cost(snapshots, no_op_keys, deletion)
    if cost.exceeds_limits():
        # Only when over the limit is it worth proving that a big projection is unchanged.
        no_op_keys = prove_unchanged()
        cost = _snapshot_cost(snapshots, no_op_keys, deletion)
    if cost.exceeds_limits():
        return _limit_outcome(budget)
    if cost.exceeds(budget):
        return AdmissionPlan(AdmissionOutcome.CLAIM_BUDGET_DEFERRED)
    _reserve(budget, cost)
    return AdmissionPlan(AdmissionOutcome.ADMITTED, no_op_keys, absent, cost.units, cost.bytes)


def _reserve(budget: AdmissionBudget, cost: _Cost) -> None:
    budget.remaining_units -= cost.units
    budget.remaining_bytes -= cost.bytes
    if cost.units > 0 or cost.bytes > 0:
        budget.has_reserved_mutation = True


def canonical_source_keys(collection_id: str, content_id: str) -> list[str]:
    return [source_key(collection_id, content_id, variant) for variant in SOURCE_VARIANTS]


__all__ = [
    "MAX_OCCURRENCE_MUTATION_UNITS",
    "MAX_PROJECTION_MUTATION_BYTES",
    "AdmissionBudget",
    "AdmissionOutcome",
    "AdmissionPlan",
    "admits_outright",
    "canonical_source_keys",
    "plan_admission",
    "stored_source_byte_length",
]
