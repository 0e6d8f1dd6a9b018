"""Four OS processes run the `media_usage_work` job at the same time over one backlog.

Each process records a ledger of every claim and every completion it made through the work
repository (one JSONL file per process). The backlog must be drained exactly once: every item
claimed by exactly one process, completed once under the lease token it claimed, and the index
must then equal the content.
"""

import json
import multiprocessing
from collections import Counter
from pathlib import Path

import pytest

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import MEDIA_FIELDS, sample_entries
from media_usage_orchestration.processing.activation.capture import ActivationOutcome, activate
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.store.core import schema
from tests.support.states import count

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres_only(
        "SQLite serializes writers; the multi-process race matters on PostgreSQL"
    ),
]

PROCESSES = 4
COLLECTIONS = ("articles", "pages")
ITEMS_PER_COLLECTION = 1000
JOIN_TIMEOUT_SECONDS = 120


def _record(ledger, event: str, lease, **extra) -> None:
    ledger.write(
        json.dumps(
            {
                "event": event,
                "collection_id": lease.collection_id,
                "content_id": lease.content_id,
                "work_version": lease.work_version,
                "lease_token": lease.lease_token,
                **extra,
            }
        )
        + "\n"
    )


def _install_ledger(path: str):
    """Wrap the repository's claim and completion statements (one by one and in bulk) so each
    call is written down."""
    from media_usage_orchestration.store.work.repository import WorkRepository

    ledger = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives with the process
    claim_batch, claim_one, complete = (
        WorkRepository.claim_due_batch,
        WorkRepository.claim_work,
        WorkRepository.complete_work,
    )

    def claim_due_batch(self, *args, **kwargs):
        claimed = claim_batch(self, *args, **kwargs)
        for record in claimed:
            _record(ledger, "claim", record.lease)
        return claimed

    def claim_work(self, *args, **kwargs):
        claimed = claim_one(self, *args, **kwargs)
        if claimed is not None:
            _record(ledger, "claim", claimed.lease)
        return claimed

    def complete_work(self, lease):
        result = complete(self, lease)
        _record(ledger, "complete", lease, result=result)
        return result

    WorkRepository.claim_due_batch = claim_due_batch
    WorkRepository.claim_work = claim_work
    WorkRepository.complete_work = complete_work

    # The bulk path completes many leases in one statement, in its writes' transaction.
    from media_usage_orchestration.processing.work import processor as work_processing

    complete_in_bulk = work_processing.complete_leases

    def complete_leases(connection, leases):
        completed = complete_in_bulk(connection, leases)
        for lease in leases:
            done = (lease.collection_id, lease.content_id) in completed
            _record(ledger, "complete", lease, result=done, bulk=True)
        return completed

    work_processing.complete_leases = complete_leases


def _work_process(url: str, collection_id: str, ledger_path: str, summary_path: str, start) -> None:
    """One contender: its own Dagster instance, its own engine, the real job (a work run
    drains one collection: two contenders per collection)."""
    import dagster as dg

    from media_usage_orchestration.jobs import media_usage_work
    from media_usage_orchestration.resources.database import MediaUsageDatabase

    _install_ledger(ledger_path)
    start.wait(timeout=JOIN_TIMEOUT_SECONDS)
    result = media_usage_work.execute_in_process(
        run_config={
            "ops": {
                "drain_due_work": {
                    "config": {
                        "collection_id": collection_id,
                        "max_items": 100_000,
                        "max_seconds": 300,
                        "batch_size": 25,
                    }
                }
            }
        },
        instance=dg.DagsterInstance.ephemeral(),
        resources={"database": MediaUsageDatabase.for_url(url)},
        raise_on_error=False,
    )
    metadata = {}
    for event in result.events_for_node("drain_due_work"):
        if event.is_successful_output:
            metadata = {
                key: getattr(value, "value", value)
                for key, value in event.step_output_data.metadata.items()
            }
    Path(summary_path).write_text(
        json.dumps({"success": result.success, "metadata": metadata}), encoding="utf-8"
    )


def _read_ledger(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_four_work_runs_in_four_processes_drain_a_backlog_exactly_once(db, tmp_path):
    writer = CmsWriter(db.engine)
    collection_ids = [writer.create_collection(slug, MEDIA_FIELDS).id for slug in COLLECTIONS]
    assert activate(db.engine)[-1].outcome is ActivationOutcome.ACTIVE
    for slug in COLLECTIONS:
        entries = sample_entries(slug, ITEMS_PER_COLLECTION)
        for chunk in range(0, len(entries), 500):
            writer.insert_entries(slug, entries[chunk : chunk + 500])
    total = len(COLLECTIONS) * ITEMS_PER_COLLECTION
    assert count(db.engine, schema.work, state="pending") == total

    context = multiprocessing.get_context("spawn")
    start = context.Barrier(PROCESSES)
    ledgers = [tmp_path / f"ledger-{index}.jsonl" for index in range(PROCESSES)]
    summaries = [tmp_path / f"summary-{index}.json" for index in range(PROCESSES)]
    processes = [
        context.Process(
            target=_work_process,
            args=(
                db.url,
                collection_ids[index % len(collection_ids)],
                str(ledgers[index]),
                str(summaries[index]),
                start,
            ),
            name=f"work-{index}",
        )
        for index in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(JOIN_TIMEOUT_SECONDS)
    for process in processes:
        if process.is_alive():
            process.kill()
    assert [process.exitcode for process in processes] == [0] * PROCESSES

    outcomes = [json.loads(path.read_text(encoding="utf-8")) for path in summaries]
    assert all(outcome["success"] for outcome in outcomes)
    metadata = [outcome["metadata"] for outcome in outcomes]
    assert sum(each["completed"] for each in metadata) == total
    assert sum(each["claimed"] for each in metadata) == total
    for name in ("retry", "failed", "superseded", "obsolete", "claim_lost"):
        assert sum(each[name] for each in metadata) == 0, name

    per_process = [_read_ledger(path) for path in ledgers]
    claims = [
        (index, e)
        for index, ledger in enumerate(per_process)
        for e in ledger
        if e["event"] == "claim"
    ]
    completions = [
        (index, e)
        for index, ledger in enumerate(per_process)
        for e in ledger
        if e["event"] == "complete"
    ]

    def identity(event):
        return (event["collection_id"], event["content_id"], event["work_version"])

    # Every item claimed once, by one process, under its own token.
    claimed_identities = Counter(identity(event) for _, event in claims)
    assert len(claimed_identities) == total and set(claimed_identities.values()) == {1}
    assert len({event["lease_token"] for _, event in claims}) == total

    # Every completion succeeded, exactly once per item and version, with the token that
    # same process claimed that same version under.
    assert all(event["result"] is True for _, event in completions)
    completed = Counter(identity(event) for _, event in completions)
    assert set(completed) == set(claimed_identities) and set(completed.values()) == {1}
    assert len({event["lease_token"] for _, event in completions}) == total
    claimed_by = {(identity(e), e["lease_token"]): index for index, e in claims}
    for index, event in completions:
        assert claimed_by.get((identity(event), event["lease_token"])) == index

    # The ledger saw every completion the runs reported (no completion path bypassed it).
    for index, each in enumerate(metadata):
        assert sum(1 for owner, _event in completions if owner == index) == each["completed"]
    busy = [each["completed"] for each in metadata]
    assert sum(1 for done in busy if done > 0) >= 2, f"the runs never overlapped: {busy}"

    assert count(db.engine, schema.work) == 0
    report = verify_index(db.engine)
    assert not report.has_drift, report.differences[:5]
    assert count(db.engine, schema.sources) == total
