"""`run_to_completion` and the reconciliation job take the same steps.

The same scenario is built on two identical databases; one is reconciled by the driver, the
other by the Dagster job. Every call of a reconciliation step (claim, prepare, scan page,
restart, drain batch, enter sources, source page, finalize) is recorded with its outcome, and
the two sequences must be equal, as must the states the two databases end in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dagster as dg
import pytest

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, Collection
from media_usage_orchestration.emdash_double.sample_content import MEDIA_FIELDS, sample_entries
from media_usage_orchestration.processing.reconciliation import steps, walks
from media_usage_orchestration.processing.reconciliation.driver import run_to_completion
from media_usage_orchestration.processing.reconciliation.model import (
    ReconciliationOutcome,
    StepResult,
)
from media_usage_orchestration.processing.work.processor import WorkBatchResult
from media_usage_orchestration.store.core import schema
from tests.support.factories import insert_source, of
from tests.support.projection import canonical_key
from tests.support.reconciliation_runs import PARTITIONS, run_partition, step_outcomes
from tests.support.reconciliation_steps import (
    captured_collection,
    entry_ids,
    untrusted_collection,
)
from tests.support.states import count, one, status_row

RECORDED_STEPS = (
    "claim_collection",
    "prepare_run",
    "scan_page",
    "restart",
    "enter_sources",
    "source_page",
    "finalize",
)


# What a complete run of 120 entries takes, step by step: 3 scan pages of 50, 50 and 20
# entries, the scan's 120 work items drained in batches of 100, 3 source pages, completion.
COMPLETE_STEPS = [
    ("claim_collection", "advanced"),
    ("prepare_run", ("advanced", False)),
    *[("scan_page", "advanced")] * 3,
    ("scan_page", "exhausted"),
    ("drain_batch", (100, 100)),
    ("drain_batch", (20, 20)),
    ("enter_sources", ("advanced", False)),
    *[("source_page", "advanced")] * 3,
    ("source_page", "exhausted"),
    ("finalize", ("completed", False)),
]


@dataclass(frozen=True)
class Scenario:
    name: str
    build: Callable[[Any], Collection]
    outcome: ReconciliationOutcome  # the driver's
    job_outcome: tuple[str, str]  # the op that ended the job's run, and its outcome
    check_steps: Callable[[list[tuple[str, Any]]], bool]
    # Called with the engine before the n-th scan page (1-based), on both databases alike.
    before_scan_page: Callable[[Any, int], None] = lambda engine, number: None


def _complete(engine) -> Collection:
    return untrusted_collection(engine, "articles", entry_ids(120))


def _invalid_source(engine) -> Collection:
    collection = untrusted_collection(engine, "articles", entry_ids(60))
    insert_source(
        engine, canonical_key(collection, "odd"), **of(collection), source_variant="other"
    )
    return collection


def _captured(engine) -> Collection:
    return captured_collection(engine, "articles", sample_entries("art", 120), MEDIA_FIELDS)


def _write_during_the_second_page(engine, number: int) -> None:
    if number == 2:
        CmsWriter(engine).update_entry("articles", "art-e00003", {"title": "edited mid-run"})


def _restarted_in_place(taken: list[tuple[str, Any]]) -> bool:
    restart = taken.index(("restart", ("advanced", True)))
    return taken[restart - 1] == ("scan_page", "restart_required") and taken[restart + 1] == (
        "scan_page",
        "advanced",
    )


SCENARIOS = (
    Scenario(
        "complete",
        _complete,
        ReconciliationOutcome.COMPLETED,
        ("finalize_coverage", "completed"),
        lambda taken: taken == COMPLETE_STEPS,
    ),
    Scenario(
        "invalid_source",
        _invalid_source,
        ReconciliationOutcome.FAILED,
        ("scan_sources", "failed"),
        lambda taken: taken[-1] == ("source_page", "failed"),
    ),
    Scenario(
        "restart_during_scan",
        _captured,
        ReconciliationOutcome.COMPLETED,
        ("finalize_coverage", "completed"),
        _restarted_in_place,
        _write_during_the_second_page,
    ),
)


def _summary(result: Any) -> Any:
    if isinstance(result, StepResult):
        return (result.outcome.value, result.restarted)
    if isinstance(result, WorkBatchResult):
        return (result.counts.claimed, result.counts.completed)
    return getattr(result, "outcome", result).value


def _record_steps(patch: pytest.MonkeyPatch, scenario: Scenario) -> list[tuple[str, Any]]:
    """Wrap every step where the ops, the walks and the driver look it up."""
    taken: list[tuple[str, Any]] = []

    def recording(name: str, real: Callable) -> Callable:
        def step(engine, *args, **kwargs):
            if name == "scan_page":
                scenario.before_scan_page(engine, 1 + sum(1 for each in taken if each[0] == name))
            result = real(engine, *args, **kwargs)
            taken.append((name, _summary(result)))
            return result

        return step

    for name in RECORDED_STEPS:
        patch.setattr(steps, name, recording(name, getattr(steps, name)))
    patch.setattr(walks, "process_due_batch", recording("drain_batch", walks.process_due_batch))
    return taken


def _end_state(engine, collection: Collection) -> dict[str, Any]:
    status = status_row(engine, collection.slug)
    coordinator = one(engine, schema.reconciliations, collection_id=collection.id)
    return {
        "status": (status["status"], status["reconciliation_required"], status["last_error_code"]),
        "coordinator": None if coordinator is None else coordinator["state"],
        "work": count(engine, schema.work),
        "sources": count(engine, schema.sources),
        "occurrences": count(engine, schema.occurrences),
    }


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda scenario: scenario.name)
def test_the_driver_and_the_job_take_the_same_steps(db, twin, monkeypatch, scenario):
    driven, run = scenario.build(db.engine), scenario.build(twin.engine)

    with monkeypatch.context() as patch:
        by_driver = _record_steps(patch, scenario)
        driver_outcome = run_to_completion(db.engine, driven.id)
    with monkeypatch.context() as patch, dg.DagsterInstance.ephemeral() as instance:
        by_job = _record_steps(patch, scenario)
        instance.add_dynamic_partitions(PARTITIONS, [run.slug])
        result = run_partition(twin, instance, run.slug)
        assert result.success
        job_outcomes = step_outcomes(result.all_events)

    assert by_driver == by_job
    assert scenario.check_steps(by_driver), by_driver
    assert driver_outcome is scenario.outcome
    op, outcome = scenario.job_outcome
    assert list(job_outcomes)[-1] == op and job_outcomes[op] == outcome, job_outcomes
    assert _end_state(db.engine, driven) == _end_state(twin.engine, run)
