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
"""

from collections import OrderedDict

import dagster as dg
from dagster._core.events import DagsterEventType

from media_usage_orchestration.resources.database import MediaUsageDatabase, shared_engine
from media_usage_orchestration.store.deletions import DeletionLease
from media_usage_orchestration.store.reconciliations import (
    ReconciliationClaim,
    ReconciliationRepository,
)

# Outputs not yet taken by their step: one per op handing on, dropped once loaded. Bounded for
# runs whose later steps never ran (the run stopped), in a process that executes many runs.
_MAX_HELD = 1024
_held: OrderedDict[tuple[str, str, str], object] = OrderedDict()
IDENTITY_KEY = "collection_id"


def _key(run_id: str, step_key: str, name: str) -> tuple[str, str, str]:
    return (run_id, step_key, name)


class ClaimIOManager(dg.IOManager):
    """Claims held in memory within a run; a re-execution resumes from the database, reached as
    every run reaches it (the URL from the environment)."""

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        if obj is None:
            return
        _held[_key(context.run_id, context.step_key, context.name)] = obj
        while len(_held) > _MAX_HELD:
            _held.popitem(last=False)

    def load_input(self, context: dg.InputContext) -> object:
        upstream = context.upstream_output
        assert upstream is not None
        held = _held.pop(_key(upstream.run_id, upstream.step_key, upstream.name), None)
        if held is not None:
            return held
        collection_id = _handed_on_collection(context, upstream)
        return _tokenless_claim(context.dagster_type.typing_type, collection_id)


def _handed_on_collection(context: dg.InputContext, upstream: dg.OutputContext) -> str:
    """The collection the upstream step's output named (`emit` puts it in the metadata)."""
    records = context.instance.get_records_for_run(
        upstream.run_id, of_type=DagsterEventType.STEP_OUTPUT
    ).records
    for record in reversed(records):
        event = record.event_log_entry.dagster_event
        data = event.step_output_data
        if event.step_key == upstream.step_key and data.output_name == upstream.name:
            return str(data.metadata[IDENTITY_KEY].value)
    raise dg.Failure(
        f"the claim of step {upstream.step_key!r} of run {upstream.run_id} is not known: "
        "re-execute the whole run",
        allow_retries=False,
    )


def _tokenless_claim(claim_type: type, collection_id: str) -> object:
    """The row as the database holds it now, claimed by nobody in this run (no lease token)."""
    if claim_type is DeletionLease:
        return DeletionLease(collection_id, "")
    engine = shared_engine(MediaUsageDatabase().resolved_url())
    record = ReconciliationRepository(engine).find_by_collection(collection_id)
    if record is None:
        raise dg.Failure(
            f"collection {collection_id} has no reconciliation to resume", allow_retries=False
        )
    return ReconciliationClaim(**{**vars(record), "lease_token": ""})


@dg.io_manager(
    description="Hands the lease-guarded graphs' claims from op to op in memory; a re-executed "
    "run resumes from the database (the lease is claimed again, never taken).",
)
def claim_io_manager(_init_context: dg.InitResourceContext) -> ClaimIOManager:
    return ClaimIOManager()


__all__ = ["IDENTITY_KEY", "ClaimIOManager", "claim_io_manager"]
