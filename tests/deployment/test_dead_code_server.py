"""A code server SIGKILLed with a work run in flight in each of three collections (its run
workers die with it, as in one container), then restarted as an orchestrator restarts it: the
dead runs are failed by the run-health sensor from their expired run leases, without an
operator, every collection projects its next edit again within three minutes, and no
collection ever has more than one work run queued. One dead run is terminated from the UI
while its code server is down: the termination cannot reach its worker, and the run-health
sensor marks it canceled instead of leaving it canceling."""

from __future__ import annotations

import time

import dagster as dg
import pytest

from media_usage_orchestration.jobs import media_usage_work
from media_usage_orchestration.ops.run_tags import OUTCOME_TAG
from media_usage_orchestration.sensors.run_health import WORKER_LOST
from tests.support.deployment import QueueSampler, deployed_tier, report

pytestmark = [pytest.mark.slow, pytest.mark.deployment]

RECOVERY_SECONDS = 180


@pytest.fixture(scope="module")
def tier(cms):
    # Runs linger a minute: all three are still in flight when the code server dies.
    with deployed_tier(cms, collections=3, linger_seconds=60) as tier:
        yield tier


def test_a_dead_code_server_stalls_no_collection(tier):
    first = [tier.edit(collection) for collection in tier.collections]
    tier.wait_projected(first, timeout=120)
    lingering = {
        collection.slug: tier.setup.wait_for(
            lambda c=collection: tier.runs_of(
                media_usage_work.name, c, [dg.DagsterRunStatus.STARTED]
            ),
            f"a work run of {collection.slug} in flight",
            timeout=60,
        )[0]
        for collection in tier.collections
    }

    killed_at = time.time()
    killed = tier.setup.kill_code_server()
    workers = {slug: _worker_pid(tier.instance, run.run_id) for slug, run in lingering.items()}
    assert set(workers.values()) <= set(killed), (workers, killed)
    terminated = lingering.pop(tier.collections[0].slug)
    answer = tier.setup.terminate(terminated.run_id)  # its worker cannot be reached
    assert tier.status(terminated.run_id) is dg.DagsterRunStatus.CANCELING, answer
    tier.setup.start_code_server()  # the orchestrator restarts the container
    second = [tier.edit(collection, entry=1) for collection in tier.collections]

    with QueueSampler(tier.instance, media_usage_work.name) as sampler:
        tier.wait_projected(second, timeout=RECOVERY_SECONDS)
        recovered = time.time() - killed_at
        failed_at = {}
        for slug, run in lingering.items():
            ended = tier.wait_status(run.run_id, [dg.DagsterRunStatus.FAILURE], timeout=60)
            assert ended.tags.get(OUTCOME_TAG) == WORKER_LOST, (slug, ended.tags)
            record = tier.instance.get_run_record_by_id(run.run_id)
            failed_at[slug] = record.end_time - killed_at
        tier.wait_status(terminated.run_id, [dg.DagsterRunStatus.CANCELED], timeout=60)
        canceled_at = tier.instance.get_run_record_by_id(terminated.run_id).end_time - killed_at

    assert recovered <= RECOVERY_SECONDS
    assert sampler.samples > 0 and sampler.most_queued <= 1
    latencies = tier.watch.latencies(second)
    report(
        f"code server killed with {len(lingering) + 1} lingering work runs: the one terminated "
        f"while it was down ({answer['__typename']}) marked canceled {canceled_at:.0f} s after "
        f"the kill; the dead runs failed "
        f"{', '.join(f'{slug} {seconds:.0f} s' for slug, seconds in sorted(failed_at.items()))} "
        f"after the kill; every collection projected again {recovered:.0f} s after it "
        f"(edit-to-index {max(latencies):.0f} s at most); most work runs queued for one "
        f"collection at once: {sampler.most_queued} ({sampler.samples} samples)"
    )


def _worker_pid(instance: dg.DagsterInstance, run_id: str) -> int:
    (start,) = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_START)
    assert start.dagster_event is not None
    return start.dagster_event.pid
