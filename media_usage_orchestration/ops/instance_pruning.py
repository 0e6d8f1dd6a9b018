"""Pruning the Dagster instance: what Dagster OSS never deletes by itself.

deploy/dagster.yaml's `retention:` purges tick history; runs and their events otherwise stay
forever (a work run writes dozens of events), and the compute log manager keeps each run's
captured stdout and stderr (files under $DAGSTER_HOME/storage by default). `prune_instance`
deletes this project's finished runs, with their events and captured logs, once they are older
than `success_days` (SUCCESS, CANCELED) or `failure_days` (FAILURE), and never:
- a run in flight (only finished runs are looked at);
- a run holding an asset's latest materialization or observation (per partition) or a check's
  latest evaluation: every asset page and check keeps what it shows now;
- a run of a backfill still requested or canceling.
Runless events (the queue sensor's observations and check evaluations) belong to no run; Dagster
has no API to delete them selectively, so they stay.
"""

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Self

import dagster as dg
from pydantic import Field

from media_usage_orchestration.assets.health import CHECK_WORKFLOW
from media_usage_orchestration.dagster_kit.run_tags import WORKFLOW_TAG

BACKFILL_TAG = "dagster/backfill"
# A backfill in these states may still launch or read its runs.
BACKFILL_IN_PROGRESS = frozenset({"REQUESTED", "CANCELING"})
DEFAULT_SUCCESS_DAYS = 14
DEFAULT_FAILURE_DAYS = 60
DEFAULT_RUNS_PER_PRUNING = 1000
SECONDS_PER_DAY = 86_400


@dataclass(frozen=True)
class PruningPolicy:
    success_days: float = DEFAULT_SUCCESS_DAYS
    failure_days: float = DEFAULT_FAILURE_DAYS
    limit: int = DEFAULT_RUNS_PER_PRUNING

    def kept_days(self) -> dict[dg.DagsterRunStatus, float]:
        return {
            dg.DagsterRunStatus.SUCCESS: self.success_days,
            dg.DagsterRunStatus.CANCELED: self.success_days,
            dg.DagsterRunStatus.FAILURE: self.failure_days,
        }


@dataclass(frozen=True)
class ProjectGraph:
    """What pruning needs to know of the project's definitions: its runs' workflow tags, and
    the assets and checks whose latest events must stay."""

    workflows: tuple[str, ...]
    asset_keys: tuple[dg.AssetKey, ...]
    check_keys: tuple[dg.AssetCheckKey, ...]

    @classmethod
    def of(cls, repository: dg.RepositoryDefinition) -> Self:
        workflows = {
            job.tags[WORKFLOW_TAG] for job in repository.get_all_jobs() if WORKFLOW_TAG in job.tags
        }
        graph = repository.asset_graph
        return cls(
            tuple(sorted(workflows | {CHECK_WORKFLOW})),
            tuple(sorted(graph.get_all_asset_keys(), key=str)),
            tuple(sorted(graph.asset_check_keys, key=str)),
        )


def prunable_runs(
    instance: dg.DagsterInstance, project: ProjectGraph, policy: PruningPolicy, now: float
) -> list[dg.DagsterRun]:
    """The project's finished runs past their age that nothing still needs, oldest first, at
    most `policy.limit`."""
    candidates = _old_finished_runs(instance, project, policy, now)
    if not candidates:
        return []
    protected = protected_run_ids(instance, project)
    backfills: dict[str, bool] = {}
    prunable = [
        run
        for run in candidates
        if run.run_id not in protected and not _in_backfill(instance, run, backfills)
    ]
    return prunable[: policy.limit]


def _old_finished_runs(
    instance: dg.DagsterInstance, project: ProjectGraph, policy: PruningPolicy, now: float
) -> list[dg.DagsterRun]:
    """Each finished status's runs past its age, oldest first across the statuses (by their
    last update; run ids are random and say nothing of age)."""
    records: list[dg.RunRecord] = []
    for status, days in policy.kept_days().items():
        before = datetime.datetime.fromtimestamp(now - days * SECONDS_PER_DAY, datetime.UTC)
        records += instance.get_run_records(
            filters=dg.RunsFilter(
                statuses=[status],
                updated_before=before,
                tags={WORKFLOW_TAG: list(project.workflows)},
            ),
            limit=policy.limit,
            ascending=True,
        )
    # Storage may keep the update to the second: creation breaks the ties.
    records.sort(key=lambda record: (record.update_timestamp, record.create_timestamp))
    return [record.dagster_run for record in records]


def protected_run_ids(instance: dg.DagsterInstance, project: ProjectGraph) -> set[str]:
    """Runs holding an asset's latest materialization or observation (overall and per
    partition) or a check's latest evaluation."""
    protected = set()
    for key in project.asset_keys:
        protected |= _latest_event_runs(instance, key)
    for check_key in project.check_keys:
        record = instance.get_latest_asset_check_evaluation_record(check_key)
        if record is not None and record.run_id:
            protected.add(record.run_id)
    return protected


def _latest_event_runs(instance: dg.DagsterInstance, key: dg.AssetKey) -> set[str]:
    filters = [dg.AssetRecordsFilter(asset_key=key)] + [
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition])
        for partition in sorted(instance.get_materialized_partitions(key))
    ]
    runs = {
        record.run_id
        for records_filter in filters
        for record in instance.fetch_materializations(records_filter, limit=1).records
    }
    runs |= {record.run_id for record in instance.fetch_observations(key, limit=1).records}
    return {run_id for run_id in runs if run_id}


def _in_backfill(instance: dg.DagsterInstance, run: dg.DagsterRun, seen: dict[str, bool]) -> bool:
    backfill_id = run.tags.get(BACKFILL_TAG)
    if backfill_id is None:
        return False
    if backfill_id not in seen:
        backfill = instance.get_backfill(backfill_id)
        seen[backfill_id] = backfill is not None and backfill.status.value in BACKFILL_IN_PROGRESS
    return seen[backfill_id]


def delete_runs(instance: dg.DagsterInstance, runs: Iterable[dg.DagsterRun]) -> int:
    """Delete each run with its events and its captured stdout and stderr (the compute log
    manager keeps them apart from the database: files under $DAGSTER_HOME/storage with the
    default manager, which Dagster's `delete_run` leaves behind); a run gone meanwhile is not
    counted."""
    deleted = 0
    for run in runs:
        if instance.get_run_by_id(run.run_id) is not None:
            instance.delete_run(run.run_id)
            instance.compute_log_manager.delete_logs(prefix=[run.run_id])
            deleted += 1
    return deleted


class PruneInstanceConfig(dg.Config):
    success_days: float = Field(
        default=DEFAULT_SUCCESS_DAYS,
        gt=0,
        description="Delete SUCCESS and CANCELED runs of the project (with their events) "
        "last updated more than this many days ago.",
    )
    failure_days: float = Field(
        default=DEFAULT_FAILURE_DAYS,
        gt=0,
        description="Delete FAILURE runs of the project last updated more than this many days "
        "ago (kept longer: they are evidence).",
    )
    max_runs: int = Field(
        default=DEFAULT_RUNS_PER_PRUNING,
        ge=1,
        le=100_000,
        description="Delete at most this many runs per pruning run; the next one goes on.",
    )

    def policy(self) -> PruningPolicy:
        return PruningPolicy(self.success_days, self.failure_days, self.max_runs)


@dg.op(
    out=dg.Out(dg.Nothing),
    description="Delete the project's finished runs (with their events) past their age, "
    "never a run in flight, one holding an asset's or check's latest event, or one a "
    "backfill in progress needs.",
)
def prune_instance(context: dg.OpExecutionContext, config: PruneInstanceConfig):
    # The code location's definitions the run was launched from: every collection's assets
    # and checks (a run executed in process, outside a code location, has none and fails).
    deleted = prune(context.instance, context.repository_def, config.policy())
    context.log.info(f"pruned {deleted} run(s) with their events")
    yield dg.Output(None, metadata={"runs_deleted": deleted, **_policy_metadata(config)})


def prune(
    instance: dg.DagsterInstance,
    repository: dg.RepositoryDefinition,
    policy: PruningPolicy,
    now: float | None = None,
) -> int:
    """Delete what `prunable_runs` finds at `now` (the current time unless given); the number
    deleted. The run doing the pruning is in flight, so it is never among them."""
    moment = _now() if now is None else now
    runs = prunable_runs(instance, ProjectGraph.of(repository), policy, moment)
    return delete_runs(instance, runs)


def _policy_metadata(config: PruneInstanceConfig) -> dict[str, float]:
    return {"success_days": config.success_days, "failure_days": config.failure_days}


def _now() -> float:
    return datetime.datetime.now(datetime.UTC).timestamp()


__all__: Sequence[str] = (
    "ProjectGraph",
    "PruneInstanceConfig",
    "PruningPolicy",
    "delete_runs",
    "protected_run_ids",
    "prunable_runs",
    "prune",
    "prune_instance",
)
