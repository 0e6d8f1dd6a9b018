"""The alert sensor against a real HTTP receiver on 127.0.0.1: one post when a collection's
check turns failing, none on the ticks after, one when it recovers; a post the webhook did not
take (HTTP 500, a redirect, a closed port, no answer) is retried on a later tick; without the
variable the sensor skips saying which to set; the webhook's URL (its secret token) appears in
no tick reason, log line or cursor.

Both checks are covered: `coverage_complete` on per-collection `media_usage_coverage/<slug>`
assets and `queue_healthy` on `media_usage_queue/<slug>` assets, declared here as the code
location declares them, evaluated runless as the queue sensor evaluates them.

The sensor reads only the Dagster instance, never the project's database, so these tests run
once, on the `instance` fixture (Dagster's ephemeral instance). The tests that execute the real
`coverage_complete` check need a project database for it and run on both dialects.
"""

import contextlib
import datetime
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import TickStatus
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.test_utils import freeze_time
from dagster._daemon.sensor import execute_sensor_iteration

from media_usage_orchestration.assets.coverage_history import (
    coverage_assets,
    coverage_history_key,
)
from media_usage_orchestration.assets.health import COVERAGE_CHECK, QUEUE_CHECK
from media_usage_orchestration.dagster_kit.default_status import AUTOMATION_ENV
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors import alerts
from media_usage_orchestration.sensors.alerts import ALERT_WEBHOOK_ENV, media_usage_alert_sensor
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV
from media_usage_orchestration.values.errors import AlertNotDelivered
from tests.support.reconciliation_runs import daemon_workspace, remote_repository
from tests.support.sensor_loop import resources
from tests.support.states import make_collection
from tests.support.webhook import SECRET, Receiver, receiving

SLUGS = ("blog", "news")


def _queue_key(slug: str) -> dg.AssetKey:
    return dg.AssetKey(["media_usage_queue", slug])


def _stub_check(asset_key: dg.AssetKey, name: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=asset_key, name=name)
    def check() -> dg.AssetCheckResult:
        return dg.AssetCheckResult(passed=True)

    return check


def definitions(slugs=SLUGS) -> dg.Definitions:
    """The project's definitions with the per-collection assets and their checks (`ghost`'s
    coverage check the real one, executed by the tests that need it)."""
    keys = [(_queue_key(slug), QUEUE_CHECK) for slug in slugs]
    keys += [(coverage_history_key(slug), COVERAGE_CHECK) for slug in slugs]
    ghost = coverage_history_key("ghost")
    return dg.Definitions.merge(
        defs,
        dg.Definitions(
            assets=[dg.AssetSpec(key) for key, _ in keys] + coverage_assets(["ghost"]),
            asset_checks=[_stub_check(key, name) for key, name in keys],
            jobs=[
                dg.define_asset_job(
                    "check_ghost",
                    selection=dg.AssetSelection.checks(dg.AssetCheckKey(ghost, COVERAGE_CHECK)),
                )
            ],
        ),
    )


DEFINITIONS = definitions()


@dataclass(frozen=True)
class Check:
    """How a test records one collection's check: its asset key and partition."""

    name: str

    def asset_key(self, slug: str) -> dg.AssetKey:
        return coverage_history_key(slug) if self.name == COVERAGE_CHECK else _queue_key(slug)

    def partition(self, slug: str) -> str | None:
        return None

    def record(self, instance: dg.DagsterInstance, slug: str, passed: bool, why: str = "") -> None:
        """Evaluated runless, as the queue sensor evaluates both checks."""
        instance.report_runless_asset_event(
            dg.AssetCheckEvaluation(
                asset_key=self.asset_key(slug),
                check_name=self.name,
                passed=passed,
                severity=dg.AssetCheckSeverity.ERROR,
                description=why or ("all good" if passed else f"{slug} is broken"),
            )
        )


COVERAGE, QUEUE = Check(COVERAGE_CHECK), Check(QUEUE_CHECK)
CHECKS = pytest.mark.parametrize("check", [COVERAGE, QUEUE], ids=lambda check: check.name)


# --- the receiver --------------------------------------------------------------------------------


@pytest.fixture
def receiver(webhook_env) -> Iterator[Receiver]:
    with receiving() as receiver:
        webhook_env.setenv(ALERT_WEBHOOK_ENV, receiver.url)
        yield receiver


@pytest.fixture
def collections(instance) -> dg.DagsterInstance:
    return instance


@pytest.fixture
def logs(caplog) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


def tick(
    instance: dg.DagsterInstance,
    cursor: str | None = None,
    logs: pytest.LogCaptureFixture | None = None,
    loaded: dg.Definitions = DEFINITIONS,
):
    """One evaluation, as the daemon runs it: the sensor's cursor in, the tick's data out.
    With `logs`, they capture every line the sensor logs (its logger is its own, not one of
    the logging module's, so pytest does not see it otherwise)."""
    with dg.build_sensor_context(instance=instance, cursor=cursor, definitions=loaded) as context:
        if logs is not None:
            context.log.addHandler(logs.handler)
        data = media_usage_alert_sensor.evaluate_tick(context)
    assert not data.run_requests
    return data


def failed_tick(
    instance: dg.DagsterInstance,
    cursor: str | None = None,
    logs: pytest.LogCaptureFixture | None = None,
) -> str:
    """A tick that delivered nothing: it fails (a FAILURE tick in the history), saying why;
    the message."""
    with pytest.raises(AlertNotDelivered) as raised:
        tick(instance, cursor, logs)
    return str(raised.value)


def _announced(cursor: str | None) -> set[tuple]:
    return {(t.asset_key, t.check_name, t.partition) for t in alerts.announced_failing(cursor)}


def assert_secret_absent(data, logs: pytest.LogCaptureFixture) -> None:
    assert SECRET not in (data.skip_message or "")
    assert SECRET not in (data.cursor or "")
    assert SECRET not in logs.text


# --- announcements -------------------------------------------------------------------------------


@CHECKS
def test_one_post_when_a_check_turns_failing_and_one_when_it_recovers(collections, receiver, check):
    instance = collections
    check.record(instance, "blog", passed=True)
    first = tick(instance)
    assert receiver.requests == []  # a check first seen passing is not announced
    assert _announced(first.cursor) == set()

    check.record(instance, "blog", passed=False, why="3 failed work item(s)")
    failed = tick(instance, first.cursor)
    [request] = receiver.requests
    assert (request["method"], request["content_type"]) == ("POST", "application/json")
    assert list(request["body"]) == ["text"]
    text = request["body"]["text"]
    assert "collection `blog` fails its check" in text and f"`{check.name}`" in text
    assert "3 failed work item(s)" in text
    assert "What to do:" in text and "Where to look: the Dagster UI" in text
    assert check.asset_key("blog").to_user_string() in text
    key = (check.asset_key("blog").to_user_string(), check.name, check.partition("blog"))
    assert _announced(failed.cursor) == {key}
    assert "announced 1 change(s) to the webhook at MEDIA_USAGE_ALERT_WEBHOOK_URL" in (
        failed.skip_message
    )

    # Still failing, evaluated again, and a restart (the cursor is all that survives): silence.
    check.record(instance, "blog", passed=False)
    again = tick(instance, failed.cursor)
    restarted = tick(instance, again.cursor)
    assert len(receiver.requests) == 1
    assert restarted.cursor == failed.cursor
    assert "no check turned failing or passing (1 failing, announced)" in restarted.skip_message

    check.record(instance, "blog", passed=True)
    recovered = tick(instance, restarted.cursor)
    assert len(receiver.requests) == 2
    assert "collection `blog` passes its check" in receiver.texts[1]
    assert f"`{check.name}` again" in receiver.texts[1]
    assert _announced(recovered.cursor) == set()

    tick(instance, recovered.cursor)
    assert len(receiver.requests) == 2


def test_checks_first_seen_failing_are_announced_each_once(collections, receiver):
    COVERAGE.record(collections, "blog", passed=False)
    QUEUE.record(collections, "news", passed=False)
    QUEUE.record(collections, "blog", passed=True)

    data = tick(collections)

    assert len(receiver.requests) == 2
    assert "collection `blog` fails its check `coverage_complete`" in receiver.texts[0]
    assert "collection `news` fails its check `queue_healthy`" in receiver.texts[1]
    assert "media-usage work retry --collection blog --all-failed" in receiver.texts[0]
    assert "asset media_usage_coverage/blog, Checks tab" in receiver.texts[0]
    assert _announced(data.cursor) == {
        ("media_usage_coverage/blog", COVERAGE_CHECK, None),
        ("media_usage_queue/news", QUEUE_CHECK, None),
    }
    tick(collections, data.cursor)
    assert len(receiver.requests) == 2


def test_an_executed_coverage_checks_failing_evaluation_is_announced(db, collections, receiver):
    # `ghost` has an asset but no registry collection: the check fails saying so.
    run = DEFINITIONS.resolve_job_def("check_ghost").execute_in_process(
        instance=collections, resources=resources(db)
    )
    assert run.success

    data = tick(collections)

    [text] = receiver.texts
    assert "Media usage ERROR: collection `ghost` fails its check `coverage_complete`" in text
    assert "no registry collection 'ghost'" in text
    assert _announced(data.cursor) == {("media_usage_coverage/ghost", COVERAGE_CHECK, None)}


def test_a_check_being_evaluated_keeps_the_verdict_before_it(collections, receiver, tmp_path):
    COVERAGE.record(collections, "ghost", passed=False)
    # A check run that dies before evaluating (no schema here) leaves its execution planned.
    broken = {"database": MediaUsageDatabase.for_url(f"sqlite:///{tmp_path / 'none.db'}")}
    run = DEFINITIONS.resolve_job_def("check_ghost").execute_in_process(
        instance=collections, resources=broken, raise_on_error=False
    )
    assert not run.success
    key = dg.AssetCheckKey(coverage_history_key("ghost"), COVERAGE_CHECK)
    latest = collections.get_latest_asset_check_evaluation_record(key)
    assert latest.status is AssetCheckExecutionRecordStatus.PLANNED

    data = tick(collections)  # the failing evaluation before the planned one is still announced
    assert len(receiver.requests) == 1
    assert "collection `ghost` fails" in receiver.texts[0]
    tick(collections, data.cursor)
    assert len(receiver.requests) == 1


def test_a_deleted_collection_is_forgotten(collections, receiver):
    COVERAGE.record(collections, "blog", passed=False)
    announced = tick(collections)
    assert _announced(announced.cursor) == {("media_usage_coverage/blog", COVERAGE_CHECK, None)}

    # Deleted: the code location reloads without its assets and checks.
    data = tick(collections, announced.cursor, loaded=definitions(["news"]))

    assert len(receiver.requests) == 1
    assert _announced(data.cursor) == set()


def test_a_tick_posts_at_most_its_share_and_leaves_the_rest_to_the_next(
    collections, receiver, monkeypatch
):
    monkeypatch.setattr(alerts, "MAX_ANNOUNCEMENTS_PER_TICK", 1)
    for slug in SLUGS:
        QUEUE.record(collections, slug, passed=False)

    first = tick(collections)
    assert len(receiver.requests) == 1
    assert "1 announcement(s) wait for the next tick" in first.skip_message
    second = tick(collections, first.cursor)
    third = tick(collections, second.cursor)

    assert [text.split("`")[1] for text in receiver.texts] == ["blog", "news"]
    assert len(_announced(third.cursor)) == 2


# --- failed deliveries ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 302])
def test_a_post_the_webhook_refused_is_retried_on_the_next_tick(
    collections, receiver, status, logs
):
    QUEUE.record(collections, "blog", passed=False)
    receiver.status = status

    refused = failed_tick(collections, logs=logs)

    assert [r["method"] for r in receiver.requests] == ["POST"]  # a redirect is not followed
    assert refused == (
        f"delivery failed: the webhook at MEDIA_USAGE_ALERT_WEBHOOK_URL answered HTTP {status}; "
        "1 announcement(s) wait for the next tick"
    )
    assert "alert not delivered" in logs.text
    assert SECRET not in refused and SECRET not in logs.text

    receiver.status = 200
    delivered = tick(collections, None, logs)  # the failed tick kept no cursor
    assert len(receiver.requests) == 2 and receiver.texts[0] == receiver.texts[1]
    assert _announced(delivered.cursor) == {("media_usage_queue/blog", QUEUE_CHECK, None)}
    assert "alert delivered" in logs.text
    assert_secret_absent(delivered, logs)


@contextlib.contextmanager
def _closed_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
    yield port


@contextlib.contextmanager
def _silent_port() -> Iterator[int]:
    """A port whose listener never answers: the kernel completes the connection, nobody reads."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


@pytest.mark.parametrize(
    ("port", "why"),
    [
        (_closed_port, "refused the connection"),
        (_silent_port, "did not answer within 0.2 s"),
    ],
    ids=["closed", "silent"],
)
def test_an_unreachable_webhook_is_retried_and_the_tick_still_ends(
    collections, webhook_env, port, why, logs
):
    webhook_env.setattr(alerts, "WEBHOOK_TIMEOUT_SECONDS", 0.2)
    COVERAGE.record(collections, "blog", passed=False)
    with port() as number:
        webhook_env.setenv(ALERT_WEBHOOK_ENV, f"http://127.0.0.1:{number}/services/{SECRET}")
        unreachable = failed_tick(collections, logs=logs)

    assert unreachable == (
        f"delivery failed: the webhook at MEDIA_USAGE_ALERT_WEBHOOK_URL {why}; "
        "1 announcement(s) wait for the next tick"
    )
    assert f"alert not delivered: the webhook at MEDIA_USAGE_ALERT_WEBHOOK_URL {why}" in logs.text
    assert SECRET not in unreachable and SECRET not in logs.text

    with receiving() as receiver:
        webhook_env.setenv(ALERT_WEBHOOK_ENV, receiver.url)
        delivered = tick(collections, None)
    assert len(receiver.requests) == 1
    assert _announced(delivered.cursor) == {("media_usage_coverage/blog", COVERAGE_CHECK, None)}


# --- no webhook ----------------------------------------------------------------------------------


def test_without_the_variable_the_sensor_skips_saying_which_to_set(collections, webhook_env):
    webhook_env.delenv(ALERT_WEBHOOK_ENV, raising=False)
    COVERAGE.record(collections, "blog", passed=False)

    data = tick(collections, cursor="{}")

    assert f"set {ALERT_WEBHOOK_ENV} to a webhook URL" in data.skip_message
    assert data.cursor == "{}"  # nothing announced, so the failure is announced once it is set


@pytest.mark.parametrize("value", [f"ftp://example.com/{SECRET}", f"{SECRET}"])
def test_a_value_that_is_no_http_url_is_refused_without_showing_it(
    collections, webhook_env, value, logs
):
    webhook_env.setenv(ALERT_WEBHOOK_ENV, value)
    COVERAGE.record(collections, "blog", passed=False)

    data = tick(collections, logs=logs)

    assert data.skip_message == f"no alerts sent: {ALERT_WEBHOOK_ENV} is not an http(s) URL"
    assert_secret_absent(data, logs)


def test_an_unreadable_cursor_counts_as_nothing_announced(collections, receiver):
    COVERAGE.record(collections, "blog", passed=False)

    data = tick(collections, cursor="not json")

    assert len(receiver.requests) == 1
    assert _announced(data.cursor) == {("media_usage_coverage/blog", COVERAGE_CHECK, None)}


# --- a real daemon tick --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_daemon_tick_announces_once_and_the_daemon_keeps_the_cursor(db, webhook_env):
    """Through a gRPC code server and the sensor daemon's own iteration: the sensor gets its
    repository there, reads the variable in the code server, and the daemon stores the cursor."""
    # The location declares `blog`'s assets and checks from the registry as it loads.
    make_collection(db.engine, "blog")
    webhook_env.setenv(DATABASE_URL_ENV, db.url)
    # Only the alert sensor runs: the queue sensor would evaluate blog's checks itself.
    webhook_env.setenv(AUTOMATION_ENV, "stopped")
    with receiving() as receiver:
        webhook_env.setenv(ALERT_WEBHOOK_ENV, receiver.url)  # the code server reads it as it starts
        with dg.instance_for_test() as instance, daemon_workspace(instance) as workspace:
            sensor = remote_repository(workspace).get_sensor(media_usage_alert_sensor.name)
            instance.start_sensor(sensor)
            COVERAGE.record(instance, "blog", passed=False)
            now = datetime.datetime.now(datetime.UTC)
            ticks = []
            for _ in range(2):
                now += datetime.timedelta(seconds=31)
                with freeze_time(now):
                    list(
                        execute_sensor_iteration(
                            workspace,
                            logging.getLogger("sensor_daemon"),
                            threadpool_executor=None,
                            submit_threadpool_executor=None,
                        )
                    )
                [latest] = instance.get_ticks(
                    sensor.get_remote_origin_id(), sensor.selector_id, limit=1
                )
                ticks.append(latest)
            state = instance.get_instigator_state(sensor.get_remote_origin_id(), sensor.selector_id)

    assert len(receiver.requests) == 1
    assert "collection `blog` fails its check `coverage_complete`" in receiver.texts[0]
    assert [tick.status for tick in ticks] == [TickStatus.SKIPPED, TickStatus.SKIPPED]
    assert "announced 1 change(s)" in ticks[0].skip_reason
    assert "no check turned failing or passing (1 failing, announced)" in ticks[1].skip_reason
    assert _announced(state.instigator_data.cursor) == {
        ("media_usage_coverage/blog", COVERAGE_CHECK, None)
    }
