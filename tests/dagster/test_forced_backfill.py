"""A forced backfill as the UI launches one, on both dialects.

The backfill dialog takes tags but no run config, so `media_usage/force=true` is how an
operator re-reconciles complete collections. Each backfill here goes through the UI's own
`launchPartitionBackfill` GraphQL mutation (over the project's code location, served by a gRPC
code server) and the backfill daemon's iteration turns it into runs, which the synchronous
launcher executes at once.

Both collections start complete, and then each loses one entry's source and occurrences
behind the index's back, so only a run that really re-reconciles repairs it: the forced
backfill does; the plain one says `already_complete` and leaves the loss as it was.
"""

from collections.abc import Iterator, Mapping, Sequence

import dagster as dg
import pytest
from dagster._core.workspace.context import WorkspaceProcessContext

from media_usage_orchestration.ops.reconciliation import FORCE_TAG
from media_usage_orchestration.processing.reconciliation.driver import run_to_completion
from media_usage_orchestration.processing.reconciliation.model import ReconciliationOutcome
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV
from tests.support.reconciliation_runs import (
    COMPLETE_RUN,
    OUTCOME_TAG,
    PARTITIONS,
    activate_with_job,
    assert_coverage_complete,
    backfill_runs,
    daemon_workspace,
    index_drift,
    launch_partition_backfill,
    lose_one_source,
    run_events,
    step_outcomes,
    write_collections,
)
from tests.support.states import snapshot, status_row

pytestmark = pytest.mark.slow

SIZES = {"articles": 12, "pages": 12}


@pytest.fixture
def complete(db, monkeypatch) -> Iterator[tuple[dg.DagsterInstance, WorkspaceProcessContext, dict]]:
    """Two complete collections, each with one entry's source lost, and the code location."""
    collections = write_collections(db.engine, SIZES)
    monkeypatch.setenv(DATABASE_URL_ENV, db.url)
    with dg.instance_for_test(
        synchronous_run_coordinator=True, synchronous_run_launcher=True
    ) as instance:
        activate_with_job(db, instance)
        for collection in collections.values():
            assert run_to_completion(db.engine, collection.id) is ReconciliationOutcome.COMPLETED
        assert_coverage_complete(db.engine, list(collections.values()))
        for slug in SIZES:
            lose_one_source(db.engine, slug)
        instance.add_dynamic_partitions(PARTITIONS, sorted(SIZES))
        with daemon_workspace(instance) as workspace:
            yield instance, workspace, collections


def _backfill(
    instance, workspace, slugs: Sequence[str], tags: Mapping[str, str]
) -> list[dg.DagsterRun]:
    backfill_id = launch_partition_backfill(workspace, slugs, tags)
    runs = backfill_runs(instance, workspace, backfill_id)
    assert sorted(run.tags["dagster/partition"] for run in runs) == sorted(slugs)
    return runs


def test_a_forced_backfill_re_reconciles_and_a_plain_one_says_already_complete(db, complete):
    instance, workspace, collections = complete
    epoch = status_row(db.engine, "articles")["change_epoch"]

    [forced] = _backfill(instance, workspace, ["articles"], {FORCE_TAG: "true"})

    assert forced.status is dg.DagsterRunStatus.SUCCESS
    assert (forced.tags[FORCE_TAG], forced.tags[OUTCOME_TAG]) == ("true", "completed")
    assert step_outcomes(run_events(instance, forced.run_id)) == COMPLETE_RUN
    # A full reconciliation was requested (a new epoch) and it repaired the lost source.
    assert status_row(db.engine, "articles")["change_epoch"] > epoch
    assert_coverage_complete(db.engine, [collections["articles"]])

    before = snapshot(db.engine)
    [plain] = _backfill(instance, workspace, ["pages"], {})

    assert plain.status is dg.DagsterRunStatus.SUCCESS
    assert plain.tags[OUTCOME_TAG] == "already_complete"
    assert step_outcomes(run_events(instance, plain.run_id)) == {
        "claim_reconciliation": "already_complete"
    }
    assert snapshot(db.engine) == before
    assert index_drift(db.engine, "pages"), "nothing re-reconciled the loss"


def test_a_backfill_with_a_bad_force_tag_fails_its_runs_and_changes_nothing(db, complete):
    instance, workspace, _collections = complete
    before = snapshot(db.engine)

    runs = _backfill(instance, workspace, ["articles", "pages"], {FORCE_TAG: "yes"})

    assert [run.status for run in runs] == [dg.DagsterRunStatus.FAILURE] * 2
    for run in runs:
        [failure] = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
        message = failure.dagster_event.step_failure_data.error.message
        assert f"{FORCE_TAG}='yes' is not 'true' or 'false'" in message
        # The run stopped in its first op: its outcome tag says why, in the Runs list.
        assert instance.get_run_by_id(run.run_id).tags[OUTCOME_TAG] == "invalid_force_tag"
    assert snapshot(db.engine) == before
