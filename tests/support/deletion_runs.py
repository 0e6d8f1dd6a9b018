"""Shared helpers for the collection-deletion Dagster tests: op invocation, run execution,
sensor ticks and the "nothing of the collection is left" check."""

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import dagster as dg
from sqlalchemy import Engine, func, or_, select

from media_usage_orchestration.definitions import defs
from media_usage_orchestration.emdash_double.cms_writer import FieldSpec
from media_usage_orchestration.jobs import (
    media_usage_collection_deletion,
    request_collection_deletion,
)
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.deletion import media_usage_collection_deletion_sensor
from media_usage_orchestration.store.core import schema
from tests.support.deletions import table_exists
from tests.support.sensor_loop import evaluate, execute_request, resources, step_report
from tests.support.states import snapshot

DELETION_JOB = defs.resolve_job_def(media_usage_collection_deletion.name)
REQUEST_JOB = defs.resolve_job_def(request_collection_deletion.name)
COLLECTION_ID_TAG = "media_usage/collection_id"
OUTCOME_TAG = "media_usage/outcome"
FAILED_CODE = "MEDIA_USAGE_COLLECTION_DELETION_FAILED"

# The background deletion graph's ops, in order.
DELETION_OPS = (
    "claim_deletion",
    "fence",
    "remove_registry",
    "drop_table",
    "delete_work",
    "delete_sources",
    "delete_status",
    "finalize_deletion",
)


# --- runs --------------------------------------------------------------------------------------


def request_config(collection: str, force: bool = False) -> dict[str, Any]:
    return {"ops": {"request_deletion": {"config": {"collection": collection, "force": force}}}}


def run_request_job(db, instance, collection: str, force: bool = False):
    run_config = request_config(collection, force)
    dg.validate_run_config(REQUEST_JOB, run_config)
    return request_collection_deletion.execute_in_process(
        run_config=run_config,
        instance=instance,
        resources={"database": MediaUsageDatabase.for_url(db.url)},
        raise_on_error=False,
    )


def run_deletion_job(db, instance, run_config, tags=None, raise_on_error=True):
    return media_usage_collection_deletion.execute_in_process(
        run_config=run_config,
        instance=instance,
        resources={"database": MediaUsageDatabase.for_url(db.url)},
        tags=dict(tags or {}),
        raise_on_error=raise_on_error,
    )


def deletion_run_config(collection_id: str, **budgets: Mapping[str, Any]) -> dict[str, Any]:
    ops: dict[str, Any] = {"claim_deletion": {"config": {"collection_id": collection_id}}}
    for op_name, budget in budgets.items():
        ops[op_name] = {"config": dict(budget)}
    return {"ops": ops}


def outcome_of(result: dg.ExecuteInProcessResult, node: str) -> dict[str, Any] | None:
    """What a node reported (its `lease` or `outcome` output's metadata); None when it did not
    run."""
    return step_report(result.events_for_node(node), node)


def step_outcomes(result: dg.ExecuteInProcessResult) -> dict[str, str]:
    outcomes = {}
    for node in DELETION_OPS:
        metadata = outcome_of(result, node)
        if metadata is not None:
            outcomes[node] = metadata["outcome"]
    return outcomes


def failure_of(result: dg.ExecuteInProcessResult, node: str):
    """The step-failure data (description, metadata) of a failed node."""
    for event in result.events_for_node(node):
        if event.is_step_failure:
            return event.step_failure_data.user_failure_data
    raise AssertionError(f"{node} did not fail")


# --- the sensor --------------------------------------------------------------------------------


def tick(db, instance: dg.DagsterInstance):
    """One sensor evaluation; every RunRequest must be valid for the job that runs it."""
    return evaluate(media_usage_collection_deletion_sensor, instance, resources(db))


def execute_requested(db, instance, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
    return execute_request(media_usage_collection_deletion_sensor, request, instance, resources(db))


# --- database checks ---------------------------------------------------------------------------


def seconds_between(earlier: str, later: str) -> float:
    parse = lambda text: datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")  # noqa: E731
    return (parse(later) - parse(earlier)).total_seconds()


def source_keys_of(engine: Engine, collection_id: str) -> list[str]:
    with engine.connect() as connection:
        return list(
            connection.execute(
                select(schema.sources.c.source_key).where(
                    schema.sources.c.collection_id == collection_id
                )
            ).scalars()
        )


def leftovers(
    engine: Engine, collection_id: str, slug: str, source_keys: Sequence[str] = ()
) -> dict[str, int]:
    """Rows still carrying the collection's identity (its id or slug, or one of the source keys
    it had), table by table; empty when nothing is left."""
    sources, occurrences = schema.sources, schema.occurrences
    status, reconciliations = schema.index_status, schema.reconciliations
    tombstones = schema.collection_deletions
    keys = [*source_keys, *source_keys_of(engine, collection_id)]
    checks = {
        "work": [schema.work.c.collection_id == collection_id],
        "sources": [sources.c.collection_id == collection_id, sources.c.source_key.in_(keys)],
        "occurrences": [occurrences.c.source_key.in_(keys)],
        "generation_writes": [schema.generation_writes.c.source_key.in_(keys)],
        "index_status": [status.c.collection_id == collection_id, status.c.scope_key == slug],
        "reconciliations": [
            reconciliations.c.collection_id == collection_id,
            reconciliations.c.collection_slug == slug,
        ],
        "registry": [schema.collections.c.id == collection_id, schema.collections.c.slug == slug],
        "fields": [schema.fields.c.collection_id == collection_id],
        "tombstones": [
            tombstones.c.collection_id == collection_id,
            tombstones.c.collection_slug == slug,
        ],
    }
    tables = {
        "work": schema.work,
        "sources": sources,
        "occurrences": occurrences,
        "generation_writes": schema.generation_writes,
        "index_status": status,
        "reconciliations": reconciliations,
        "registry": schema.collections,
        "fields": schema.fields,
        "tombstones": tombstones,
    }
    counts = {}
    with engine.connect() as connection:
        for name, conditions in checks.items():
            statement = select(func.count()).select_from(tables[name]).where(or_(*conditions))
            counts[name] = connection.execute(statement).scalar_one()
    counts["content_table"] = int(table_exists(engine, f"ec_{slug}"))
    return {name: found for name, found in counts.items() if found}


def deletion_job() -> dg.JobDefinition:
    """The deletion job as the code location serves it (for `build_reconstructable_job`)."""
    return DELETION_JOB


RECONSTRUCTABLE_DELETION_JOB = dg.build_reconstructable_job(__name__, "deletion_job")


def everything(db, *content_slugs: str, fields: Sequence[FieldSpec] = ()) -> dict[str, list]:
    """Every row of EmDash's tables (the tombstones included) and of the given content tables
    (`ec_<slug>` with one column per field)."""
    columns = [schema.ContentField(spec.slug, "TEXT") for spec in fields]
    tables = [*schema.EMDASH_TABLES, *(schema.content_table(s, columns) for s in content_slugs)]
    return snapshot(db.engine, tables)


def mentioning(tables: Mapping[str, list], marker: str) -> dict[str, list]:
    """The rows of a snapshot with `marker` (a collection id) anywhere in them."""
    return {name: [row for row in rows if marker in str(row)] for name, rows in tables.items()}
