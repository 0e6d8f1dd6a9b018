"""Run leases (`store/runs/run_leases.py`) and the run heartbeat that keeps one
(`processing/loop/run_heartbeat.py`), on both dialects: every write names the lease by run id and
token; a renewal needs the lease still live, so an expired lease is never revived."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from media_usage_orchestration.processing.loop.run_heartbeat import RunHeartbeat
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.runs.run_leases import (
    RunLease,
    begin_run_lease,
    end_run_lease,
    prune_expired_run_leases,
    read_run_leases,
    renew_run_lease,
)
from tests.support.states import backdate

RUN = "run-0001"


def _row(db, run_id: str = RUN):
    with db.engine.connect() as connection:
        return (
            connection.execute(
                select(schema.run_leases).where(schema.run_leases.c.run_id == run_id)
            )
            .mappings()
            .first()
        )


def test_a_run_takes_its_lease_once(db):
    lease = begin_run_lease(db.engine, RUN, "media_usage_work", 30)
    assert lease is not None and lease.run_id == RUN
    assert begin_run_lease(db.engine, RUN, "media_usage_work", 30) is None  # a second worker
    row = _row(db)
    assert row["lease_token"] == lease.lease_token and row["job_name"] == "media_usage_work"
    assert row["started_at"] <= row["heartbeat_at"] < row["lease_expires_at"]
    assert read_run_leases(db.engine, [RUN, "run-9999"])[RUN].live is True


def test_renewal_needs_the_token_and_a_live_lease(db):
    lease = begin_run_lease(db.engine, RUN, "media_usage_work", 30)
    backdate(db.engine, schema.run_leases, "heartbeat_at", 20, run_id=RUN)
    before = _row(db)
    assert not renew_run_lease(db.engine, RunLease(RUN, "someone-else"), 30)
    assert _row(db) == before
    assert renew_run_lease(db.engine, lease, 30)
    assert _row(db)["heartbeat_at"] > before["heartbeat_at"]

    backdate(db.engine, schema.run_leases, "lease_expires_at", 1, run_id=RUN)
    expired = _row(db)
    assert not renew_run_lease(db.engine, lease, 30)  # judged dead: never revived
    assert _row(db) == expired
    assert read_run_leases(db.engine, [RUN])[RUN].live is False


def test_ending_a_lease_needs_its_token(db):
    lease = begin_run_lease(db.engine, RUN, "media_usage_work", 30)
    assert not end_run_lease(db.engine, RunLease(RUN, "someone-else"))
    assert end_run_lease(db.engine, lease)
    assert _row(db) is None


def test_only_leases_expired_long_ago_are_pruned(db):
    for run_id in ("old", "recent", "live"):
        begin_run_lease(db.engine, run_id, "media_usage_work", 30)
    backdate(db.engine, schema.run_leases, "lease_expires_at", 7200, run_id="old")
    backdate(db.engine, schema.run_leases, "lease_expires_at", 60, run_id="recent")
    assert prune_expired_run_leases(db.engine, after_seconds=3600) == 1
    assert sorted(read_run_leases(db.engine, ["old", "recent", "live"])) == ["live", "recent"]


@pytest.mark.parametrize("bad", [("", 30), (RUN, 0), (RUN, 1.5), (RUN, 10**9)])
def test_bad_input_changes_nothing(db, bad):
    run_id, seconds = bad
    with pytest.raises(ValueError):
        begin_run_lease(db.engine, run_id, "media_usage_work", seconds)
    assert read_run_leases(db.engine, [RUN]) == {}


def test_the_heartbeat_takes_renews_and_gives_up_the_lease(db):
    heartbeat = RunHeartbeat(db.engine, RUN, "media_usage_work", interval_seconds=0.05).start()
    try:
        taken = _row(db)
        assert taken is not None
        backdate(db.engine, schema.run_leases, "heartbeat_at", 20, run_id=RUN)
        _wait_until(lambda: _row(db)["heartbeat_at"] > taken["heartbeat_at"])
    finally:
        heartbeat.stop()
    assert _row(db) is None and not heartbeat.lost


def test_a_heartbeat_whose_lease_expired_stops_and_leaves_it_expired(db):
    warnings: list[str] = []
    heartbeat = RunHeartbeat(
        db.engine, RUN, "media_usage_work", interval_seconds=0.05, warn=warnings.append
    ).start()
    try:
        backdate(db.engine, schema.run_leases, "lease_expires_at", 1, run_id=RUN)
        _wait_until(lambda: heartbeat.lost)
        expired = _row(db)
    finally:
        heartbeat.stop()
    assert _row(db) == expired  # left for the run-health sensor to judge
    assert any("expired before it was renewed" in warning for warning in warnings)


@pytest.mark.sqlite_only("one database without the project's table is enough")
def test_a_database_without_run_leases_warns_once_and_carries_on(emdash):
    warnings: list[str] = []
    heartbeat = RunHeartbeat(
        emdash.engine, RUN, "media_usage_work", interval_seconds=0.05, warn=warnings.append
    ).start()
    heartbeat.stop()
    assert heartbeat.lost and len(warnings) == 1 and "media-usage init" in warnings[0]


def _wait_until(condition, timeout: float = 5.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the heartbeat did not get there"
        time.sleep(0.01)
