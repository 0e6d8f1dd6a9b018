"""A run worker SIGKILLed at chosen step boundaries of the reconciliation and deletion graphs
(each graph's first step, a paging step, its last step), and while Dagster records the skips of
a run that stopped early: the run-retry daemon's crash retry
(and, for one run of each graph, the UI's "Re-execute from failure") ends SUCCESS with a clean
outcome, resuming from the database row, never with an IO-manager error.

The kill points are exact. A trigger on the instance's `event_logs` table makes the worker of a
run tagged `media_usage_test/kill_at=<EVENT>:<step>` wait on an advisory lock the test holds
when it writes that event (the first one of that step, or of any step when the step is left
out): the event is the boundary, since Dagster writes it before the step runs. The test then
SIGKILLs the worker, terminates its waiting backend (so the event never lands) and releases
the lock. The killed worker's leases are backdated (its lease time passes), so the retry claims
the row again and resumes from its checkpoint rather than reporting `lease_active`.

Automation starts stopped in this module: only the run-health sensor runs, so every run here
is one the test launched or its retry."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg
import pytest
from sqlalchemy import create_engine, text

from media_usage_orchestration.bench.deployment import run_moments
from media_usage_orchestration.dagster_kit.run_tags import (
    COLLECTION_ID_TAG,
    OUTCOME_TAG,
    queue_tags,
)
from media_usage_orchestration.jobs import (
    media_usage_collection_deletion,
    media_usage_reconciliation,
)
from media_usage_orchestration.ops.reconciliation import FORCE_TAG
from media_usage_orchestration.sensors.run_health import media_usage_run_health_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.deletion.records import DeletionPhase
from tests.deployment.test_operator_paths import QUEUE_WAIT_BOUND_SECONDS
from tests.support.deletion_runs import DELETION_OPS
from tests.support.deletions import tombstone
from tests.support.deployment import deployed_tier, report, summary
from tests.support.reconciliation_runs import RECONCILIATION_OPS
from tests.support.states import backdate

pytestmark = [pytest.mark.slow, pytest.mark.deployment]

KILL_TAG = "media_usage_test/kill_at"
FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
LOCK_CLASS = 7262
# The chosen boundaries: each graph's first step (nothing done yet), a paging step in the
# middle (checkpoints to resume from), and its last step; with the reconciliation run killed
# while its skips are recorded. Each kill costs two run processes, so the suite keeps seven
# (every boundary of both graphs was run the same way when the tier was written).
RECONCILIATION_STEPS = (RECONCILIATION_OPS[0], "scan_pages", RECONCILIATION_OPS[-1])
DELETION_STEPS = (DELETION_OPS[0], "delete_sources", DELETION_OPS[-1])
assert set(RECONCILIATION_STEPS) <= set(RECONCILIATION_OPS)
assert set(DELETION_STEPS) <= set(DELETION_OPS)
RECONCILED = [f"rec_{index}" for index in range(len(RECONCILIATION_STEPS) + 1)]
DELETED = [f"del_{index}" for index in range(len(DELETION_STEPS))]
EXTRA = ["del_extra"]  # deleted by the operator's re-execution
CLEAN_OUTCOMES = {"completed", "finalized", "already_complete", "not_due", "gone"}
HOLD_EVENTS = f"""
CREATE OR REPLACE FUNCTION media_usage_test_hold_event() RETURNS trigger AS $$
DECLARE
    kill_at text;
BEGIN
    SELECT value INTO kill_at FROM run_tags WHERE run_id = NEW.run_id AND key = '{KILL_TAG}';
    IF kill_at IS NULL OR EXISTS (
        SELECT 1 FROM run_tags WHERE run_id = NEW.run_id AND key = 'dagster/parent_run_id'
    ) THEN
        RETURN NEW;
    END IF;
    IF kill_at = NEW.dagster_event_type || ':' || coalesce(NEW.step_key, '')
       OR kill_at = NEW.dagster_event_type || ':' THEN
        PERFORM pg_advisory_lock({LOCK_CLASS}, hashtext(NEW.run_id));
        PERFORM pg_advisory_unlock({LOCK_CLASS}, hashtext(NEW.run_id));
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS media_usage_test_hold_event ON event_logs;
CREATE TRIGGER media_usage_test_hold_event BEFORE INSERT ON event_logs
    FOR EACH ROW EXECUTE FUNCTION media_usage_test_hold_event();
"""


@pytest.fixture(scope="module")
def tier(cms):
    with deployed_tier(
        cms,
        slugs=[*RECONCILED, *DELETED, *EXTRA],
        environment={"MEDIA_USAGE_AUTOMATION": "stopped"},
    ) as tier:
        tier.sensor("start", media_usage_run_health_sensor.name)
        with _instance_database(tier) as instance_db:
            instance_db.execute(text(HOLD_EVENTS))
        yield tier


@contextlib.contextmanager
def _instance_database(tier) -> Iterator:
    environment = tier.setup.environment
    url = (
        f"postgresql+psycopg://{environment['DAGSTER_PG_USER']}@{environment['DAGSTER_PG_HOST']}:"
        f"{environment['DAGSTER_PG_PORT']}/{environment['DAGSTER_PG_DB']}"
    )
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()


@dataclass
class Killed:
    kill_at: str  # the kill tag's value
    collection: str
    run_id: str
    label: str = ""

    @property
    def named(self) -> str:
        return self.label or self.kill_at


def _kill_when_held(tier, instance_db, run_id: str) -> None:
    """Once the run's worker waits at its kill point: SIGKILL it, end its waiting backend."""
    backend = tier.setup.wait_for(
        lambda: instance_db.execute(
            text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND classid = :lock_class "
                "AND objid::bigint = (hashtext(:run_id)::bigint & 4294967295)"
            ),
            {"lock_class": LOCK_CLASS, "run_id": run_id},
        ).scalar(),
        f"run {run_id} at its kill point",
        timeout=120,
    )
    (start,) = tier.instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_START)
    os.kill(start.dagster_event.pid, signal.SIGKILL)
    instance_db.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})


def _launch_held(tier, instance_db, job_name, collection, kill_at, run_config=None, tags=None):
    tags = {
        **(tags or {}),
        KILL_TAG: kill_at,
        COLLECTION_ID_TAG: collection.id,
    }
    run_id = tier.setup.launch(job_name, run_config, tags)
    instance_db.execute(
        text("SELECT pg_advisory_lock(:c, hashtext(:r))"), {"c": LOCK_CLASS, "r": run_id}
    )
    return run_id


def _release(instance_db, run_id: str) -> None:
    instance_db.execute(
        text("SELECT pg_advisory_unlock(:c, hashtext(:r))"), {"c": LOCK_CLASS, "r": run_id}
    )


def _kill_all(tier, instance_db, held: list[Killed], expire) -> None:
    for each in held:
        _kill_when_held(tier, instance_db, each.run_id)
        expire(each)
        _release(instance_db, each.run_id)


# Runs held at their kill points at once: with their retries they stay within the queue's
# max_concurrent_runs (8), so a retry's queue wait is the queue's, not a wait for capacity.
WAVE = 4


def _in_waves(tier, specs, launch, expire) -> list[Killed]:
    """Launch the runs `WAVE` at a time, each killed at its kill point before the next wave."""
    held: list[Killed] = []
    with _instance_database(tier) as instance_db:
        for start in range(0, len(specs), WAVE):
            wave = [launch(instance_db, spec) for spec in specs[start : start + WAVE]]
            _kill_all(tier, instance_db, wave, expire)
            held += wave
    return held


def _child(tier, parent_id: str) -> dg.DagsterRun:
    """The run that re-executed `parent_id` (its crash retry or an operator's re-execution),
    once it finished."""

    def finished():
        runs = [
            run
            for run in tier.instance.get_runs(
                filters=dg.RunsFilter(tags={"dagster/parent_run_id": parent_id})
            )
            if run.is_finished
        ]
        return runs[0] if runs else None

    try:
        return tier.setup.wait_for(finished, f"the re-execution of {parent_id}", timeout=240)
    except TimeoutError as error:
        raise TimeoutError(f"{error}\n{_parent_story(tier, parent_id)}") from None


def _parent_story(tier, parent_id: str) -> str:
    """Why a parent may have had no retry: its status and tags (dagster/will_retry among them)
    and the types and messages of its last events (who failed it, and why)."""
    run = tier.instance.get_run_by_id(parent_id)
    records = tier.instance.get_records_for_run(parent_id, ascending=False, limit=12).records
    events = [
        f"  {record.event_log_entry.dagster_event_type}: "
        f"{(record.event_log_entry.message or '')[:200]}"
        for record in reversed(records)
    ]
    return f"parent {run.status.value} tags {dict(run.tags)}\n" + "\n".join(events)


def _reconciliation_tags(slug: str, *, force: bool) -> dict[str, str]:
    tags = {"dagster/partition": slug, **queue_tags("reconciliation", slug)}
    return {**tags, FORCE_TAG: "true"} if force else tags


def _expiring(tier, table):
    """Backdates the killed run's lease on its row of `table` (its lease time passed)."""

    def expire(killed: Killed) -> None:
        collection = _collection(tier, killed.collection)
        backdate(tier.db.engine, table, "lease_expires_at", 1, collection_id=collection.id)

    return expire


def _collection(tier, slug: str):
    return next(collection for collection in tier.collections if collection.slug == slug)


def _table(rows: list[tuple[str, str, str, str]]) -> str:
    return "\n".join(
        f"  {kill_at:38} {run:20} {status:8} {outcome}" for kill_at, run, status, outcome in rows
    )


def test_crash_retries_resume_the_reconciliation_at_every_boundary(tier):
    rows, retries = [], []
    launches = [
        (f"STEP_START:{step}", slug, True, "")
        for step, slug in zip(RECONCILIATION_STEPS, RECONCILED, strict=False)
    ]
    # A run that stops at its claim (coverage complete, no force): killed while Dagster records
    # its later steps as skipped.
    launches.append(
        ("STEP_SKIPPED:", RECONCILED[-1], False, "STEP_SKIPPED (after already_complete)")
    )

    def launch(instance_db, spec) -> Killed:
        kill_at, slug, force, label = spec
        run_id = _launch_held(
            tier,
            instance_db,
            media_usage_reconciliation.name,
            _collection(tier, slug),
            kill_at,
            tags=_reconciliation_tags(slug, force=force),
        )
        return Killed(kill_at, slug, run_id, label)

    held = _in_waves(tier, launches, launch, _expiring(tier, schema.reconciliations))
    for killed in held:
        parent = tier.wait_status(killed.run_id, [dg.DagsterRunStatus.FAILURE], timeout=120)
        retry = _child(tier, killed.run_id)
        retries.append(retry)
        outcome = retry.tags.get(OUTCOME_TAG, "-")
        rows.append((killed.named, "crash retry", retry.status.value, outcome))
        assert "dagster/retry_number" in retry.tags, retry.tags
        assert retry.status is dg.DagsterRunStatus.SUCCESS, (killed, _errors(tier, retry))
        assert outcome in CLEAN_OUTCOMES, (killed, outcome)
        assert parent.tags.get(KILL_TAG) == killed.kill_at
    for slug in RECONCILED:
        assert _coverage_complete(tier, slug), slug
    waits = [run_moments(tier.instance, retry.run_id).queue_wait for retry in retries]
    assert max(waits) <= QUEUE_WAIT_BOUND_SECONDS
    report("reconciliation kill points (SIGKILL at the event) -> the retry:\n" + _table(rows))
    report(f"crash retries' queue waits (enqueued -> starting): {summary(waits)}")


def test_crash_retries_resume_the_deletion_at_every_boundary(tier):
    rows, retries = [], []
    for slug in DELETED:  # requested: the background graph starts at the fence
        tombstone(tier.db.engine, _collection(tier, slug), DeletionPhase.FENCE, force=True)

    def launch(instance_db, spec) -> Killed:
        step, slug = spec
        collection = _collection(tier, slug)
        kill_at = f"STEP_START:{step}"
        run_id = _launch_held(
            tier,
            instance_db,
            media_usage_collection_deletion.name,
            collection,
            kill_at,
            run_config={"ops": {"claim_deletion": {"config": {"collection_id": collection.id}}}},
            tags=queue_tags("deletion", slug),
        )
        return Killed(kill_at, slug, run_id)

    specs = list(zip(DELETION_STEPS, DELETED, strict=True))
    held = _in_waves(tier, specs, launch, _expiring(tier, schema.collection_deletions))

    for killed in held:
        tier.wait_status(killed.run_id, [dg.DagsterRunStatus.FAILURE], timeout=120)
        retry = _child(tier, killed.run_id)
        retries.append(retry)
        outcome = retry.tags.get(OUTCOME_TAG, "-")
        rows.append((killed.named, "crash retry", retry.status.value, outcome))
        assert retry.status is dg.DagsterRunStatus.SUCCESS, (killed, _errors(tier, retry))
        assert outcome in CLEAN_OUTCOMES, (killed, outcome)
    waits = [run_moments(tier.instance, retry.run_id).queue_wait for retry in retries]
    assert max(waits) <= QUEUE_WAIT_BOUND_SECONDS
    report("deletion kill points (SIGKILL at the event) -> the retry:\n" + _table(rows))
    report(f"crash retries' queue waits (enqueued -> starting): {summary(waits)}")


def _coverage_complete(tier, slug: str) -> bool:
    from media_usage_orchestration.bench.database import coverage_is_complete

    return coverage_is_complete(tier.db.engine, _collection(tier, slug))


def _errors(tier, run: dg.DagsterRun) -> list[str]:
    return [
        record.event_log_entry.message
        for record in tier.instance.get_records_for_run(run.run_id).records
        if record.event_log_entry.dagster_event_type
        in (dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE)
    ]


def test_re_execute_from_failure_resumes_a_killed_run_of_each_graph(tier):
    """The run page's "Re-execute from failure" on runs that were not crash-retried (tagged
    dagster/max_retries=0): it resumes from the database row as the crash retry does."""
    reconciled, deleted = _collection(tier, RECONCILED[0]), _collection(tier, "del_extra")
    tombstone(tier.db.engine, deleted, DeletionPhase.FENCE, force=True)
    no_retry = {"dagster/max_retries": "0"}
    with _instance_database(tier) as instance_db:
        held = [
            Killed(
                "STEP_START:scan_pages",
                reconciled.slug,
                _launch_held(
                    tier,
                    instance_db,
                    media_usage_reconciliation.name,
                    reconciled,
                    "STEP_START:scan_pages",
                    tags={**_reconciliation_tags(reconciled.slug, force=True), **no_retry},
                ),
            ),
            Killed(
                "STEP_START:delete_sources",
                deleted.slug,
                _launch_held(
                    tier,
                    instance_db,
                    media_usage_collection_deletion.name,
                    deleted,
                    "STEP_START:delete_sources",
                    run_config={
                        "ops": {"claim_deletion": {"config": {"collection_id": deleted.id}}}
                    },
                    tags={**queue_tags("deletion", deleted.slug), **no_retry},
                ),
            ),
        ]
        expire = {
            reconciled.slug: _expiring(tier, schema.reconciliations),
            deleted.slug: _expiring(tier, schema.collection_deletions),
        }
        _kill_all(tier, instance_db, held, lambda killed: expire[killed.collection](killed))

    rows = []
    for killed in held:
        failed = tier.wait_status(killed.run_id, [dg.DagsterRunStatus.FAILURE], timeout=120)
        assert failed.tags.get("dagster/will_retry") != "true"
        child = tier.wait_status(
            tier.setup.reexecute_from_failure(killed.run_id), FINISHED, timeout=240
        )
        assert child.parent_run_id == killed.run_id
        outcome = child.tags.get(OUTCOME_TAG, "-")
        rows.append((killed.named, "re-execute from failure", child.status.value, outcome))
        assert child.status is dg.DagsterRunStatus.SUCCESS, (killed, _errors(tier, child))
        assert outcome in CLEAN_OUTCOMES, (killed, outcome)
    assert _coverage_complete(tier, reconciled.slug)
    report("operator re-execution of killed runs -> the re-execution:\n" + _table(rows))
