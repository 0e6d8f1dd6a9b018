"""Runs and sensor ticks under hostile conditions: a failing statement never puts a lease or
run token into the run's events or logs; a collection being deleted gets no reconciliation run
and no partition back; an unreachable database is one password-free skip line per tick."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._serdes import serialize_value
from sqlalchemy import Engine, delete, event

from media_usage_orchestration.local.in_process_lane import LANE_SENSORS
from media_usage_orchestration.partitions import media_usage_collections
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.processing.reconciliation import steps
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.deletion.records import DeletionPhase
from media_usage_orchestration.store.reads.probes import due_reconciliations
from tests.support.deletions import tombstone
from tests.support.reconciliation_runs import (
    RECONCILIATION_JOB,
    tick,
    write_collections,
)
from tests.support.sensor_loop import add_requested_partitions, evaluate, resources, resources_for
from tests.support.states import backdate, make_collection, one

RECONCILIATIONS = schema.reconciliations.name
FAIL_SCAN_PROGRESS = {
    "sqlite": [
        f"CREATE TRIGGER test_fail_scan BEFORE UPDATE OF scan_cursor ON {RECONCILIATIONS} "
        "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
    ],
    "postgres": [
        "CREATE FUNCTION test_fail_scan() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'injected failure'; END $$",
        f"CREATE TRIGGER test_fail_scan BEFORE UPDATE OF scan_cursor ON {RECONCILIATIONS} "
        "FOR EACH ROW EXECUTE FUNCTION test_fail_scan()",
    ],
}


# --- 5. tokens never reach a failed run's events --------------------------------------------------


@contextlib.contextmanager
def bound_tokens() -> Iterator[set[str]]:
    """Every value bound to a parameter named like a token, by any engine, inside the block."""
    tokens: set[str] = set()

    def record(_connection, _cursor, _statement, _parameters, context, _executemany):
        for parameters in getattr(context, "compiled_parameters", None) or []:
            for name, value in parameters.items():
                if "token" in name and isinstance(value, str) and value:
                    tokens.add(value)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield tokens
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def test_a_failed_run_records_no_lease_or_run_token_in_any_event(db, instance):
    write_collections(db.engine, {"posts": 3})
    activate(db.engine)
    add_requested_partitions(instance, tick(db, instance))
    with db.engine.begin() as connection:
        for statement in FAIL_SCAN_PROGRESS[db.dialect]:
            connection.exec_driver_sql(statement)

    with bound_tokens() as tokens:
        result = RECONCILIATION_JOB.execute_in_process(
            instance=instance, resources=resources(db), partition_key="posts", raise_on_error=False
        )

    assert not result.success
    row = one(db.engine, schema.reconciliations, collection_slug="posts")
    assert row["run_token"] in tokens  # the run did bind its tokens: the check below can fail
    assert len(tokens) >= 2, tokens  # the run token and at least one lease token
    records = [serialize_value(entry) for entry in instance.all_logs(result.run_id)]
    for text in records:
        for token in tokens:
            assert token not in text
    failures = [text for text in records if "injected failure" in text]
    assert failures, "the injected failure is reported"
    assert any("hide_parameters" in text for text in failures)  # the statement, no values


# --- 6. a collection being deleted gets no run and no partition -----------------------------------


def _deleted_by_tombstone(db, collection) -> None:
    tombstone(db.engine, collection, DeletionPhase.WORK, force=True)


def _gone_from_the_registry(db, collection) -> None:
    with db.engine.begin() as connection:
        connection.execute(
            delete(schema.collections).where(schema.collections.c.id == collection.id)
        )


@pytest.mark.parametrize(
    "remove", [_deleted_by_tombstone, _gone_from_the_registry], ids=["tombstone", "registry"]
)
def test_a_deleted_collection_whose_lease_lapsed_gets_no_run_and_keeps_no_partition(
    db, instance, remove
):
    posts = make_collection(db.engine, "posts")
    make_collection(db.engine, "kept")
    activate(db.engine)
    add_requested_partitions(instance, tick(db, instance))
    assert steps.claim_collection(db.engine, posts.id).claim is not None
    remove(db, posts)
    # What maintenance does for a deleted collection, then the dead run's lease lapses.
    instance.delete_dynamic_partition(media_usage_collections.name, "posts")
    backdate(db.engine, schema.reconciliations, "lease_expires_at", 60, collection_id=posts.id)

    candidates = due_reconciliations(db.engine, 25)
    assert [candidate.collection_slug for candidate in candidates] == ["kept"]
    for _ in range(3):  # every tick, not only the first
        data = tick(db, instance)
        assert [request.partition_key for request in data.run_requests] == ["kept"]
        assert not data.dynamic_partitions_requests
        assert "posts" not in instance.get_dynamic_partitions(media_usage_collections.name)


def test_rows_of_deleted_collections_do_not_crowd_out_a_due_one(db):
    """The probe filters before its LIMIT: many lapsed rows of deleted collections cannot fill
    it and starve a live collection."""
    activate(db.engine)
    deleted = [make_collection(db.engine, f"gone{index}") for index in range(3)]
    for collection in deleted:
        assert steps.claim_collection(db.engine, collection.id).claim is not None
        tombstone(db.engine, collection, DeletionPhase.WORK, force=True)
        backdate(
            db.engine, schema.reconciliations, "lease_expires_at", 600, collection_id=collection.id
        )
    live = make_collection(db.engine, "live")
    assert steps.claim_collection(db.engine, live.id).claim is not None
    backdate(db.engine, schema.reconciliations, "lease_expires_at", 1, collection_id=live.id)

    [candidate] = due_reconciliations(db.engine, 1)
    assert candidate.collection_slug == "live" and candidate.lease_expired


# --- 7. an unreachable database -------------------------------------------------------------------

PASSWORD = "S3cret-pw"
UNREACHABLE = f"postgresql+psycopg://media:{PASSWORD}@127.0.0.1:1/cms?sslpassword={PASSWORD}x&connect_timeout=2"


@pytest.mark.parametrize("sensor", LANE_SENSORS, ids=lambda sensor: sensor.name)
def test_a_sensor_skips_with_one_password_free_line_when_the_database_is_unreachable(sensor):
    with dg.DagsterInstance.ephemeral() as instance:
        data = evaluate(sensor, instance, resources_for(UNREACHABLE))

    assert not data.run_requests
    message = data.skip_message
    assert message.startswith(
        "database unreachable at postgresql+psycopg://media:***@127.0.0.1:1/cms"
    )
    assert "check MEDIA_USAGE_DATABASE_URL and that the server is up" in message
    assert "Connection refused" in message  # the driver's reason, its first line only
    assert "\n" not in message and PASSWORD not in message
    assert not re.search(r"\[SQL|Traceback", message)
