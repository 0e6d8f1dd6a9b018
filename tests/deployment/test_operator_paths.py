"""What an operator does in the UI, and what a deployment lives through, under the real daemon:
Terminate a lingering work run (it ends CANCELED within seconds, never retried), force-terminate
one, backfill reconciliations during a burst of edits over three collections (queue waits and
edit-to-index latency; no alert posted through all of it), a transient database error
(retried), a deletion requested while a work run of that collection lingers (the run ends at
once, the deletion starts without waiting for it), a collection whose due work no live run will
take (the work sensor stopped: one alert within the grace, a queue-sensor interval and an
alert tick, one recovery message once it is started again), and last the code server SIGKILLed
with a work run in flight in each collection and restarted as an orchestrator restarts it (the
dead runs are failed by the run-health sensor from their expired run leases, without an
operator; every collection projects its next edit again within three minutes; no collection
ever has more than one work run queued; a dead run terminated from the UI while its code server
is down ends CANCELED). The tests run in this order on one deployment, whose alert sensor posts to a
receiver of the module's own."""

from __future__ import annotations

import time
from collections.abc import Iterator

import dagster as dg
import pytest
from sqlalchemy import create_engine, text

from media_usage_orchestration.assets.health import RUN_START_GRACE_SECONDS
from media_usage_orchestration.bench.deployment import run_moments
from media_usage_orchestration.dagster_kit.run_tags import (
    COLLECTION_TAG,
    OUTCOME_TAG,
    QUEUE_TAG,
    queue_tags,
)
from media_usage_orchestration.jobs import (
    media_usage_collection_deletion,
    media_usage_reconciliation,
    media_usage_work,
)
from media_usage_orchestration.ops.reconciliation import FORCE_TAG
from media_usage_orchestration.sensors.alerts import (
    ALERT_SENSOR_INTERVAL_SECONDS,
    ALERT_WEBHOOK_ENV,
)
from media_usage_orchestration.sensors.queue import QUEUE_SENSOR_INTERVAL_SECONDS
from media_usage_orchestration.sensors.run_health import WORKER_LOST
from media_usage_orchestration.sensors.work import media_usage_work_sensor
from media_usage_orchestration.store.core.engine import APPLICATION_NAME
from tests.support.deployment import (
    QUEUE_WAIT_BOUND_SECONDS,
    QueueSampler,
    deployed_tier,
    report,
    summary,
)
from tests.support.webhook import Receiver, receiving

pytestmark = [pytest.mark.slow, pytest.mark.deployment]

IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]

TERMINATED_WITHIN_SECONDS = 10
RECOVERY_SECONDS = 180


@pytest.fixture(scope="module")
def webhook() -> Iterator[Receiver]:
    """The alert sensor's webhook for the whole module: no test but the stall posts to it."""
    with receiving() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def tier(cms, webhook):
    environment = {ALERT_WEBHOOK_ENV: webhook.url, "no_proxy": "127.0.0.1", "NO_PROXY": "127.0.0.1"}
    with deployed_tier(cms, collections=4, linger_seconds=60, environment=environment) as tier:
        yield tier


def _lingering_run(tier, collection) -> dg.DagsterRun:
    tier.wait_projected([tier.edit(collection)], timeout=120)
    return tier.setup.wait_for(
        lambda: tier.runs_of(media_usage_work.name, collection, [dg.DagsterRunStatus.STARTED]),
        f"a lingering work run of {collection.slug}",
        timeout=60,
    )[0]


def _event_types(tier, run_id: str) -> list[str]:
    return [
        record.event_log_entry.dagster_event_type.value
        for record in tier.instance.get_records_for_run(run_id).records
        if record.event_log_entry.dagster_event_type is not None
    ]


def test_terminate_ends_a_lingering_work_run_within_seconds(tier):
    articles = tier.collections[0]
    run = _lingering_run(tier, articles)

    asked = time.time()
    answer = tier.setup.terminate(run.run_id)
    assert answer["__typename"] == "TerminateRunSuccess", answer
    tier.wait_status(run.run_id, [dg.DagsterRunStatus.CANCELED], TERMINATED_WITHIN_SECONDS)
    seconds = tier.instance.get_run_record_by_id(run.run_id).end_time - asked

    kinds = _event_types(tier, run.run_id)
    assert "STEP_UP_FOR_RETRY" not in kinds and "STEP_RESTARTED" not in kinds
    assert "PIPELINE_CANCELED" in kinds and "PIPELINE_SUCCESS" not in kinds
    # The collection is not held: its next edit gets a run of its own.
    tier.wait_projected([tier.edit(articles, entry=1)], timeout=60)
    report(f"Terminate of a lingering work run: CANCELED {seconds:.1f} s after the request")


def test_force_termination_still_works(tier):
    pages = tier.collections[1]
    run = _lingering_run(tier, pages)

    answer = tier.setup.terminate(run.run_id, force=True)
    assert answer["__typename"] == "TerminateRunSuccess", answer
    assert tier.status(run.run_id) is dg.DagsterRunStatus.CANCELED
    tier.wait_projected([tier.edit(pages, entry=1)], timeout=60)


def test_a_burst_of_edits_with_backfilled_reconciliations(tier, webhook):
    started = time.time()
    edits = []
    with QueueSampler(tier.instance, media_usage_work.name) as sampler:
        for second in range(20):
            for collection in tier.collections[:3]:
                edits.append(tier.edit(collection, entry=2 + second % 8))
            if second == 5:
                slugs = [collection.slug for collection in tier.collections[:3]]
                tier.setup.backfill(media_usage_reconciliation.name, slugs, {FORCE_TAG: "true"})
            time.sleep(max(0.0, started + second + 1 - time.time()))
        tier.wait_projected(edits, timeout=120)
    reconciliations = tier.setup.wait_for(
        lambda: _finished_backfill_runs(tier, 3),
        "the backfilled reconciliations",
        timeout=180,
    )
    for run in reconciliations:
        assert run.status is dg.DagsterRunStatus.SUCCESS, run.tags
        # The partition's tags reach every run however it was launched: here a backfill.
        slug = run.tags["dagster/partition"]
        assert run.tags[COLLECTION_TAG] == slug
        assert run.tags[QUEUE_TAG] == f"reconciliation:{slug}"
    waits = [run_moments(tier.instance, run.run_id) for run in reconciliations]
    queue_waits = [moment.queue_wait for moment in waits]
    latencies = tier.watch.latencies(edits)
    assert sampler.most_queued <= 1
    assert max(queue_waits) <= QUEUE_WAIT_BOUND_SECONDS
    # Terminations, lingering runs, handovers and forced reconciliations: nothing to alert on.
    assert webhook.requests == [], webhook.texts
    report(
        f"burst of {len(edits)} edits over 3 collections in 20 s with "
        f"{len(reconciliations)} backfilled reconciliations: edit-to-index {summary(latencies)}; "
        f"reconciliation queue waits {summary(queue_waits)}, process starts "
        f"{summary([moment.process_start for moment in waits])}; most work runs queued for "
        f"one collection at once: {sampler.most_queued}"
    )


def _finished_backfill_runs(tier, count: int) -> list[dg.DagsterRun] | None:
    runs = [
        run for run in tier.runs(media_usage_reconciliation.name) if "dagster/backfill" in run.tags
    ]
    if len(runs) < count or any(not run.is_finished for run in runs):
        return None
    return runs


def test_a_deletion_requested_while_a_work_run_lingers(tier):
    deleted = tier.collections[3]
    run = _lingering_run(tier, deleted)

    request = tier.setup.launch(
        "request_collection_deletion",
        {"ops": {"request_deletion": {"config": {"collection": deleted.slug, "force": True}}}},
    )
    requested = tier.wait_status(request, [dg.DagsterRunStatus.SUCCESS], timeout=60)
    tombstoned_at = tier.instance.get_run_record_by_id(requested.run_id).end_time
    tier.wait_status(run.run_id, [dg.DagsterRunStatus.SUCCESS], timeout=30)
    assert _stopped_by(tier, run.run_id) == "collection_closed"
    lingered = tier.instance.get_run_record_by_id(run.run_id).end_time - tombstoned_at

    deletion = tier.setup.wait_for(
        lambda: [
            each
            for each in tier.runs(media_usage_collection_deletion.name)
            if each.tags.get(COLLECTION_TAG) == deleted.slug and each.is_finished
        ],
        "the background deletion run",
        timeout=120,
    )[0]
    assert deletion.status is dg.DagsterRunStatus.SUCCESS, deletion.tags
    assert deletion.tags[QUEUE_TAG] == f"deletion:{deleted.slug}"
    moments = run_moments(tier.instance, deletion.run_id)
    assert moments.queue_wait <= QUEUE_WAIT_BOUND_SECONDS
    report(
        f"deletion requested while a work run lingered: the work run ended {lingered:.1f} s "
        f"after the request run finished (stopped by collection_closed); the deletion run waited "
        f"{moments.queue_wait:.1f} s in the queue, its process started in "
        f"{moments.process_start:.1f} s"
    )


def _stopped_by(tier, run_id: str) -> str:
    """Why the work run's op stopped draining (its output metadata)."""
    (output,) = [
        record.event_log_entry.dagster_event
        for record in tier.instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.STEP_OUTPUT
        ).records
    ]
    return output.step_output_data.metadata["stopped_by"].value


def test_a_transient_database_error_is_still_retried(tier):
    """A run's connection to the CMS database terminated mid-statement (as a failover or an
    administrator does): the op asks for its step retry, the step runs again and the run ends
    as it would have."""
    pages = tier.collections[1]
    # A lingering work run of the collection writes the same status row: ended first, the one
    # backend that waits on the lock is the reconciliation's.
    _end_work_runs(tier, pages)
    locking = create_engine(tier.db.url)  # transactions of its own: the lock stays held
    try:
        with (
            locking.connect() as holder,
            holder.begin() as held,
            locking.connect().execution_options(isolation_level="AUTOCOMMIT") as watcher,
        ):
            holder.execute(
                text(
                    "SELECT 1 FROM _emdash_media_usage_index_status "
                    "WHERE collection_id = :id FOR UPDATE"
                ),
                {"id": pages.id},
            )
            since = watcher.execute(text("SELECT clock_timestamp()")).scalar_one()
            run_id = tier.setup.launch(
                media_usage_reconciliation.name,
                tags={
                    "dagster/partition": pages.slug,
                    **queue_tags("reconciliation", pages.slug),
                    FORCE_TAG: "true",
                },
            )
            backend, query = tier.setup.wait_for(
                lambda: _waiting_backend(watcher, since), "the run's statement to wait", 120
            )
            watcher.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
            held.rollback()
    finally:
        locking.dispose()

    run = tier.wait_status(run_id, FINISHED, timeout=180)
    kinds = _event_types(tier, run_id)
    assert kinds.count("STEP_UP_FOR_RETRY") == 1, f"terminated {query!r}; run events {kinds}"
    assert "STEP_RESTARTED" in kinds
    assert run.status is dg.DagsterRunStatus.SUCCESS
    assert run.tags[OUTCOME_TAG] == "completed"


def _end_work_runs(tier, collection) -> None:
    """Terminate the collection's queued and running work runs and wait until each is over."""
    for run in tier.runs_of(media_usage_work.name, collection, IN_FLIGHT):
        tier.setup.terminate(run.run_id)
        tier.wait_status(run.run_id, [dg.DagsterRunStatus.CANCELED], timeout=60)


def _waiting_backend(watcher, since) -> tuple[int, str] | None:
    """The one backend of the CMS database, opened since `since` (a run worker's, not a
    sensor's pooled one), waiting for the row lock the test holds, with its statement; None
    while there is none or more than one. Read outside any transaction: within one, PostgreSQL
    answers pg_stat_activity from the snapshot it took first."""
    waiting = watcher.execute(
        text(
            "SELECT pid, query FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND application_name = :name AND backend_start >= :since "
            "AND pid <> pg_backend_pid()"
        ),
        {"name": APPLICATION_NAME, "since": since},
    ).all()
    return tuple(waiting[0]) if len(waiting) == 1 else None


# The alert's bound from the edit: the grace, then at most one queue-sensor interval for the
# check and one alert-sensor interval for the post, the daemon's 5 s loop for each, and 15 s
# for a loaded host.
ALERT_BOUND_SECONDS = (
    RUN_START_GRACE_SECONDS + QUEUE_SENSOR_INTERVAL_SECONDS + ALERT_SENSOR_INTERVAL_SECONDS + 25
)


def test_a_stalled_collection_alerts_once_and_recovers_once(tier, webhook):
    """The work sensor stopped (an operator's slip, a broken deployment) and no run of the
    collection left: its next edit waits with no live run to take it, so `queue_healthy` fails
    once the grace has passed and the alert sensor posts one message; the sensor started again,
    the queue moves and one recovery message follows. Nothing else is posted."""
    articles = tier.collections[0]
    tier.switch_sensor(media_usage_work_sensor.name, "stop")
    try:
        _end_work_runs(tier, articles)
        edit = tier.edit(articles, entry=9)
        edited_at = time.time()
        failing = f"collection `{articles.slug}` fails its check `queue_healthy`"
        tier.setup.wait_for(
            lambda: webhook.posted(failing), "the stall's alert", timeout=ALERT_BOUND_SECONDS + 30
        )
    finally:
        tier.switch_sensor(media_usage_work_sensor.name, "start")
    tier.wait_projected([edit], timeout=120)
    recovered = f"collection `{articles.slug}` passes its check `queue_healthy` again"
    tier.setup.wait_for(lambda: webhook.posted(recovered), "the recovery message", timeout=150)

    alerted_after = webhook.posted(failing)[0] - edited_at
    recovered_after = webhook.posted(recovered)[0] - edited_at
    assert alerted_after <= ALERT_BOUND_SECONDS
    assert (len(webhook.posted(failing)), len(webhook.posted(recovered))) == (1, 1)
    assert len(webhook.requests) == 2, webhook.texts
    assert "no work run of the collection is alive" in webhook.texts[0]
    report(
        f"stalled collection (work sensor stopped, no run left): alert posted "
        f"{alerted_after:.0f} s after the edit (bound {ALERT_BOUND_SECONDS:.0f} s: grace "
        f"{RUN_START_GRACE_SECONDS:.0f} s + a queue-sensor interval + an alert tick), recovery "
        f"posted {recovered_after:.0f} s after it; {len(webhook.requests)} posts in all"
    )


def test_a_dead_code_server_stalls_no_collection(tier):
    covered = tier.collections[:3]  # the fourth was deleted by an earlier test
    first = [tier.edit(collection) for collection in covered]
    tier.wait_projected(first, timeout=120)
    lingering = {
        collection.slug: tier.setup.wait_for(
            lambda c=collection: tier.runs_of(
                media_usage_work.name, c, [dg.DagsterRunStatus.STARTED]
            ),
            f"a work run of {collection.slug} in flight",
            timeout=60,
        )[0]
        for collection in covered
    }

    killed_at = time.time()
    killed = tier.setup.kill_code_server()
    workers = {slug: _worker_pid(tier.instance, run.run_id) for slug, run in lingering.items()}
    assert set(workers.values()) <= set(killed), (workers, killed)
    terminated = lingering.pop(covered[0].slug)
    answer = tier.setup.terminate(terminated.run_id)  # its worker cannot be reached
    assert tier.status(terminated.run_id) is dg.DagsterRunStatus.CANCELING, answer
    tier.setup.start_code_server()  # the orchestrator restarts the container
    second = [tier.edit(collection, entry=1) for collection in covered]

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
