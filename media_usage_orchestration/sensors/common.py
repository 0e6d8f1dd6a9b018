"""What every sensor shares: the bounded probe behind a schema check, the runs in flight, the
run keys that change whenever a row becomes due again."""

import datetime
import hashlib
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import dagster as dg

# Defined beside the other run tags, where the work op reads them too; the sensors take them
# from here.
from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_ID_TAG as COLLECTION_ID_TAG
from media_usage_orchestration.dagster_kit.run_tags import IN_FLIGHT_STATUSES
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.core.engine import (
    CONNECTION_ERRORS,
    DATABASE_URL_ENV,
    DBAPIError,
    Engine,
    database_error_message,
    scrubbed,
)
from media_usage_orchestration.store.core.host_schema import read_host_schema
from media_usage_orchestration.store.core.schema import missing_tables

UNSUCCESSFUL_STATUSES = [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
# Queued or on its way to start: such a run drains whatever is due when it starts.
WAITING_STATUSES = (
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
)
# Set by Dagster on a failed run that the run-retry daemon will retry, and the retry's id once
# it has (dagster/_core/storage/tags.py: WILL_RETRY_TAG, AUTO_RETRY_RUN_ID_TAG).
WILL_RETRY_TAG = "dagster/will_retry"
AUTO_RETRY_RUN_ID_TAG = "dagster/auto_retry_run_id"
# The run-retry daemon launches a retry within seconds of the failure; a failed run still
# waiting for its retry after this long is not waited for any more.
RETRY_WAIT_SECONDS = 120
T = TypeVar("T")


def runs_in_flight(
    instance: dg.DagsterInstance, job_name: str, tags: dict[str, str] | None = None
) -> int:
    return instance.get_runs_count(
        filters=dg.RunsFilter(job_name=job_name, statuses=IN_FLIGHT_STATUSES, tags=tags or {})
    )


def awaiting_retry(
    instance: dg.DagsterInstance, job_name: str, tags: dict[str, str] | None = None
) -> bool:
    """Whether the newest run of the job (with these tags) failed moments ago and the run-retry
    daemon is about to retry it: its retry resumes from the database, so no second run is
    asked for meanwhile."""
    recent = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=RETRY_WAIT_SECONDS)
    failed = instance.get_runs(
        filters=dg.RunsFilter(
            job_name=job_name,
            statuses=[dg.DagsterRunStatus.FAILURE],
            tags={**(tags or {}), WILL_RETRY_TAG: "true"},
            updated_after=recent,
        ),
        limit=1,
    )
    return bool(failed) and AUTO_RETRY_RUN_ID_TAG not in failed[0].tags


def collection_has_run(instance: dg.DagsterInstance, job_name: str, collection_id: str) -> bool:
    """A run of the job for this collection is queued, running, or about to be retried: the
    sensors ask for none beside it (one queued run per collection and workflow)."""
    tags = {COLLECTION_ID_TAG: collection_id}
    return bool(runs_in_flight(instance, job_name, tags)) or awaiting_retry(
        instance, job_name, tags
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
        return _probe_reconnecting(engine, probe)
    except Exception:
        _schema_found.discard(engine)
        if skip := database_not_ready(database):
            return skip
        raise


def _probe_reconnecting(engine: Engine, probe: Callable[[Engine], T]) -> T:
    """`probe(engine)`, once more if it found its pooled connection closed by the server (a
    restart, a failover, `pg_terminate_backend`). Ticks come every few seconds, so the pool's
    ping after idleness never sees such a connection; SQLAlchemy then discards it and every
    connection pooled before it, and the second attempt connects afresh. The failed attempt's
    transaction died with its connection, and every write a probe makes is guarded, so running
    it again is safe."""
    try:
        return probe(engine)
    except DBAPIError as error:
        if not error.connection_invalidated:
            raise
    return probe(engine)


def database_not_ready(database: MediaUsageDatabase) -> dg.SkipReason | None:
    """A database the sensor cannot use yet is a setup or operations step away, not a sensor
    error: one password-free line in the tick history says what to check. A later EmDash's
    media usage migration (the host-schema contract) is such a step: upgrading the project."""
    try:
        missing = missing_tables(database.engine)
        host = read_host_schema(database.engine)
    except CONNECTION_ERRORS as error:
        reason = scrubbed(database_error_message(error), database.resolved_url())
        return dg.SkipReason(
            f"database unreachable at {database.display_url} ({reason}): check "
            f"{DATABASE_URL_ENV} and that the server is up"
        )
    if refusal := host.write_refusal():
        return dg.SkipReason(refusal)
    if not missing:
        return None
    setup = host.upgrade_emdash_hint() or "run `media-usage init` or `make demo`"
    return dg.SkipReason(
        f"{database.display_url} lacks the media usage schema ({len(missing)} tables missing, "
        "e.g. " + missing[0] + "): " + setup
    )


def collection_run_request(
    instance: dg.DagsterInstance,
    job_name: str,
    collection_id: str,
    key: Sequence[object],
    *,
    tags: Mapping[str, str],
    key_after: Sequence[object] = (),
    partition_key: str | None = None,
    run_config: Mapping[str, Any] | None = None,
) -> dg.RunRequest:
    """One run of the job for one collection, tagged with the collection's id. Its key is the
    due generation (`key`), then the newest unsuccessful run of the job for the collection (a
    run canceled or failed before its claim left the row unchanged, so the same generation needs
    a new key), then `key_after`."""
    id_tag = {COLLECTION_ID_TAG: collection_id}
    unsuccessful = last_unsuccessful_run_id(instance, job_name, id_tag)
    return dg.RunRequest(
        run_key=run_key(*key, unsuccessful, *key_after),
        partition_key=partition_key,
        run_config=dict(run_config) if run_config is not None else None,
        tags={**id_tag, **tags},
    )


def run_key(*parts: object) -> str:
    """A readable key prefix plus a digest of the due generation."""
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).hexdigest()[:16]
    return f"{parts[0]}:{parts[1]}:{digest}"
