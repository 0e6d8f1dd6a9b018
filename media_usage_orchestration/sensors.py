"""Sensors read, ops write: each sensor runs one bounded, indexed query for due rows and asks
for runs whose run key changes every time a row becomes due again.

A run in flight for the same row holds the sensor back (load shaping), except when the row is
due because its lease expired: the run that held it died or stalled, Dagster may not know yet
(until run monitoring marks it failed), and the database guards make the stale run harmless."""

import hashlib
import weakref
from collections.abc import Callable
from typing import TypeVar

import dagster as dg

from media_usage_orchestration.jobs import (
    media_usage_collection_deletion,
    media_usage_projection_gc,
    media_usage_reconciliation,
    media_usage_work,
)
from media_usage_orchestration.ops.common import automation_default_status
from media_usage_orchestration.ops.leased import COLLECTION_TAG
from media_usage_orchestration.partitions import media_usage_collections
from media_usage_orchestration.processing.projection_gc import GcLimits
from media_usage_orchestration.resources.automation import MediaUsageAutomation
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.core.engine import (
    CONNECTION_ERRORS,
    DATABASE_URL_ENV,
    Engine,
    database_error_message,
    scrubbed,
)
from media_usage_orchestration.store.core.schema import missing_tables
from media_usage_orchestration.store.probes import (
    due_deletions,
    due_projection_gc,
    due_reconciliations,
    earliest_due_work,
)

COLLECTION_ID_TAG = "media_usage/collection_id"
IN_FLIGHT_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
UNSUCCESSFUL_STATUSES = [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
MAX_DUE_DELETIONS = 25
MAX_DUE_RECONCILIATIONS = 25
T = TypeVar("T")


def runs_in_flight(
    instance: dg.DagsterInstance, job_name: str, tags: dict[str, str] | None = None
) -> int:
    return instance.get_runs_count(
        filters=dg.RunsFilter(job_name=job_name, statuses=IN_FLIGHT_STATUSES, tags=tags or {})
    )


def last_unsuccessful_run_id(
    instance: dg.DagsterInstance, job_name: str, tags: dict[str, str] | None = None
) -> str | None:
    """The newest run of the job (with these tags) that failed or was canceled. The daemon
    never launches a key it has seen, whatever that run's status, so a run that ended without
    progress must give the same due set a new key, or that work would never be asked for
    again."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(job_name=job_name, statuses=UNSUCCESSFUL_STATUSES, tags=tags or {}),
        limit=1,
    )
    return runs[0].run_id if runs else None


# Engines whose database was found with the whole schema. A tick runs in the long-lived code
# server on the process's shared engine for its URL (`resources/database.py`), so once the
# schema was there, a tick sends only its probe; the schema is looked at again when the probe
# fails, to tell a database that lost its schema or its server from a broken probe.
_schema_found: weakref.WeakSet[Engine] = weakref.WeakSet()


def probe_when_ready(
    database: MediaUsageDatabase, probe: Callable[[Engine], T]
) -> T | dg.SkipReason:
    """`probe(engine)`, or the skip that says why the database cannot be probed yet."""
    engine = database.engine
    if engine not in _schema_found:
        if skip := database_not_ready(database):
            return skip
        _schema_found.add(engine)
    try:
        return probe(engine)
    except Exception:
        _schema_found.discard(engine)
        if skip := database_not_ready(database):
            return skip
        raise


def database_not_ready(database: MediaUsageDatabase) -> dg.SkipReason | None:
    """A database the sensor cannot use yet is a setup or operations step away, not a sensor
    error: one password-free line in the tick history says what to check."""
    try:
        missing = missing_tables(database.engine)
    except CONNECTION_ERRORS as error:
        reason = scrubbed(database_error_message(error), database.resolved_url())
        return dg.SkipReason(
            f"database unreachable at {database.display_url} ({reason}): check "
            f"{DATABASE_URL_ENV} and that the server is up"
        )
    if not missing:
        return None
    return dg.SkipReason(
        f"{database.display_url} lacks the media usage schema ({len(missing)} tables missing, "
        "e.g. " + missing[0] + "): run `media-usage init` or `make demo`"
    )


def _due_deletions(engine: Engine):
    return due_deletions(engine, MAX_DUE_DELETIONS)


def _due_reconciliations(engine: Engine):
    return due_reconciliations(engine, MAX_DUE_RECONCILIATIONS)


def _due_projection_gc(engine: Engine):
    limits = GcLimits()
    return due_projection_gc(engine, limits.candidate_limit, limits.safety_window_seconds)


def run_key(*parts: object) -> str:
    """A readable key prefix plus a digest of the due generation."""
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).hexdigest()[:16]
    return f"{parts[0]}:{parts[1]}:{digest}"


@dg.sensor(
    job=media_usage_collection_deletion,
    minimum_interval_seconds=30,
    default_status=automation_default_status(),
    description="One run per due collection-deletion tombstone (pending or retry due, or "
    "leased with an expired lease); none while a run for that tombstone is in flight.",
)
def media_usage_collection_deletion_sensor(
    context: dg.SensorEvaluationContext, database: MediaUsageDatabase
):
    due = probe_when_ready(database, _due_deletions)
    if isinstance(due, dg.SkipReason):
        return due
    requests = []
    for tombstone in due:
        tags = {COLLECTION_ID_TAG: tombstone.collection_id}
        if not tombstone.lease_expired and runs_in_flight(
            context.instance, media_usage_collection_deletion.name, tags
        ):
            continue
        requests.append(
            dg.RunRequest(
                run_key=run_key(
                    "delete",
                    tombstone.collection_id,
                    tombstone.phase,
                    tombstone.due_at,
                    tombstone.updated_at,
                    # a run canceled or failed before its claim left the tombstone unchanged
                    last_unsuccessful_run_id(
                        context.instance, media_usage_collection_deletion.name, tags
                    ),
                ),
                run_config={
                    "ops": {
                        "claim_deletion": {"config": {"collection_id": tombstone.collection_id}}
                    }
                },
                tags={**tags, COLLECTION_TAG: tombstone.collection_slug},
            )
        )
    if not requests:
        return dg.SkipReason("no due collection-deletion tombstones without a run in flight")
    return dg.SensorResult(run_requests=requests)


@dg.sensor(
    job=media_usage_work,
    minimum_interval_seconds=15,
    default_status=automation_default_status(),
    description="A work run when due work exists and fewer than `max_work_runs` work runs are "
    "queued or running; the run key follows the earliest due item.",
)
def media_usage_work_sensor(
    context: dg.SensorEvaluationContext,
    database: MediaUsageDatabase,
    automation: MediaUsageAutomation,
):
    earliest = probe_when_ready(database, earliest_due_work)
    if isinstance(earliest, dg.SkipReason):
        return earliest
    if earliest is None:
        return dg.SkipReason("no due work")
    in_flight = runs_in_flight(context.instance, media_usage_work.name)
    if in_flight >= automation.max_work_runs and not earliest.lease_expired:
        return dg.SkipReason(f"{in_flight} work runs already queued or running")
    return dg.RunRequest(
        run_key=run_key(
            "work",
            earliest.collection_id,
            earliest.content_id,
            earliest.work_version,
            earliest.due_at,
            in_flight,
            last_unsuccessful_run_id(context.instance, media_usage_work.name),
        ),
        run_config={
            "ops": {
                "drain_due_work": {
                    "config": {
                        "max_items": automation.work_items_per_run,
                        "max_seconds": automation.work_seconds_per_run,
                        "batch_size": automation.work_batch_size,
                    }
                }
            }
        },
        tags={"media_usage/workflow": "work"},
    )


@dg.sensor(
    job=media_usage_reconciliation,
    minimum_interval_seconds=30,
    default_status=automation_default_status(),
    description="One reconciliation run per due coordinator row (and per collection that "
    "needs one but has none), partitioned by slug; none while that collection has a run "
    "queued or in progress.",
)
def media_usage_reconciliation_sensor(
    context: dg.SensorEvaluationContext, database: MediaUsageDatabase
):
    candidates = probe_when_ready(database, _due_reconciliations)
    if isinstance(candidates, dg.SkipReason):
        return candidates
    # An idle tick (no candidate) asks the instance nothing.
    known = (
        set(context.instance.get_dynamic_partitions(media_usage_collections.name))
        if candidates
        else set()
    )
    new_partitions = sorted({c.collection_slug for c in candidates} - known)
    requests = []
    for candidate in candidates:
        tags = {COLLECTION_ID_TAG: candidate.collection_id}
        if candidate.collection_slug not in known:
            continue  # its partition is added by this tick; the run is requested on the next
        if not candidate.lease_expired and runs_in_flight(
            context.instance, media_usage_reconciliation.name, tags
        ):
            continue
        requests.append(
            dg.RunRequest(
                run_key=run_key(
                    "reconcile",
                    candidate.collection_id,
                    candidate.run_token or "seed",
                    candidate.generation,
                    # a run canceled or failed before its claim left the row unchanged
                    last_unsuccessful_run_id(
                        context.instance, media_usage_reconciliation.name, tags
                    ),
                ),
                partition_key=candidate.collection_slug,
                tags={**tags, COLLECTION_TAG: candidate.collection_slug},
            )
        )
    partition_requests = (
        [media_usage_collections.build_add_request(new_partitions)] if new_partitions else []
    )
    if not requests:
        return dg.SensorResult(
            skip_reason=dg.SkipReason("no collection needs a reconciliation run now"),
            dynamic_partitions_requests=partition_requests,
        )
    return dg.SensorResult(run_requests=requests, dynamic_partitions_requests=partition_requests)


@dg.sensor(
    job=media_usage_projection_gc,
    minimum_interval_seconds=60,
    default_status=automation_default_status(),
    description="A projection-GC run when the projection_gc task row is due and a pass has "
    "something to do (expired write leases, obsolete occurrences in the next scan window, or "
    "a sweep to advance); one probe reading at most one scan window through the index.",
)
def media_usage_projection_gc_sensor(
    context: dg.SensorEvaluationContext, database: MediaUsageDatabase
):
    due = probe_when_ready(database, _due_projection_gc)
    if isinstance(due, dg.SkipReason):
        return due
    if due is None:
        return dg.SkipReason("the projection GC is not due (or a pass holds its lease)")
    if not due.has_work:
        return dg.SkipReason("no projection GC candidates")
    if runs_in_flight(context.instance, media_usage_projection_gc.name):
        return dg.SkipReason("a projection GC run is already queued or running")
    return dg.RunRequest(
        run_key=run_key(
            "gc",
            "projection_gc",
            due.due_at,
            due.updated_at,
            last_unsuccessful_run_id(context.instance, media_usage_projection_gc.name),
        ),
        tags={"media_usage/workflow": "projection_gc"},
    )
