"""The alert sensor: one message to a webhook when a collection's check turns from passing to
failing, and one when it passes again; never one per tick.

It reads only the Dagster instance. The checks it watches are those the code location defines
under one of `ALERT_CHECKS`: `coverage_complete` of each collection's asset
`media_usage_coverage/<slug>` and `queue_healthy` of its asset `media_usage_queue/<slug>`, whose
latest evaluations the queue sensor keeps current (`assets/health.py`). For each it reads the
latest evaluation (of a partitioned check: per partition), in one query for all unpartitioned
checks and one per partitioned check. The collection is the partition, else the asset key's
last part.

The cursor holds what was announced as failing, so a restart announces nothing again; a check
first seen failing is announced, one first seen passing is not. A post the webhook did not take
(refused, timed out, an HTTP error) is not recorded, so the next tick posts it again; a tick
whose posts were all refused fails, so the tick history shows the failed delivery. The URL may
carry a secret token: it appears in no reason, log line or cursor.
"""

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import dagster as dg

from media_usage_orchestration.assets.health import COVERAGE_CHECK, QUEUE_CHECK
from media_usage_orchestration.dagster_kit.dagster_internals import (
    COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES,
    AssetCheckExecutionRecordStatus,
    PartitionKeyFilter,
)
from media_usage_orchestration.dagster_kit.default_status import automation_default_status
from media_usage_orchestration.values.errors import AlertNotDelivered

ALERT_WEBHOOK_ENV = "MEDIA_USAGE_ALERT_WEBHOOK_URL"
WEBHOOK = f"the webhook at {ALERT_WEBHOOK_ENV}"
ALERT_CHECKS = (COVERAGE_CHECK, QUEUE_CHECK)
WEBHOOK_TIMEOUT_SECONDS = 5.0
# A tick must end well inside the 60 s sensor budget even when every post is slow.
MAX_ANNOUNCEMENTS_PER_TICK = 8
MAX_DESCRIPTION_CHARS = 500
# What to do, per check; `{slug}` is the collection.
CHECK_ADVICE = {
    COVERAGE_CHECK: "`media-usage status` shows its coverage and work. Failed work: an edit that "
    "fixes the content re-queues its entry by itself; retry only what failed for reasons outside "
    "the content (`media-usage work retry --collection {slug} --all-failed`). A failed "
    "reconciliation: `media-usage reconciliations retry --collection {slug}` once the cause is "
    "fixed",
    QUEUE_CHECK: "`media-usage work list --collection {slug}` lists its queued work; a stalled "
    "queue with no work run alive needs the daemon, the work sensor and the code server running",
}
DEFAULT_ADVICE = "the check's latest evaluation (description and metadata) says why"


@dataclass(frozen=True)
class CheckTarget:
    """One check of one collection: its asset, its name and, when partitioned, the partition."""

    asset_key: str  # AssetKey.to_user_string()
    check_name: str
    partition: str | None = None

    @property
    def check_key(self) -> dg.AssetCheckKey:
        return dg.AssetCheckKey(dg.AssetKey.from_user_string(self.asset_key), self.check_name)

    @property
    def collection(self) -> str:
        """The slug: the partition (of `media_usage_index`), else the asset key's last part
        (`media_usage_queue/<slug>`)."""
        return self.partition or self.asset_key.rsplit("/", 1)[-1]

    @property
    def where(self) -> str:
        partition = f", partition {self.partition}" if self.partition is not None else ""
        return f"asset {self.asset_key}, Checks tab, check {self.check_name}{partition}"

    def sort_key(self) -> tuple[str, str, str]:
        return (self.collection, self.check_name, self.asset_key)


@dataclass(frozen=True)
class Announcement:
    target: CheckTarget
    failing: bool
    text: str

    @property
    def summary(self) -> str:
        state = "failing" if self.failing else "passing again"
        return f"{self.target.collection} {self.target.check_name} {state}"


# --- the cursor: what was announced as failing ---------------------------------------------------


def announced_failing(cursor: str | None) -> set[CheckTarget]:
    """The targets the cursor says were announced as failing; none for a cursor that is not
    this sensor's (reset or edited: the checks failing now are then announced once more)."""
    try:
        entries = json.loads(cursor)["failing"] if cursor else []
        return {
            CheckTarget(str(asset), str(check), partition) for asset, check, partition in entries
        }
    except (ValueError, KeyError, TypeError):
        return set()


def encode_cursor(failing: Iterable[CheckTarget]) -> str:
    entries = [
        [t.asset_key, t.check_name, t.partition] for t in sorted(failing, key=CheckTarget.sort_key)
    ]
    return json.dumps({"failing": entries}, separators=(",", ":"))


# --- reading the checks from the instance --------------------------------------------------------


def alert_checks(
    repository: dg.RepositoryDefinition,
) -> dict[dg.AssetCheckKey, dg.PartitionsDefinition | None]:
    """The defined checks named in ALERT_CHECKS, with their partitions definitions."""
    graph = repository.asset_graph
    return {
        key: graph.get(key).partitions_def
        for key in graph.asset_check_keys
        if key.name in ALERT_CHECKS
    }


def latest_verdicts(
    instance: dg.DagsterInstance,
    checks: Mapping[dg.AssetCheckKey, dg.PartitionsDefinition | None],
) -> dict[CheckTarget, bool | None]:
    """Per watched target (a partition that still exists, or an unpartitioned check) whether its
    latest evaluation passed; None while it was only ever planned, never evaluated."""
    storage = instance.event_log_storage
    statuses = _latest_statuses(instance, checks)
    verdicts: dict[CheckTarget, bool | None] = {}
    for target, status in statuses.items():
        if status is AssetCheckExecutionRecordStatus.PLANNED:
            # Being evaluated now (or its run died): the evaluation before it still holds.
            evaluation = latest_evaluation(storage, target)
            verdicts[target] = None if evaluation is None else evaluation.passed
        else:
            verdicts[target] = status is AssetCheckExecutionRecordStatus.SUCCEEDED
    return verdicts


def _latest_statuses(
    instance: dg.DagsterInstance,
    checks: Mapping[dg.AssetCheckKey, dg.PartitionsDefinition | None],
) -> dict[CheckTarget, AssetCheckExecutionRecordStatus]:
    storage = instance.event_log_storage
    partitioned = {key: p for key, p in checks.items() if p is not None}
    unpartitioned = [key for key, p in checks.items() if p is None]
    statuses = {}
    if partitioned:
        live = _live_partitions(instance, partitioned.values())
        for info in storage.get_asset_check_partition_info(list(partitioned)):
            # A deleted collection's partition is gone; its evaluations stay in storage.
            if info.partition_key in live[partitioned[info.check_key]]:
                target = _target(info.check_key, info.partition_key)
                statuses[target] = info.latest_execution_status
    if unpartitioned:
        records = storage.get_latest_asset_check_execution_by_key(unpartitioned)
        for key in unpartitioned:
            if (record := records.get(key)) is not None:
                statuses[_target(key, None)] = record.status
    return statuses


def _live_partitions(
    instance: dg.DagsterInstance, definitions: Iterable[dg.PartitionsDefinition]
) -> dict[dg.PartitionsDefinition, set[str]]:
    return {
        definition: set(definition.get_partition_keys(dynamic_partitions_store=instance))
        for definition in set(definitions)
    }


def _target(key: dg.AssetCheckKey, partition: str | None) -> CheckTarget:
    return CheckTarget(key.asset_key.to_user_string(), key.name, partition)


def latest_evaluation(storage, target: CheckTarget) -> dg.AssetCheckEvaluation | None:
    """The target's latest completed evaluation (a planned one has no verdict yet)."""
    records = storage.get_asset_check_execution_history(
        target.check_key,
        limit=1,
        status=COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES,
        partition_filter=PartitionKeyFilter(key=target.partition),
    )
    return records[0].evaluation if records else None


def changes(
    verdicts: Mapping[CheckTarget, bool | None], failing: set[CheckTarget]
) -> list[tuple[CheckTarget, bool]]:
    """(target, now failing) for each target whose verdict differs from what was announced."""
    turned = [(t, True) for t, passed in verdicts.items() if passed is False and t not in failing]
    recovered = [(t, False) for t in failing if verdicts.get(t) is True]
    return sorted(turned + recovered, key=lambda change: change[0].sort_key())


# --- the message ---------------------------------------------------------------------------------


def announcement(target: CheckTarget, evaluation: dg.AssetCheckEvaluation) -> Announcement:
    """Slack's message text for the evaluation: the collection, the check, what it says, what
    to do and where to look."""
    slug, check = target.collection, target.check_name
    description = _shortened(evaluation.description or "no description")
    if evaluation.passed:
        text = (
            f"Media usage OK: collection `{slug}` passes its check `{check}` again: "
            f"{description}. Dagster UI: {target.where}."
        )
    else:
        advice = CHECK_ADVICE.get(check, DEFAULT_ADVICE).format(slug=slug)
        text = (
            f"Media usage {evaluation.severity.value}: collection `{slug}` fails its check "
            f"`{check}`: {description}. What to do: {advice}. Where to look: the Dagster UI, "
            f"{target.where}."
        )
    return Announcement(target, not evaluation.passed, _slack_escaped(text))


def _shortened(text: str) -> str:
    text = " ".join(text.split()).rstrip(".")
    if len(text) <= MAX_DESCRIPTION_CHARS:
        return text
    return text[: MAX_DESCRIPTION_CHARS - 1] + "…"


def _slack_escaped(text: str) -> str:
    # Slack reads <...> as links and mentions; descriptions are shown as written.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# --- delivery ------------------------------------------------------------------------------------


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        # urllib would follow with a GET without the message and count it as delivered.
        return None


_opener = urllib.request.build_opener(_RefuseRedirects)


def is_http_url(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def post_message(url: str, text: str) -> str | None:
    """POST `{"text": text}` as JSON; None once the webhook answered 2xx, else why not (in
    words that never carry the URL: urllib's own messages may quote it)."""
    try:
        request = urllib.request.Request(
            url,
            data=json.dumps({"text": text}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with _opener.open(request, timeout=WEBHOOK_TIMEOUT_SECONDS) as response:
            status = response.status
    except Exception as error:  # whatever the webhook does, the tick goes on
        return _undelivered(error).replace(url, ALERT_WEBHOOK_ENV)
    return None if 200 <= status < 300 else f"answered HTTP {status}"


def _undelivered(error: BaseException) -> str:
    if isinstance(error, urllib.error.HTTPError):
        return f"answered HTTP {error.code}"
    if isinstance(error, urllib.error.URLError) and isinstance(error.reason, BaseException):
        error = error.reason
    if isinstance(error, TimeoutError):
        return f"did not answer within {WEBHOOK_TIMEOUT_SECONDS:g} s"
    if isinstance(error, ConnectionRefusedError):
        return "refused the connection"
    if isinstance(error, OSError) and error.strerror:
        return f"could not be reached ({error.strerror})"
    return f"could not be reached ({type(error).__name__})"


# --- the sensor ----------------------------------------------------------------------------------

# A tick only reads the checks' latest evaluations (and posts what changed), so it can come
# often: from a check's change to the post, at most this plus the daemon's loop.
ALERT_SENSOR_INTERVAL_SECONDS = 10


@dg.sensor(
    minimum_interval_seconds=ALERT_SENSOR_INTERVAL_SECONDS,
    default_status=automation_default_status(),
    description="Posts one message to the webhook at MEDIA_USAGE_ALERT_WEBHOOK_URL (Slack's "
    "incoming-webhook JSON, a `text` field) when a collection's coverage_complete or "
    "queue_healthy check turns from passing to failing, and one when it passes again; a post "
    "the webhook did not take is retried on the next tick. Launches no runs.",
)
def media_usage_alert_sensor(context: dg.SensorEvaluationContext):
    url = os.environ.get(ALERT_WEBHOOK_ENV, "").strip()
    if not url:
        return dg.SkipReason(
            f"no alerts sent: set {ALERT_WEBHOOK_ENV} to a webhook URL (e.g. a Slack incoming "
            "webhook) to announce checks that fail and recover"
        )
    if not is_http_url(url):
        return dg.SkipReason(f"no alerts sent: {ALERT_WEBHOOK_ENV} is not an http(s) URL")
    if context.repository_def is None:  # only a context built without definitions
        return dg.SkipReason("no alerts sent: the sensor was evaluated without its definitions")
    verdicts = latest_verdicts(context.instance, alert_checks(context.repository_def))
    # What is no longer watched (a deleted collection) is forgotten.
    failing = announced_failing(context.cursor) & verdicts.keys()
    found = changes(verdicts, failing)
    if not found:
        return dg.SensorResult(
            skip_reason=f"no check turned failing or passing ({len(failing)} failing, announced)",
            cursor=encode_cursor(failing),
        )
    messages = _announcements(context.instance, found[:MAX_ANNOUNCEMENTS_PER_TICK])
    delivered, why = _deliver(context, url, messages)
    if why is not None and not delivered:
        # Nothing was sent, so the cursor has nothing to keep: a failed tick, visible as such
        # in the tick history (a skipped one looks like any quiet tick).
        raise AlertNotDelivered(_tick_reason(delivered, len(found), why))
    for sent in delivered:
        if sent.failing:
            failing.add(sent.target)
        else:
            failing.discard(sent.target)
    return dg.SensorResult(
        skip_reason=_tick_reason(delivered, len(found) - len(delivered), why),
        cursor=encode_cursor(failing),
    )


def _announcements(
    instance: dg.DagsterInstance, found: Sequence[tuple[CheckTarget, bool]]
) -> list[Announcement]:
    """Every message to send, written before the first post: a tick that fails after a post
    loses its cursor, and the post would be sent twice."""
    messages = []
    for target, failing in found:
        evaluation = latest_evaluation(instance.event_log_storage, target)
        # Evaluated again since the verdict was read: the next tick reads the new one.
        if evaluation is not None and evaluation.passed is not failing:
            messages.append(announcement(target, evaluation))
    return messages


def _deliver(
    context: dg.SensorEvaluationContext, url: str, messages: Sequence[Announcement]
) -> tuple[list[Announcement], str | None]:
    """Post each message in turn; the first failure ends the tick's posts (the rest wait)."""
    delivered = []
    for message in messages:
        why = post_message(url, message.text)
        if why is not None:
            context.log.warning(f"alert not delivered: {WEBHOOK} {why}; retried next tick")
            return delivered, why
        context.log.info(f"alert delivered to {WEBHOOK}: {message.summary}")
        delivered.append(message)
    return delivered, None


def _tick_reason(delivered: Sequence[Announcement], waiting: int, why: str | None) -> str:
    parts = []
    if delivered:
        sent = "; ".join(message.summary for message in delivered)
        parts.append(f"announced {len(delivered)} change(s) to {WEBHOOK}: {sent}")
    if why is not None:
        parts.append(f"delivery failed: {WEBHOOK} {why}")
    if waiting:
        parts.append(f"{waiting} announcement(s) wait for the next tick")
    return "; ".join(parts)
