"""How the reconciliation and deletion graphs hand their claim from op to op, without pickles.

The database holds the lease; a claim handed on is only the proof that this run holds it (its
lease token). Within a run the claim stays in this process's memory (the graphs run in process),
so nothing is written to the filesystem and nothing an operator cannot use shows in the run log.

A run re-executed from failure (or any step whose claim is not in memory) resumes from the
database instead: the collection named by the upstream step's output metadata, its coordinator
or tombstone as the database holds it now, with no lease token. The op then cannot renew a
lease it does not hold: it claims the row again, which takes it only when no other owner holds
a live lease (after a recorded failure, at once; after a crash, once the crashed run's lease
expires), and resumes from the row's checkpoint.

The upstream step may have handed nothing on at all: it stopped its run (its `outcome` output)
and the run died while Dagster was recording the later steps as skipped, so a crash retry or a
re-execution from failure runs a step whose input no run produced. The collection is then the
run's own: its `media_usage/collection_id` tag, its partition (the reconciliation job) or its
deletion config, and the step resumes from the database all the same.
"""

from collections import OrderedDict

import dagster as dg

from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_ID_TAG
from media_usage_orchestration.store.core.engine import Engine
from media_usage_orchestration.store.core.leases import LeaseState
from media_usage_orchestration.store.deletion.records import DeletionLease
from media_usage_orchestration.store.host.registry import read_collection_id
from media_usage_orchestration.store.reconciliation.records import (
    ReconciliationClaim,
    ReconciliationPhase,
)
from media_usage_orchestration.store.reconciliation.repository import ReconciliationRepository

# Outputs not yet taken by their step: one per op handing on, dropped once loaded. Bounded for
# runs whose later steps never ran (the run stopped), in a process that executes many runs.
_MAX_HELD = 1024
_held: OrderedDict[tuple[str, str, str], object] = OrderedDict()
IDENTITY_KEY = "collection_id"
PARTITION_TAG = "dagster/partition"


def _key(run_id: str, step_key: str, name: str) -> tuple[str, str, str]:
    return (run_id, step_key, name)


class ClaimIOManager(dg.IOManager):
    """Claims held in memory within a run; a re-execution resumes from the database, the
    run's own `database` resource."""

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        if obj is None:
            return
        _held[_key(context.run_id, context.step_key, context.name)] = obj
        while len(_held) > _MAX_HELD:
            _held.popitem(last=False)

    def load_input(self, context: dg.InputContext) -> object:
        upstream = context.upstream_output
        assert upstream is not None
        source_run_id = _source_run_id(upstream)
        if source_run_id is not None:
            held = _held.pop(_key(source_run_id, upstream.step_key, upstream.name), None)
            if held is not None:
                return held
        collection_id = (
            _handed_on_collection(context, upstream, source_run_id)
            if source_run_id is not None
            else None
        ) or _run_collection_id(context)
        return _tokenless_claim(context.dagster_type.typing_type, collection_id, context)


def _source_run_id(upstream: dg.OutputContext) -> str | None:
    """The run that produced the upstream output; None when no run of the lineage did (the
    upstream step stopped its run, and the skip of this step was never recorded)."""
    try:
        return upstream.run_id
    except dg.DagsterInvariantViolationError:
        return None


def _handed_on_collection(
    context: dg.InputContext, upstream: dg.OutputContext, source_run_id: str
) -> str | None:
    """The collection the upstream step's output named (`emit` puts it in the metadata)."""
    records = context.instance.get_records_for_run(
        source_run_id, of_type=dg.DagsterEventType.STEP_OUTPUT
    ).records
    for record in reversed(records):
        event = record.event_log_entry.dagster_event
        data = event.step_output_data
        if event.step_key == upstream.step_key and data.output_name == upstream.name:
            return str(data.metadata[IDENTITY_KEY].value)
    return None


def _engine(context: dg.InputContext) -> Engine:
    """The run's own database (its `database` resource), reached only when a claim resumes."""
    return context.resources.database.engine


def _run_collection_id(context: dg.InputContext) -> str:
    """The collection a reconciliation or deletion run is for, from the run itself."""
    run = context.step_context.dagster_run
    if collection_id := run.tags.get(COLLECTION_ID_TAG):
        return collection_id
    claim = (run.run_config or {}).get("ops", {}).get("claim_deletion", {}).get("config", {})
    if collection_id := claim.get("collection_id"):
        return str(collection_id)
    slug = run.tags.get(PARTITION_TAG)
    if slug and (collection_id := read_collection_id(_engine(context), slug)):
        return collection_id
    raise dg.Failure(
        f"run {run.run_id} names no collection to resume (no {COLLECTION_ID_TAG} tag, "
        "partition or deletion config): re-execute the whole run",
        allow_retries=False,
    )


def _tokenless_claim(claim_type: type, collection_id: str, context: dg.InputContext) -> object:
    """The row as the database holds it now, claimed by nobody in this run (no lease token)."""
    if claim_type is DeletionLease:
        return DeletionLease(collection_id, "")
    record = ReconciliationRepository(_engine(context)).find_by_collection(collection_id)
    if record is None:
        # Nothing to resume (another run completed it): the op finds the row gone and says so.
        return ReconciliationClaim(**{**_ABSENT_ROW, "collection_id": collection_id})
    return ReconciliationClaim(**{**vars(record), "lease_token": ""})


# A coordinator row that is not there: only its collection id is ever read.
_ABSENT_ROW = {
    "collection_slug": "",
    "run_token": "",
    "target_epoch": None,
    "field_fingerprint": None,
    "state": LeaseState.PENDING,
    "phase": ReconciliationPhase.SCAN,
    "scan_cursor": None,
    "scan_upper_id": None,
    "source_cursor": None,
    "source_upper_key": None,
    "attempt_count": 0,
    "next_attempt_at": "",
    "lease_token": "",
    "lease_expires_at": None,
    "last_error_code": None,
    "created_at": "",
    "updated_at": "",
}


@dg.io_manager(
    required_resource_keys={"database"},
    description="Hands the lease-guarded graphs' claims from op to op in memory; a re-executed "
    "run resumes from the database (the lease is claimed again, never taken).",
)
def claim_io_manager(_init_context: dg.InitResourceContext) -> ClaimIOManager:
    return ClaimIOManager()


__all__ = ["IDENTITY_KEY", "ClaimIOManager", "claim_io_manager"]
