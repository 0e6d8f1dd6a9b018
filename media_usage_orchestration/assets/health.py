"""The rules of the two health checks, `queue_healthy` (on `media_usage_queue/<slug>`) and
`coverage_complete` (on `media_usage_coverage/<slug>`), and how their latest evaluations are
kept equal to the collection's state.

One writer: the queue sensor (`sensors/queue.py`) evaluates both for every live collection on
each tick, without a run, and reports an evaluation only when the verdict it computes now
(passed, severity, description) differs from the check's latest stored evaluation, whoever
stored that (a tick, or an operator's "Execute"). Runs never evaluate them: Dagster keeps one
evaluation row per run and check, so a long run's later evaluation would update its own older
row and leave another run's newer (stale) row as the latest. Each check's latest evaluation is
therefore the state as read by the newest tick, at most one sensor interval old.

Both checks fail only on what an operator must act on, never on the transient states of
normal processing (an edit in flight, a handover between work runs, a reconciliation making
progress):
- `queue_healthy` fails on work that failed for good, work stuck behind an expired lease, due
  work whose oldest item has waited longer than `queue_stall_seconds`, and due work waiting
  longer than `RUN_START_GRACE_SECONDS` while no work run of the collection is alive (none
  queued or starting, none running with a live run lease);
- `coverage_complete` fails on work that failed for good, a failed reconciliation (its error
  code), and coverage that is not complete while neither its status row nor its reconciliation
  row has changed for longer than `queue_stall_seconds` (no reconciliation is making progress).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import dagster as dg

from media_usage_orchestration.dagster_kit.run_tags import (
    COLLECTION_TAG,
    IN_FLIGHT_STATUSES,
    WORKFLOW_TAG,
    launched_run,
)
from media_usage_orchestration.previews import OBSERVABLE_SOURCES, accepting
from media_usage_orchestration.store.core.clock import seconds_between
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.core.schema import missing_tables, run_leases
from media_usage_orchestration.store.reads.coverage import CollectionCoverage, health_status
from media_usage_orchestration.store.reads.queue import WorkQueue
from media_usage_orchestration.store.runs.run_leases import read_run_leases

QUEUE_CHECK = "queue_healthy"
COVERAGE_CHECK = "coverage_complete"
# A due item younger than this is an edit in flight or a run handover: the work sensor queues a
# run for it within one daemon loop or two (a queued run counts as alive), on a busy host too.
RUN_START_GRACE_SECONDS = 30.0
COVERED = (
    "coverage complete, no failed work (edits made since are queued and projected as they arrive)"
)
CHECK_WORKFLOW = "check"  # the WORKFLOW_TAG of a run that executes checks
WORK_JOB = "media_usage_work"  # jobs.media_usage_work (jobs import the assets)
# Work runs in flight at once are a few per collection; more are not read.
MAX_IN_FLIGHT_WORK_RUNS = 500


@dataclass(frozen=True)
class Verdict:
    """A check's answer for one collection now; `shown` is what makes it a new evaluation."""

    passed: bool
    description: str
    metadata: Mapping[str, dg.MetadataValue]
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR

    @property
    def shown(self) -> tuple[bool, str, str]:
        return (self.passed, self.severity.value, self.description)

    def evaluation(self, key: dg.AssetCheckKey) -> dg.AssetCheckEvaluation:
        """Reported by the sensor, without a run."""
        return dg.AssetCheckEvaluation(**self._fields(key))

    def result(self, key: dg.AssetCheckKey) -> dg.AssetCheckResult:
        """Yielded by a run that executes the check."""
        return dg.AssetCheckResult(**self._fields(key))

    def _fields(self, key: dg.AssetCheckKey) -> dict:
        return {
            "asset_key": key.asset_key,
            "check_name": key.name,
            "passed": self.passed,
            "severity": self.severity,
            "description": self.description,
            "metadata": dict(self.metadata),
        }


def missing_collection(why: str) -> Verdict:
    """The verdict of a check executed for a collection that is no longer there."""
    return Verdict(passed=False, description=why, metadata={})


def collection_check_specs(
    name: str, asset_keys: Sequence[dg.AssetKey], description: str
) -> list[dg.AssetCheckSpec]:
    """The check `name`, described alike, on each collection's asset."""
    return [dg.AssetCheckSpec(name, asset=key, description=description) for key in asset_keys]


def observable_collection_assets(
    name: str,
    specs: Sequence[dg.AssetSpec],
    check_specs: Sequence[dg.AssetCheckSpec],
    observe: Callable[..., Iterator[dg.ObserveResult | dg.AssetCheckResult]],
) -> dg.AssetsDefinition:
    """Per-collection assets as observable sources (the UI shows when each was last observed,
    and "Observe" reads the database now) with their checks, in one definition that observes
    and evaluates what is selected."""
    with accepting(OBSERVABLE_SOURCES):
        observable = dg.multi_observable_source_asset(
            specs=specs,
            check_specs=check_specs,
            can_subset=True,
            name=name,
            description=f"Observe the selected assets now, from the database, and evaluate "
            f"their {', '.join(sorted({spec.name for spec in check_specs}))} checks.",
        )
    return observable(observe)


# --- queue_healthy ------------------------------------------------------------------------------


def queue_verdict(queue: WorkQueue, run_alive: bool | None, stall_seconds: float) -> Verdict:
    """`run_alive`: whether a work run of the collection is queued, starting or running with a
    live lease; None when it cannot be told (no run leases in this database)."""
    problems = []
    if queue.failed:
        problems.append(
            f"{queue.failed} failed work item(s): an edit that fixes the content re-queues its "
            "entry; retry only what failed for reasons outside the content"
        )
    if queue.stuck:
        problems.append(f"{queue.stuck} stuck work item(s) (lease expired)")
    if queue.due and queue.lag_seconds > stall_seconds:
        problems.append(f"due work has waited more than {stall_seconds:g} s (queue_stall_seconds)")
    elif queue.due and queue.lag_seconds > RUN_START_GRACE_SECONDS and run_alive is False:
        problems.append(
            f"due work has waited more than {RUN_START_GRACE_SECONDS:g} s and no work run of "
            "the collection is alive"
        )
    metadata = {name: dg.MetadataValue.int(value) for name, value in queue.counts().items()}
    metadata["lag_seconds"] = dg.MetadataValue.float(queue.lag_seconds)
    metadata["work_run_alive"] = dg.MetadataValue.text(
        "unknown" if run_alive is None else "yes" if run_alive else "no"
    )
    return Verdict(
        passed=not problems,
        description="; ".join(problems) or "the queue moves: no failed, stuck or stalled work",
        metadata=metadata,
    )


def work_runs_alive(instance: dg.DagsterInstance, engine: Engine) -> dict[str, bool] | None:
    """Per collection slug, whether a work run of it is alive: queued or starting (about to
    run), or running with a live run lease (or none yet: it has just started). A running work
    run whose lease expired is dead, whatever Dagster still records. None when this database
    has no run leases (runs of this project never executed against it)."""
    if missing_tables(engine, [run_leases]):
        return None
    runs = instance.get_runs(
        filters=dg.RunsFilter(job_name=WORK_JOB, statuses=IN_FLIGHT_STATUSES),
        limit=MAX_IN_FLIGHT_WORK_RUNS,
    )
    started = [run.run_id for run in runs if run.status is dg.DagsterRunStatus.STARTED]
    leases = read_run_leases(engine, started)
    alive: dict[str, bool] = {}
    for run in runs:
        slug = run.tags.get(COLLECTION_TAG)
        if slug is None or run.status is dg.DagsterRunStatus.CANCELING:
            continue
        lease = leases.get(run.run_id)
        alive[slug] = alive.get(slug, False) or lease is None or lease.live
    return alive


def run_alive(alive: Mapping[str, bool] | None, slug: str) -> bool | None:
    """Whether a work run of `slug` is alive, from `work_runs_alive`: None when that could not
    tell (no run leases), False when no run of it is in flight."""
    return None if alive is None else alive.get(slug, False)


# --- coverage_complete --------------------------------------------------------------------------


def coverage_verdict(coverage: CollectionCoverage, read_at: str, stall_seconds: float) -> Verdict:
    """The check's answer from the collection's coverage row and work, read at `read_at`."""
    problems = []
    if coverage.failed_work:
        codes = failed_codes_text(coverage.failed_work_codes)
        problems.append(
            f"{coverage.failed_work} failed work item(s) ({codes}): an edit that fixes the "
            "content re-queues its entry; retry only what failed for reasons outside the content"
        )
    complete = coverage.status == "complete"
    if coverage.reconciliation_state == "failed" or (not complete and coverage.status == "failed"):
        code = coverage.last_error_code or "no error code"
        problems.append(
            f"the reconciliation failed ({code}); coverage {coverage.status or 'none'}: retry it "
            "once the cause is fixed"
        )
    elif not complete and _unchanged_longer_than(coverage, read_at, stall_seconds):
        problems.append(
            f"coverage {coverage.status or 'none'} and unchanged for more than {stall_seconds:g} s "
            "(no reconciliation is making progress)"
        )
    if problems:
        description = "; ".join(problems)
    elif health_status(coverage.status, coverage.reconciliation_required) == "complete":
        # One description for complete and for complete-but-for-queued-edits, so that steady
        # edits (each turns the status stale until projected) record no new evaluation.
        description = COVERED
    else:
        description = f"coverage {coverage.status or 'none'}: a reconciliation is making progress"
    return Verdict(
        passed=not problems, description=description, metadata=coverage_metadata(coverage)
    )


def _unchanged_longer_than(coverage: CollectionCoverage, read_at: str, seconds: float) -> bool:
    """Neither the status row nor the reconciliation row (renewed while one runs) changed for
    longer than `seconds`."""
    changed = [at for at in (coverage.status_updated_at, coverage.reconciliation_updated_at) if at]
    if not changed:  # never activated, never reconciled: nothing is under way
        return True
    ages = [seconds_between(at, read_at) for at in changed]
    if any(age is None for age in ages):  # a legacy timestamp: its age cannot be told
        return False
    return min(ages) > seconds


def coverage_metadata(coverage: CollectionCoverage) -> dict[str, dg.MetadataValue]:
    """The numbers `media-usage status` shows for the collection."""
    metadata: dict[str, dg.MetadataValue] = {
        "collection_id": dg.MetadataValue.text(coverage.collection_id),
        "coverage": dg.MetadataValue.text(coverage.status or "none"),
        "sources": dg.MetadataValue.int(coverage.sources),
        "occurrences": dg.MetadataValue.int(coverage.occurrences),
        "pending_work": dg.MetadataValue.int(coverage.pending_work),
        "failed_work": dg.MetadataValue.int(coverage.failed_work),
        "stuck_work": dg.MetadataValue.int(coverage.stuck_work),
        "error_code": dg.MetadataValue.text(coverage.last_error_code or "-"),
        "failed_work_codes": dg.MetadataValue.text(
            failed_codes_text(coverage.failed_work_codes) or "-"
        ),
    }
    if coverage.entries is not None:
        metadata["entries"] = dg.MetadataValue.int(coverage.entries)
    if coverage.change_epoch is not None:
        metadata["change_epoch"] = dg.MetadataValue.int(coverage.change_epoch)
    return metadata


def failed_codes_text(codes: Mapping[str, int]) -> str:
    return ", ".join(f"{code}: {count}" for code, count in codes.items())


# --- one writer ---------------------------------------------------------------------------------


def stale_evaluations(
    instance: dg.DagsterInstance, verdicts: Mapping[dg.AssetCheckKey, Verdict]
) -> list[dg.AssetCheckEvaluation]:
    """The evaluations to report: one per check whose latest stored evaluation (of any run or
    tick) shows something else than its verdict now, or that has none."""
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(list(verdicts))
    stale = []
    for key, verdict in sorted(verdicts.items(), key=lambda item: str(item[0])):
        record = latest.get(key)
        evaluation = record.evaluation if record is not None else None
        if evaluation is None or _shown(evaluation) != verdict.shown:
            stale.append(verdict.evaluation(key))
    return stale


def _shown(evaluation: dg.AssetCheckEvaluation) -> tuple[bool, str, str]:
    return (evaluation.passed, evaluation.severity.value, evaluation.description or "")


def tag_check_run(context: dg.AssetCheckExecutionContext, keys: Sequence[dg.AssetCheckKey]) -> None:
    """Tag a run that executes checks (the UI's "Execute") as the project's runs are tagged:
    its workflow, and its collection when it checks one."""
    tags = {WORKFLOW_TAG: CHECK_WORKFLOW}
    slugs = {key.asset_key.path[-1] for key in keys}
    if len(slugs) == 1:
        tags[COLLECTION_TAG] = slugs.pop()
    op_context = context.op_execution_context
    if launched_run(op_context) is not None:
        op_context.instance.add_run_tags(op_context.run_id, tags)
