"""Shared helpers for the reconciliation Dagster tests: direct op invocation, job runs, sensor
ticks, and the "coverage is complete and true" check."""

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.definitions.repository_definition import SINGLETON_REPOSITORY_NAME
from dagster._core.execution.backfill import BulkActionStatus
from dagster._core.storage.tags import BACKFILL_ID_TAG
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import ModuleTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster_graphql.client.query import LAUNCH_PARTITION_BACKFILL_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql
from sqlalchemy import Engine, delete, select

from media_usage_orchestration.definitions import defs
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, Collection
from media_usage_orchestration.emdash_double.sample_content import MEDIA_FIELDS, sample_entries
from media_usage_orchestration.jobs import (
    media_usage_activation,
    media_usage_maintenance,
    media_usage_reconciliation,
)
from media_usage_orchestration.partitions import media_usage_collections
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.sensors.reconciliation import media_usage_reconciliation_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.host.activation import read_activation
from tests.support.sensor_loop import evaluate, resources, step_report
from tests.support.states import count, one, status_row

RECONCILIATION_JOB = defs.resolve_job_def(media_usage_reconciliation.name)
ACTIVATION_JOB = defs.resolve_job_def(media_usage_activation.name)
MAINTENANCE_JOB = defs.resolve_job_def(media_usage_maintenance.name)
RECONCILIATION_OPS = (
    "claim_reconciliation",
    "prepare_run",
    "scan_pages",
    "drain_collection_work",
    "scan_sources",
    "finalize_coverage",
)
PARTITIONS = media_usage_collections.name
COLLECTION_ID_TAG = "media_usage/collection_id"
COLLECTION_TAG = "media_usage/collection"
OUTCOME_TAG = "media_usage/outcome"
PARTITION_TAG = "dagster/partition"
FAILED_CODE = "MEDIA_USAGE_RECONCILIATION_FAILED"
RESOURCE_LIMIT = "MEDIA_USAGE_RESOURCE_LIMIT"


# --- content -----------------------------------------------------------------------------------


def write_collections(engine: Engine, sizes: Mapping[str, int]) -> dict[str, Collection]:
    """Collections with every media shape EmDash stores, filled through the CMS writer
    (before activation, so nothing is captured and coverage starts untrusted)."""
    writer = CmsWriter(engine)
    collections = {}
    for slug, size in sizes.items():
        collections[slug] = writer.create_collection(slug, MEDIA_FIELDS)
        writer.insert_entries(slug, sample_entries(slug[:3], size))
    return collections


def oversized_entry(content_id: str) -> dict:
    """13 portable text images: more than one claim may project, a terminal resource limit."""
    body = [
        {"_type": "image", "_key": f"b{i}", "asset": {"_ref": f"{content_id}-{i}"}}
        for i in range(13)
    ]
    return {"id": content_id, "slug": content_id, "status": "published", "body": body}


def activate_with_job(db, instance: dg.DagsterInstance) -> None:
    result = ACTIVATION_JOB.execute_in_process(instance=instance, resources=resources(db))
    assert result.success
    with db.engine.connect() as connection:
        assert read_activation(connection).state == "active"


# --- runs --------------------------------------------------------------------------------------


def outcome_of(events: Iterable[dg.DagsterEvent], node: str) -> dict[str, Any] | None:
    """What a node reported (its `lease` or `outcome` output's metadata); None when it did not
    run."""
    return step_report(events, node)


def step_outcomes(events: Iterable[dg.DagsterEvent]) -> dict[str, str]:
    events = list(events)
    outcomes = {}
    for node in RECONCILIATION_OPS:
        metadata = outcome_of(events, node)
        if metadata is not None:
            outcomes[node] = metadata["outcome"]
    return outcomes


def run_events(instance: dg.DagsterInstance, run_id: str) -> list[dg.DagsterEvent]:
    return [
        entry.dagster_event
        for entry in instance.all_logs(run_id)
        if entry.dagster_event is not None
    ]


COMPLETE_RUN = {
    "claim_reconciliation": "claimed",
    "prepare_run": "prepared",
    "scan_pages": "exhausted",
    "drain_collection_work": "drained",
    "scan_sources": "exhausted",
    "finalize_coverage": "completed",
}


def run_partition(
    db, instance: dg.DagsterInstance, slug: str, **execute: Any
) -> dg.ExecuteInProcessResult:
    return RECONCILIATION_JOB.execute_in_process(
        instance=instance, resources=resources(db), partition_key=slug, **execute
    )


# --- the sensor --------------------------------------------------------------------------------


def tick(db, instance: dg.DagsterInstance) -> dg.SensorResult:
    """One sensor evaluation; every RunRequest must be valid for the job that runs it."""
    return evaluate(media_usage_reconciliation_sensor, instance, resources(db))


# --- database checks ---------------------------------------------------------------------------


def assert_coverage_complete(engine: Engine, collections: Sequence[Collection]) -> None:
    """Every collection's coverage is trusted, nothing is left to do, and the index equals
    what extraction computes from the content (the oracle)."""
    for collection in collections:
        status = status_row(engine, collection.slug)
        assert status is not None
        assert (
            status["status"],
            status["reconciliation_required"],
            status["cursor"],
            status["last_error_code"],
        ) == ("complete", 0, None, None), status
        assert one(engine, schema.reconciliations, collection_id=collection.id) is None
    assert count(engine, schema.work) == 0
    report = verify_index(engine, [collection.slug for collection in collections])
    assert report.differences == ()
    assert report.pending_work_count == 0
    assert sorted(summary.collection_slug for summary in report.collections) == sorted(
        collection.slug for collection in collections
    )


def lose_one_source(engine: Engine, slug: str) -> None:
    """Delete one source of the collection and its occurrences behind the index's back, so
    that only a run that really re-reconciles the collection repairs it."""
    sources, occurrences = schema.sources, schema.occurrences
    with engine.begin() as connection:
        key = connection.execute(
            select(sources.c.source_key)
            .where(sources.c.collection_slug == slug)
            .order_by(sources.c.source_key)
            .limit(1)
        ).scalar_one()
        connection.execute(delete(occurrences).where(occurrences.c.source_key == key))
        connection.execute(delete(sources).where(sources.c.source_key == key))
    assert index_drift(engine, slug), "the lost source must show as drift"


def index_drift(engine: Engine, slug: str) -> list[str]:
    """The kinds of the differences `verify` finds in the collection's index."""
    return [difference.kind for difference in verify_index(engine, [slug]).differences]


# --- the daemon's view: a real code location ---------------------------------------------------

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LOCATION = "media_usage_orchestration"
DEFINITIONS_TARGET = ModuleTarget(
    module_name="media_usage_orchestration.definitions",
    attribute=None,
    working_directory=str(PROJECT_ROOT),
    location_name=LOCATION,
)


@contextlib.contextmanager
def daemon_workspace(instance: dg.DagsterInstance) -> Iterator[WorkspaceProcessContext]:
    """The project's code location served by a real gRPC code server, as the daemon loads it.
    The server reads MEDIA_USAGE_DATABASE_URL when it starts: set it first."""
    with create_test_daemon_workspace_context(DEFINITIONS_TARGET, instance) as workspace:
        yield workspace


def remote_repository(workspace: WorkspaceProcessContext):
    location = workspace.create_request_context().get_code_location(LOCATION)
    return location.get_repository(SINGLETON_REPOSITORY_NAME)


# --- backfills as the UI launches them ---------------------------------------------------------

BACKFILL_SECONDS = 240


def launch_partition_backfill(
    workspace: WorkspaceProcessContext, slugs: Sequence[str], tags: Mapping[str, str]
) -> str:
    """The UI backfill dialog's `launchPartitionBackfill` mutation over `slugs` of the
    reconciliation job, with the run tags the dialog's tags editor adds; its backfill id."""
    selector = {
        "partitionSetName": f"{RECONCILIATION_JOB.name}_partition_set",
        "repositorySelector": {
            "repositoryLocationName": LOCATION,
            "repositoryName": SINGLETON_REPOSITORY_NAME,
        },
    }
    params = {
        "selector": selector,
        "partitionNames": list(slugs),
        "tags": [{"key": key, "value": value} for key, value in tags.items()],
    }
    result = execute_dagster_graphql(
        workspace.create_request_context(),
        LAUNCH_PARTITION_BACKFILL_MUTATION,
        {"backfillParams": params},
    )
    assert not result.errors, result.errors
    launched = result.data["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    return launched["backfillId"]


def backfill_runs(
    instance: dg.DagsterInstance, workspace: WorkspaceProcessContext, backfill_id: str
) -> list[dg.DagsterRun]:
    """Run the backfill daemon's iteration until the backfill is done: it submits the runs,
    and marks the backfill complete once they have finished (a synchronous launcher has
    executed each as it was submitted; run workers of other processes are waited for)."""
    deadline = time.monotonic() + BACKFILL_SECONDS
    while True:
        list(execute_backfill_iteration(workspace, logging.getLogger("backfill_daemon")))
        backfill = instance.get_backfill(backfill_id)
        if backfill.status is not BulkActionStatus.REQUESTED:
            break
        assert time.monotonic() < deadline, f"backfill {backfill_id} still requested"
        time.sleep(0.5)
    assert backfill.status in (
        BulkActionStatus.COMPLETED,
        BulkActionStatus.COMPLETED_SUCCESS,
        BulkActionStatus.COMPLETED_FAILED,
    ), backfill.status
    return instance.get_runs(filters=dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))
