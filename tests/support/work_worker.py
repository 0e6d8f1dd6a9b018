"""A victim process for the SIGKILL tests of work runs: runs the `media_usage_work` job and, once
its first batch claim has committed, prints the claimed lease tokens and waits to be killed,
so the test knows exactly which leases a dead run left behind.

    python -m tests.support.work_worker URL BATCH_SIZE

It prints `claimed <token> <token> ...` (one line) and then blocks; nothing is projected.
"""

import sys
import threading

import dagster as dg

from media_usage_orchestration.jobs import media_usage_work
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.work.repository import WorkRepository

HOLD_LIMIT_SECONDS = 120


def main(url: str, batch_size: int) -> None:
    claim_due_batch = WorkRepository.claim_due_batch

    def held_claim(self, *args, **kwargs):
        claimed = claim_due_batch(self, *args, **kwargs)
        if claimed:
            print("claimed " + " ".join(record.lease.lease_token for record in claimed), flush=True)
            threading.Event().wait(HOLD_LIMIT_SECONDS)  # the test kills us here
            raise SystemExit("not killed in time")
        return claimed

    WorkRepository.claim_due_batch = held_claim
    media_usage_work.execute_in_process(
        run_config={"ops": {"drain_due_work": {"config": {"batch_size": batch_size}}}},
        resources={"database": MediaUsageDatabase.for_url(url)},
        instance=dg.DagsterInstance.ephemeral(),
    )
    print("finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
