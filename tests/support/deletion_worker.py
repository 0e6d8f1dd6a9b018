"""A victim process for the SIGKILL test: runs the background deletion job for one tombstone,
and holds the transaction of one `delete_sources` batch open, so the test can kill it with a
batch in flight.

    python -m tests.support.deletion_worker URL COLLECTION_ID HOLD_BATCH

Batches before HOLD_BATCH commit normally. Inside batch HOLD_BATCH, after its occurrences are
deleted but before its checkpoint commits, the worker prints `holding <n>` and waits to be
killed. Nothing in the test's own process is slowed down: time is never moved by sleeping.
"""

import sys
import threading

import dagster as dg

from media_usage_orchestration.jobs import media_usage_collection_deletion
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.deletion.repository import DeletionRepository

HOLD_LIMIT_SECONDS = 120


def main(url: str, collection_id: str, hold_batch: int) -> None:
    empty_source = DeletionRepository._empty_source
    batches = 0

    def held_empty_source(self, connection, lease, source_key, cursor, batch):
        nonlocal batches
        batches += 1
        result = empty_source(self, connection, lease, source_key, cursor, batch)
        if batches == hold_batch:
            print(f"holding {batches}", flush=True)
            threading.Event().wait(HOLD_LIMIT_SECONDS)  # the test kills us here
            raise SystemExit("not killed in time")
        return result

    DeletionRepository._empty_source = held_empty_source
    print("started", flush=True)
    # The test's instance (DAGSTER_HOME), so the run is recorded where the sensor looks.
    media_usage_collection_deletion.execute_in_process(
        run_config={"ops": {"claim_deletion": {"config": {"collection_id": collection_id}}}},
        resources={"database": MediaUsageDatabase.for_url(url)},
        instance=dg.DagsterInstance.get(),
        tags={"media_usage/collection_id": collection_id},
    )
    print("finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
