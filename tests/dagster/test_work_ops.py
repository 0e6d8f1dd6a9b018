"""The work and activation ops, called directly with `build_op_context` on both dialects, and
their failure policy: transient database errors go to the RetryPolicy, everything else fails
the step at once."""

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace

import dagster as dg
import psycopg
import pytest
from sqlalchemy import create_engine, text, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from media_usage_orchestration.dagster_kit import default_status, retries
from media_usage_orchestration.dagster_kit.retries import (
    TRANSIENT_RETRY_POLICY,
    retry_transient_errors_only,
)
from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_ID_TAG, COLLECTION_TAG
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import MEDIA_FIELDS
from media_usage_orchestration.jobs import media_usage_work
from media_usage_orchestration.ops import work as work_op_module
from media_usage_orchestration.ops.activation import activate_capture
from media_usage_orchestration.ops.work import drain_due_work
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.loop import run_loop
from media_usage_orchestration.processing.loop.retry_policy import WORK_RETRY
from media_usage_orchestration.processing.work.processor import WorkCounts, process_due_batch
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.core import engine as engine_module
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.capture_triggers import (
    CaptureIdentity,
    verify_capture_triggers,
)
from media_usage_orchestration.store.core.engine import is_transient_database_error
from media_usage_orchestration.store.host.activation import claim_activation
from tests.support.factories import draft_revision, insert_registry
from tests.support.ops import invoke
from tests.support.projection import (
    active_collection,
    canonical_key,
    coverage,
    find_source,
    insert_entry,
    row_trigger,
    supersede_work_sql,
    work_count,
    work_for,
)
from tests.support.sensor_loop import plain
from tests.support.states import all_rows, one, set_activation, snapshot, status_row

SLUGS = ("posts", "articles", "pages")
COUNTS = ("claimed", "completed", "retry", "failed", "superseded", "obsolete", "claim_lost")


def _resources(url: str) -> dict:
    return {"database": MediaUsageDatabase.for_url(url)}


def _run_work_op(db, **config) -> dict:
    """Invoke the op directly; returns its output metadata as plain values."""
    return invoke(drain_due_work, db, op_config=config).metadata


def _counts(metadata: dict) -> dict:
    return {name: metadata[name] for name in COUNTS}


def _expected(**nonzero: int) -> dict:
    return {name: nonzero.get(name, 0) for name in COUNTS}


def _entries(engine, slug: str, count_: int) -> list[str]:
    content_ids = [f"entry-{index}" for index in range(count_)]
    for content_id in content_ids:
        insert_entry(engine, slug, content_id, f"media-{content_id}")
    return content_ids


def _broken_draft(db, slug: str, content_id: str) -> None:
    """A draft revision whose data is not JSON: the snapshot fails (a retryable error)."""
    draft_revision(db.engine, slug, content_id, "{", revision_id=f"broken-{content_id}")


# --- drain_due_work ---------------------------------------------------------------------------


def test_the_item_budget_bounds_one_invocation_and_the_next_one_finishes(db):
    posts = active_collection(db.engine, "posts")
    content_ids = _entries(db.engine, "posts", 7)

    first = _run_work_op(db, max_items=3, batch_size=2)

    assert _counts(first) == _expected(claimed=3, completed=3)
    assert first["stopped_by"] == "budget"
    assert work_count(db.engine) == 4
    projected = [cid for cid in content_ids if find_source(db.engine, canonical_key(posts, cid))]
    assert len(projected) == 3

    second = _run_work_op(db)

    assert _counts(second) == _expected(claimed=4, completed=4)
    assert second["stopped_by"] == "nothing_due"
    assert work_count(db.engine) == 0
    assert all(find_source(db.engine, canonical_key(posts, cid)) for cid in content_ids)
    report = verify_index(db.engine)
    assert not report.has_drift and report.pending_work_count == 0


def test_a_lingering_run_projects_an_edit_committed_while_it_waits(db, monkeypatch):
    """With `linger_seconds`, the drained op waits for more of its collection's work: an entry
    written during the wait is claimed by the same invocation, and the wait then ends."""
    posts = active_collection(db.engine, "posts")
    _entries(db.engine, "posts", 2)
    polls = []

    def edit_on_first_poll(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 1:
            insert_entry(db.engine, "posts", "written-while-waiting")
        else:
            time.sleep(seconds)

    monkeypatch.setattr(
        work_op_module, "Linger", lambda seconds: run_loop.Linger(seconds, 0.1, edit_on_first_poll)
    )

    metadata = _run_work_op(db, linger_seconds=0.3)

    assert _counts(metadata) == _expected(claimed=3, completed=3)
    assert (metadata["stopped_by"], metadata["outcome"]) == ("nothing_due", "projected")
    assert find_source(db.engine, canonical_key(posts, "written-while-waiting"))
    # The first poll found the edit; after that burst it waited its 0.3 s in 0.1 s polls.
    assert polls[0] == 0.1 and 3 <= len(polls) <= 5
    assert work_count(db.engine) == 0


class _Clock:
    """A budget clock that each sleep of the linger moves forward."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_yielding_linger_ends_when_a_collection_waits_for_its_slot_and_asks_every_check():
    clock = _Clock()
    asked = []

    def waiting() -> str | None:
        asked.append(clock.now)
        return "pages" if len(asked) == 3 else None

    linger = work_op_module.YieldingLinger(
        30.0, 0.5, clock.sleep, waiting=waiting, check_seconds=2.0
    )

    assert linger.wait_for_work(run_loop.Budget(clock=lambda: clock.now), lambda: False) is False

    # Asked once per 2 s of waiting, not on every half-second poll; it ended at the third.
    assert asked == [2.0, 4.0, 6.0]
    assert linger.yielded_to == ["pages"]


def test_a_yielding_linger_asks_over_waits_shorter_than_its_interval():
    """An edit every second ends each wait after one: the two-second interval is counted over
    the run's waits, or a steady trickle of edits would hold the slot for good."""
    clock, asked = _Clock(), []

    def waiting() -> str | None:
        asked.append(clock.now)
        return None

    linger = work_op_module.YieldingLinger(
        30.0, 0.5, clock.sleep, waiting=waiting, check_seconds=2.0
    )
    budget = run_loop.Budget(clock=lambda: clock.now)
    for wait in range(1, 6):
        assert linger.wait_for_work(budget, lambda wait=wait: clock.now >= wait) is True
        clock.now += 0.25  # the burst's drain is not waiting

    # Each wait lasts under a second; the waiting added up to two seconds by the fourth.
    assert asked == [3.75] and linger.yielded_to == []


def test_a_yielding_linger_still_drains_its_own_work_and_waits_out_its_time():
    clock = _Clock()
    linger = work_op_module.YieldingLinger(3.0, 0.5, clock.sleep, waiting=lambda: None)
    budget = run_loop.Budget(clock=lambda: clock.now)

    assert linger.wait_for_work(budget, lambda: clock.now >= 1.0) is True
    assert clock.now == 1.0
    assert linger.wait_for_work(budget, lambda: False) is False
    assert (clock.now, linger.yielded_to) == (4.0, [])


def _burst(completed: int, failed: int = 0) -> run_loop.WorkDrain:
    posts = ("posts-id", "posts")
    return run_loop.WorkDrain(
        run_loop.WorkDrainEnd.NOTHING_DUE,
        WorkCounts(claimed=completed + failed, completed=completed, failed=failed),
        {posts: completed} if completed else {},
        {posts: failed} if failed else {},
    )


COMPLETE = ("complete", False)


def test_coverage_is_recorded_at_the_first_burst_on_state_changes_and_at_the_end():
    states, recorded = [COMPLETE], []
    coverage = work_op_module.CoverageRecorder(recorded.append, lambda: states[-1])

    coverage.burst(_burst(3))  # the run's first: at once
    for _ in range(4):  # edits that change nothing the checks turn on: summed
        coverage.burst(_burst(1))
    states.append(("partial", False))  # a reconciliation was asked for meanwhile
    coverage.burst(_burst(2))
    coverage.burst(_burst(1))
    coverage.flush()  # the run ends
    coverage.flush()  # nothing left

    assert [drain.counts.completed for drain in recorded] == [3, 6, 1]
    assert recorded[1].completed_by_collection == {("posts-id", "posts"): 6}


def test_a_burst_with_items_failed_for_good_is_recorded_at_once():
    recorded = []
    coverage = work_op_module.CoverageRecorder(recorded.append, lambda: COMPLETE)
    coverage.burst(_burst(1))
    coverage.burst(_burst(1))
    coverage.burst(_burst(0, failed=1))

    assert [(drain.counts.completed, drain.counts.failed) for drain in recorded] == [
        (1, 0),
        (1, 1),
    ]


def test_a_work_run_under_steady_edits_records_coverage_at_its_first_burst_and_its_end(
    db, instance, monkeypatch
):
    """Six edits land one by one while the run lingers, none changing the collection's state:
    the index partition is materialized twice (first burst, end), with every edit counted."""
    active_collection(db.engine, "posts")
    _entries(db.engine, "posts", 2)
    edits = iter(range(6))

    def edit_on_each_poll(seconds: float) -> None:
        if (edit := next(edits, None)) is not None:
            insert_entry(db.engine, "posts", f"edited-{edit}")
        else:
            time.sleep(seconds)

    monkeypatch.setattr(
        work_op_module, "Linger", lambda seconds: run_loop.Linger(seconds, 0.05, edit_on_each_poll)
    )
    result = media_usage_work.execute_in_process(
        instance=instance,
        resources=_resources(db.url),
        run_config={"ops": {"drain_due_work": {"config": {"linger_seconds": 0.2}}}},
    )

    materializations = result.asset_materializations_for_node("drain_due_work")
    projected = [plain(each.metadata)["entries_projected"] for each in materializations]
    assert sum(projected) == 8 and projected[0] == 2
    assert len(materializations) == 2, projected


def _work_run_in_flight(instance, collection, status=dg.DagsterRunStatus.STARTED) -> dg.DagsterRun:
    return instance.create_run_for_job(
        job_def=media_usage_work,
        status=status,
        tags={COLLECTION_ID_TAG: collection.id, COLLECTION_TAG: collection.slug},
    )


def test_the_oldest_work_run_in_flight_gives_its_slot_to_a_collection_left_waiting(db, instance):
    posts, articles, pages = (active_collection(db.engine, slug) for slug in SLUGS)
    oldest = _work_run_in_flight(instance, posts)
    younger = _work_run_in_flight(instance, articles)
    insert_entry(db.engine, "posts", "entry-posts")  # its own work never counts
    insert_entry(db.engine, "pages", "entry-pages")

    def waiting(run: dg.DagsterRun, max_work_runs: int = 2) -> str | None:
        context = SimpleNamespace(
            instance=instance, job_name=media_usage_work.name, run_id=run.run_id
        )
        owner = run.tags[COLLECTION_ID_TAG]
        return work_op_module.waiting_collection(context, db.engine, owner, max_work_runs)

    assert waiting(oldest) == "pages"
    assert waiting(younger) is None  # one run gives its slot up, not every run
    assert waiting(oldest, max_work_runs=3) is None  # a free slot: the sensor launches pages' run
    queued = _work_run_in_flight(instance, pages, dg.DagsterRunStatus.NOT_STARTED)
    assert waiting(oldest, max_work_runs=3) is None  # pages has its run
    instance.report_run_canceled(queued)
    instance.report_run_canceled(younger)
    assert waiting(oldest, max_work_runs=1) == "pages"
    insert_entry(db.engine, "articles", "entry-articles")
    assert waiting(oldest, max_work_runs=1) in {"pages", "articles"}


def test_a_spent_time_budget_claims_nothing(db):
    active_collection(db.engine, "posts")
    _entries(db.engine, "posts", 2)

    metadata = _run_work_op(db, max_seconds=1e-9)

    assert _counts(metadata) == _expected()
    assert metadata["stopped_by"] == "budget"
    assert {row["state"] for row in all_rows(db.engine, schema.work)} == {"pending"}
    assert work_count(db.engine) == 2


def test_metadata_counts_every_outcome_and_the_rows_agree(db):
    posts = active_collection(db.engine, "posts")
    for content_id in ("entry-ok", "entry-retry", "entry-failed", "entry-sup"):
        insert_entry(db.engine, "posts", content_id, f"media-{content_id}")
    _broken_draft(db, "posts", "entry-retry")
    _broken_draft(db, "posts", "entry-failed")
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.work)
            .where(schema.work.c.content_id == "entry-failed")
            .values(attempt_count=WORK_RETRY.max_attempts - 1)
        )
    # Publishing entry-sup re-enqueues it while this run holds its lease: superseded, and the
    # redelivered version is completed by the same invocation (its projection is unchanged).
    row_trigger(
        db,
        "test_op_supersede",
        schema.sources.name,
        supersede_work_sql("entry-sup"),
        when="NEW.content_id = 'entry-sup'",
    )
    reused = active_collection(db.engine, "reused")
    insert_entry(db.engine, "reused", "entry-obs")
    with db.engine.begin() as connection:
        connection.execute(schema.collections.delete().where(schema.collections.c.id == reused.id))
    insert_registry(db.engine, id="replacement-id", slug="reused", label="Reused")

    metadata = _run_work_op(db, batch_size=10, collection_id=posts.id)
    # A run takes one collection's work: unnamed, the one due earliest (the replaced one's).
    obsolete = _run_work_op(db, batch_size=10)

    assert _counts(metadata) == _expected(claimed=5, completed=2, retry=1, failed=1, superseded=1)
    assert _counts(obsolete) == _expected(claimed=1, obsolete=1)
    assert metadata["stopped_by"] == obsolete["stopped_by"] == "nothing_due"
    retry = work_for(db.engine, "entry-retry")
    assert (retry["state"], retry["attempt_count"], retry["last_error_code"]) == (
        "retry",
        1,
        "MEDIA_USAGE_SNAPSHOT_FAILED",
    )
    failed = work_for(db.engine, "entry-failed")
    assert (failed["state"], failed["attempt_count"]) == ("failed", WORK_RETRY.max_attempts)
    assert work_count(db.engine) == 2
    assert find_source(db.engine, canonical_key(posts, "entry-ok")) is not None
    assert find_source(db.engine, canonical_key(posts, "entry-sup")) is not None
    assert find_source(db.engine, canonical_key(reused, "entry-obs")) is None
    status = coverage(db.engine, posts)
    assert (status["status"], status["last_error_code"]) == (
        "partial",
        "MEDIA_USAGE_SNAPSHOT_FAILED",
    )


def test_inactive_capture_is_reported_and_nothing_is_claimed(db):
    active_collection(db.engine, "posts")
    _entries(db.engine, "posts", 2)
    set_activation(db.engine, "expanded")
    before = snapshot(db.engine, [schema.work, schema.sources, schema.occurrences])

    metadata = _run_work_op(db)

    assert _counts(metadata) == _expected()
    assert metadata["stopped_by"] == "inactive"
    assert snapshot(db.engine, [schema.work, schema.sources, schema.occurrences]) == before


def test_a_non_transient_database_error_fails_the_step_without_retries(db):
    active_collection(db.engine, "posts")
    _entries(db.engine, "posts", 1)
    with db.engine.begin() as connection:
        connection.execute(text("ALTER TABLE _emdash_media_usage_work RENAME TO moved_work"))

    with pytest.raises(dg.Failure) as raised:
        _run_work_op(db)

    assert raised.value.allow_retries is False
    assert isinstance(raised.value.__cause__, sa_exc.DBAPIError)
    assert not is_transient_database_error(raised.value.__cause__)
    assert type(raised.value.__cause__).__name__ in raised.value.description


@contextlib.contextmanager
def _write_lock_held(db, table: str, monkeypatch) -> Iterator[str]:
    """Another connection holds the write lock on `table`; yields a URL whose connections give
    up at once instead of waiting (SQLite: busy timeout 0; PostgreSQL: lock_timeout)."""
    if db.is_postgres:
        url = make_url(db.url)
        options = f"{url.query['options']} -clock_timeout=100"
        impatient = url.update_query_dict({"options": options}).render_as_string(
            hide_password=False
        )
        holder = create_engine(db.url)
        with holder.connect() as connection:
            connection.execute(text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
            yield impatient
            connection.rollback()
        holder.dispose()
        return
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 0)
    holder = sqlite3.connect(make_url(db.url).database, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield db.url
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_locked_database_asks_for_a_step_retry(db, monkeypatch):
    active_collection(db.engine, "posts")
    _entries(db.engine, "posts", 1)

    with (
        _write_lock_held(db, "_emdash_media_usage_work", monkeypatch) as url,
        pytest.raises(dg.RetryRequested) as raised,
    ):
        _run_work_op(replace(db, url=url))

    cause = raised.value.__cause__
    assert is_transient_database_error(cause)
    message = str(cause.orig).lower()
    assert ("lock timeout" in message) if db.is_postgres else ("database is locked" in message)
    assert work_for(db.engine, "entry-0")["state"] == "pending"
    assert raised.value.max_retries == TRANSIENT_RETRY_POLICY.max_retries == 3
    # No policy on the op itself: Dagster would retry an interrupt (Terminate) under one.
    assert drain_due_work.retry_policy is None


def _transient_error() -> sa_exc.OperationalError:
    return sa_exc.OperationalError(
        "UPDATE _emdash_media_usage_work", {}, sqlite3.OperationalError("database is locked")
    )


def _retry_events(result: dg.ExecuteInProcessResult) -> int:
    return sum(1 for event in result.all_events if event.event_type_value == "STEP_UP_FOR_RETRY")


def test_no_op_of_the_project_carries_a_retry_policy():
    """Dagster turns an interrupt (Terminate) into a step retry for an op with a RetryPolicy:
    the project's ops ask for their transient retries themselves instead."""
    for job in defs.resolve_all_job_defs():
        assert job.op_retry_policy is None, job.name
        for node in job.graph.iterate_op_defs():
            assert node.retry_policy is None, (job.name, node.name)


def test_in_a_run_an_interrupt_is_never_retried(db, monkeypatch):
    active_collection(db.engine, "posts")
    _entries(db.engine, "posts", 3)

    def interrupted(*_args, **_kwargs):
        raise dg.DagsterExecutionInterruptedError("terminated by an operator")

    monkeypatch.setattr(run_loop, "process_due_batch", interrupted)
    monkeypatch.setattr(retries, "TRANSIENT_RETRY_POLICY", dg.RetryPolicy(max_retries=2))

    @dg.job(executor_def=dg.in_process_executor)
    def terminated_work():
        drain_due_work()

    # The same op under a RetryPolicy: Dagster retries the interrupt (what the ops avoid).
    @dg.job(executor_def=dg.in_process_executor)
    def terminated_work_under_a_policy():
        drain_due_work.with_retry_policy(dg.RetryPolicy(max_retries=2))()

    with dg.DagsterInstance.ephemeral() as instance:
        result = terminated_work.execute_in_process(
            instance=instance, resources=_resources(db.url), raise_on_error=False
        )
        assert not result.success and _retry_events(result) == 0
        under_policy = terminated_work_under_a_policy.execute_in_process(
            instance=instance, resources=_resources(db.url), raise_on_error=False
        )
        assert _retry_events(under_policy) == 2
    assert work_for(db.engine, "entry-0")["state"] == "pending"


def test_in_a_run_a_transient_error_is_retried_and_a_permanent_one_is_not(db, monkeypatch):
    posts = active_collection(db.engine, "posts")
    _entries(db.engine, "posts", 3)
    calls = []
    real_batch = process_due_batch

    def flaky(engine, batch_size, *args, **kwargs):
        calls.append(batch_size)
        if len(calls) == 1:
            raise _transient_error()
        return real_batch(engine, batch_size, *args, **kwargs)

    monkeypatch.setattr(run_loop, "process_due_batch", flaky)
    # The project's policy waits seconds between attempts; an immediate one shows the same
    # retries without the wait.
    monkeypatch.setattr(retries, "TRANSIENT_RETRY_POLICY", dg.RetryPolicy(max_retries=2))

    @dg.job(executor_def=dg.in_process_executor)
    def retried_work():
        drain_due_work()

    with dg.DagsterInstance.ephemeral() as instance:
        result = retried_work.execute_in_process(
            instance=instance, resources=_resources(db.url), raise_on_error=False
        )
        assert result.success and _retry_events(result) == 1
        assert work_count(db.engine) == 0
        assert find_source(db.engine, canonical_key(posts, "entry-2")) is not None

        insert_entry(db.engine, "posts", "entry-late")

        def broken(*_args, **_kwargs):
            calls.append("broken")
            raise ValueError("a bug, not a busy database")

        monkeypatch.setattr(run_loop, "process_due_batch", broken)
        result = retried_work.execute_in_process(
            instance=instance, resources=_resources(db.url), raise_on_error=False
        )
        assert not result.success and _retry_events(result) == 0
        assert calls.count("broken") == 1
        failure = result.failure_data_for_node("drain_due_work")
        assert "ValueError: a bug, not a busy database" in failure.error.message
        assert work_for(db.engine, "entry-late")["state"] == "pending"


# --- activate_capture -------------------------------------------------------------------------


def _run_activation_op(db) -> dict:
    return invoke(activate_capture, db).metadata


def test_activation_captures_every_collection_then_is_an_idempotent_no_op(db):
    writer = CmsWriter(db.engine)
    created = [writer.create_collection(slug, MEDIA_FIELDS) for slug in ("articles", "pages")]
    assert work_count(db.engine) == 0

    metadata = _run_activation_op(db)

    assert metadata["outcome"] == "active"
    assert metadata["collections_activated"] == 2
    assert sorted(metadata["collections"].split(", ")) == ["articles", "pages"]
    assert one(db.engine, schema.activation)["state"] == "active"
    for collection in created:
        with db.engine.connect() as connection:
            identity = CaptureIdentity(collection.id, collection.slug)
            assert verify_capture_triggers(connection, identity)
        status = status_row(db.engine, collection.slug)
        assert (status["capture_state"], status["reconciliation_required"]) == ("active", 1)
    insert_entry(db.engine, "pages", "entry-1")
    assert work_for(db.engine, "entry-1")["state"] == "pending"

    again = _run_activation_op(db)

    assert (again["outcome"], again["collections_activated"], again["collections"]) == (
        "active",
        0,
        "-",
    )


def test_activation_held_by_another_owner_fails_without_retries(db):
    CmsWriter(db.engine).create_collection("articles", MEDIA_FIELDS)
    with db.engine.begin() as connection:
        token, _row = claim_activation(connection)
    before = snapshot(db.engine, [schema.activation, schema.index_status])

    with pytest.raises(dg.Failure, match="Another activation holds the lease") as raised:
        _run_activation_op(db)

    assert raised.value.allow_retries is False
    assert one(db.engine, schema.activation)["lease_token"] == token
    assert snapshot(db.engine, [schema.activation, schema.index_status]) == before


def test_a_failed_activation_step_fails_fast_and_is_recorded(db):
    CmsWriter(db.engine).create_collection("broken", ())
    with db.engine.begin() as connection:
        connection.exec_driver_sql('DROP TABLE "ec_broken"')

    with pytest.raises(dg.Failure, match="ActivationError") as raised:
        _run_activation_op(db)

    assert raised.value.allow_retries is False
    row = one(db.engine, schema.activation)
    assert (row["state"], row["lease_token"], row["last_error_code"]) == (
        "activating",
        None,
        "MEDIA_USAGE_ACTIVATION_FAILED",
    )
    assert status_row(db.engine, "broken")["capture_state"] is None


def test_activation_on_a_locked_database_asks_for_a_step_retry(db, monkeypatch):
    CmsWriter(db.engine).create_collection("articles", MEDIA_FIELDS)

    with (
        _write_lock_held(db, "_emdash_media_usage_activation", monkeypatch) as url,
        pytest.raises(dg.RetryRequested) as raised,
    ):
        _run_activation_op(replace(db, url=url))

    assert is_transient_database_error(raised.value.__cause__)
    assert activate_capture.retry_policy is None
    row = one(db.engine, schema.activation)
    assert (row["state"], row["lease_token"], row["attempt_count"]) == ("expanded", None, 0)


# --- the classification itself ---------------------------------------------------------------


def _dbapi(cls, orig: BaseException, **kwargs):
    return cls("SELECT 1", {}, orig, **kwargs)


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (_dbapi(sa_exc.OperationalError, sqlite3.OperationalError("database is locked")), True),
        (
            _dbapi(sa_exc.OperationalError, sqlite3.OperationalError("database table is locked")),
            True,
        ),
        (_dbapi(sa_exc.OperationalError, sqlite3.OperationalError("no such table: x")), False),
        (_dbapi(sa_exc.OperationalError, psycopg.errors.DeadlockDetected("deadlock")), True),
        (_dbapi(sa_exc.OperationalError, psycopg.errors.SerializationFailure("retry")), True),
        (_dbapi(sa_exc.OperationalError, psycopg.errors.LockNotAvailable("lock")), True),
        (_dbapi(sa_exc.OperationalError, psycopg.errors.AdminShutdown("bye")), True),
        (
            _dbapi(
                sa_exc.OperationalError,
                psycopg.OperationalError("connection refused"),
                connection_invalidated=True,
            ),
            True,
        ),
        (_dbapi(sa_exc.OperationalError, psycopg.OperationalError("could not connect")), True),
        (_dbapi(sa_exc.IntegrityError, psycopg.errors.UniqueViolation("dup")), False),
        (_dbapi(sa_exc.ProgrammingError, psycopg.errors.UndefinedTable("missing")), False),
        # The message list applies to operational errors only.
        (_dbapi(sa_exc.ProgrammingError, sqlite3.ProgrammingError("database is locked")), False),
        (sa_exc.DisconnectionError("gone"), True),
        (sa_exc.TimeoutError("pool exhausted"), True),
        (ValueError("database is locked"), False),
        (dg.Failure("lost"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_transient_database_errors_are_recognised(error, transient):
    assert is_transient_database_error(error) is transient


def test_the_guard_reraises_transient_errors_and_failures_unchanged():
    transient = _transient_error()
    with pytest.raises(sa_exc.OperationalError) as raised, retry_transient_errors_only():
        raise transient
    assert raised.value is transient

    failure = dg.Failure("already classified", allow_retries=True)
    with pytest.raises(dg.Failure) as raised_failure, retry_transient_errors_only():
        raise failure
    assert raised_failure.value is failure and failure.allow_retries is True


def test_the_guard_turns_everything_else_into_a_final_failure():
    permanent = _dbapi(sa_exc.IntegrityError, sqlite3.IntegrityError("UNIQUE failed"))
    with pytest.raises(dg.Failure) as raised, retry_transient_errors_only():
        raise permanent
    assert raised.value.allow_retries is False
    assert raised.value.__cause__ is permanent
    assert raised.value.description.startswith("IntegrityError: ")

    with pytest.raises(dg.Failure) as raised, retry_transient_errors_only():
        raise KeyError("missing")
    assert raised.value.allow_retries is False
    assert raised.value.description == "KeyError: 'missing'"


def test_sensors_run_unless_an_operator_stops_automation(monkeypatch):
    monkeypatch.delenv("MEDIA_USAGE_AUTOMATION", raising=False)
    assert default_status.automation_default_status() is dg.DefaultSensorStatus.RUNNING
    monkeypatch.setenv("MEDIA_USAGE_AUTOMATION", " Stopped ")
    assert default_status.automation_default_status() is dg.DefaultSensorStatus.STOPPED
    assert default_status.automation_default_schedule_status() is dg.DefaultScheduleStatus.STOPPED
