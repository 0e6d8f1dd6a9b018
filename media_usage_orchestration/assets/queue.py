"""The work queue in the UI: one observable asset `media_usage_queue/<slug>` per live
collection, beside its coverage history asset, and the check `queue_healthy` on each.

No run observes them: the queue sensor (`sensors/queue.py`) reads every live collection's queue
(`store/reads/queue.py`) and reports an observation for each collection whose state changed, and every
5 minutes for each whose numbers moved or that has due work, and a check evaluation whenever a
verdict changes. One unpartitioned asset per
collection, as for the coverage history: Dagster 1.13 plots an asset's numeric metadata over
time on its own Plots view, and the check needs no partition (a partitioned check is still a
preview feature).

The assets are declared for the collections that have a coverage history asset
(`coverage_history.py`): the registry is read once per code-location load, and run workers
rebuild both from the slugs that load stored. A collection created since the load is observed
all the same; its asset joins the definitions at the next load ("Reload definitions").
"""

from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import dagster as dg

from media_usage_orchestration.assets.coverage_history import COVERAGE_HISTORY_GROUP
from media_usage_orchestration.assets.health import (
    QUEUE_CHECK,
    WORK_JOB,
    collection_check_specs,
    missing_collection,
    observable_collection_assets,
    queue_verdict,
    run_alive,
    tag_check_run,
    work_runs_alive,
)
from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_TAG, COUNT_TAGS
from media_usage_orchestration.resources.automation import MediaUsageAutomation
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.reads.queue import (
    COUNT_LIMIT,
    MAX_QUEUE_COLLECTIONS,
    WorkQueue,
    read_work_queues,
)

QUEUE_GROUP = "media_usage_queue"
COMPLETED_WINDOW_SECONDS = 300
COMPLETED_METADATA = "completed_last_5_minutes"
# The Launchpad config of `retry_media_usage_work` (`jobs.py`, op `ops/operator.py:
# reopen_failed_work`, config `RetryFailedWorkConfig`) that reopens one entry's work.
RETRY_JOB = "retry_media_usage_work"
RETRY_OP = "reopen_failed_work"


def queue_key(slug: str) -> dg.AssetKey:
    return dg.AssetKey([QUEUE_GROUP, slug])


def queue_specs(slugs: Sequence[str]) -> list[dg.AssetSpec]:
    return [
        dg.AssetSpec(
            queue_key(slug),
            group_name=QUEUE_GROUP,
            kinds={"sql"},
            description=f"The work queue of the collection {slug!r}, observed by the sensor "
            "media_usage_queue_sensor when its state changes and every 5 minutes while its "
            "numbers move or work is due (no run): due, backing_off, leased, stuck and failed "
            "items, lag_seconds (how long the first due item has waited, database time) and "
            "completed_last_5_minutes; the newest failed items with the Launchpad config that "
            f"retries each. Counts stop at {COUNT_LIMIT:,} rows of a state (inexact_counts "
            "names them).",
        )
        for slug in slugs
    ]


def queue_check_specs(slugs: Sequence[str]) -> list[dg.AssetCheckSpec]:
    return collection_check_specs(
        QUEUE_CHECK,
        [queue_key(slug) for slug in slugs],
        "Fails (ERROR) while any work item of the collection failed for good or is stuck behind "
        "an expired lease, while due work has waited longer than queue_stall_seconds, or longer "
        "than 30 s with no work run of the collection alive. The queue sensor evaluates it "
        "whenever its verdict changes; executing it here reads the database now.",
    )


def queue_slugs(definitions: dg.Definitions) -> list[str]:
    """The collections `definitions` declares a coverage history asset for."""
    keys = [
        key
        for asset in definitions.assets or ()
        for key in ([asset.key] if isinstance(asset, dg.AssetSpec) else asset.keys)
    ]
    return sorted(key.path[1] for key in keys if key.path[0] == COVERAGE_HISTORY_GROUP)


def with_queue_assets(base: dg.Definitions) -> dg.Definitions:
    """`base` with a queue asset and its check beside each coverage history asset."""
    slugs = queue_slugs(base)
    if not slugs:
        return base
    return dg.Definitions.merge(base, dg.Definitions(assets=[queue_assets(slugs)]))


def queue_assets(slugs: Sequence[str]) -> dg.AssetsDefinition:
    """The collections' queue assets as observable sources (the UI shows when each was last
    observed, and "Observe" reads the queues now), with their checks."""
    return observable_collection_assets(
        "media_usage_queues", queue_specs(slugs), queue_check_specs(slugs), _observe_queues_now
    )


def _observe_queues_now(
    context: dg.AssetExecutionContext,
    database: MediaUsageDatabase,
    automation: MediaUsageAutomation,
) -> Iterator[dg.ObserveResult | dg.AssetCheckResult]:
    engine = database.engine
    queues = {queue.collection_slug: queue for queue in read_work_queues(engine).queues}
    alive = work_runs_alive(context.instance, engine)
    completed = completed_by_collection(context.instance)
    keys = sorted(context.selected_asset_check_keys, key=str)
    assets = sorted(context.selected_asset_keys, key=str)
    tag_check_run(context, [*keys, *(dg.AssetCheckKey(key, QUEUE_CHECK) for key in assets)])
    for key in assets:
        if (queue := queues.get(key.path[1])) is not None:
            observation = queue_observation(queue, completed[queue.collection_slug])
            yield dg.ObserveResult(asset_key=key, metadata=observation.metadata)
    for key in keys:
        slug = key.asset_key.path[1]
        queue = queues.get(slug)
        if queue is None:
            yield missing_collection(
                f"{slug!r} is not a live collection (or not among the first "
                f"{MAX_QUEUE_COLLECTIONS} by slug, whose queues are read)"
            ).result(key)
            continue
        verdict = queue_verdict(queue, run_alive(alive, slug), automation.queue_stall_seconds)
        yield verdict.result(key)


# Work runs end a few a minute per collection; more than this in 5 minutes are not counted.
MAX_RECENT_WORK_RUNS = 1000


def completed_by_collection(instance: dg.DagsterInstance) -> Counter[str]:
    """Items each collection's work runs completed, over the runs last updated in the last 5
    minutes: their completed-count tag is written as the run's final word, just before it
    ends. (Run records would give the end time, but read the run table's columns on every
    call.)"""
    since = datetime.now(UTC) - timedelta(seconds=COMPLETED_WINDOW_SECONDS)
    runs = instance.get_runs(
        filters=dg.RunsFilter(job_name=WORK_JOB, updated_after=since),
        limit=MAX_RECENT_WORK_RUNS,
    )
    completed: Counter[str] = Counter()
    for run in runs:
        slug, count = run.tags.get(COLLECTION_TAG), run.tags.get(COUNT_TAGS["completed"], "")
        if slug and count.isdigit():
            completed[slug] += int(count)
    return completed


# --- the sensor's events ------------------------------------------------------------------------


def queue_observation(queue: WorkQueue, completed: int) -> dg.AssetObservation:
    metadata: dict[str, dg.MetadataValue] = {
        name: dg.MetadataValue.int(value) for name, value in queue.counts().items()
    }
    metadata["lag_seconds"] = dg.MetadataValue.float(queue.lag_seconds)
    metadata[COMPLETED_METADATA] = dg.MetadataValue.int(completed)
    metadata["failed_items"] = dg.MetadataValue.md(failed_items_markdown(queue))
    metadata["inexact_counts"] = dg.MetadataValue.text(", ".join(queue.inexact) or "-")
    metadata["collection_id"] = dg.MetadataValue.text(queue.collection_id)
    return dg.AssetObservation(asset_key=queue_key(queue.collection_slug), metadata=metadata)


# --- the failed items' table --------------------------------------------------------------------


def failed_items_markdown(queue: WorkQueue) -> str:
    """The newest failed items, one row each, with the run config (YAML, one line) that
    retries the item from the Launchpad of `retry_media_usage_work`."""
    if not queue.failed_items:
        return "No failed work."
    lines = [
        "An edit that fixes an entry's content re-queues its work by itself. Retry an item here "
        "only when it failed for a reason outside its content (a database or resource error "
        "since fixed): a retry of unchanged content fails the same way.",
        "",
        f"| content id | error code | attempts | last attempt | `{RETRY_JOB}` run config |",
        "| --- | --- | --- | --- | --- |",
    ]
    for item in queue.failed_items:
        config = retry_run_config(queue.collection_slug, item.content_id)
        cells = (
            _code(item.content_id),
            _code(item.last_error_code or "-"),
            str(item.attempt_count),
            _code(item.last_attempted_at or "-"),
            _code(config),
        )
        lines.append("| " + " | ".join(cells) + " |")
    if queue.failed > len(queue.failed_items):
        lines.append("")
        lines.append(
            f"The {len(queue.failed_items)} newest of {queue.failed} failed items; "
            f"`media-usage work list --collection {queue.collection_slug} --state failed` lists "
            "them all."
        )
    return "\n".join(lines)


def retry_run_config(slug: str, content_id: str) -> str:
    """YAML (one flow mapping) of the run config that retries one entry's work."""
    config = f"{{collection: {_yaml_quoted(slug)}, content_id: {_yaml_quoted(content_id)}}}"
    return f"ops: {{{RETRY_OP}: {{config: {config}}}}}"


def _yaml_quoted(text: str) -> str:
    """A YAML double-quoted scalar of exactly `text`: quote and backslash escaped, every
    character that is not printable as its escape (YAML readers refuse raw control
    characters, and a line break would end the table row)."""
    return '"' + "".join(_yaml_character(character) for character in text) + '"'


def _yaml_character(character: str) -> str:
    if character in '"\\':
        return "\\" + character
    if character.isprintable():
        return character
    code = ord(character)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )


def _code(text: str) -> str:
    """`text` as a Markdown code span inside a table cell: shown literally, a pipe escaped (the
    table reads it before the span), control characters as escapes."""
    visible = "".join(
        character if character.isprintable() else character.encode("unicode_escape").decode()
        for character in text
    ).replace("|", "\\|")
    fence = "`" * (_longest_backtick_run(visible) + 1)
    # A span's one leading and trailing space is not shown when it has both: padding keeps
    # a backtick apart from the fence, and a value's own outer spaces.
    ends = (visible[:1], visible[-1:])
    padded = "`" in ends or ends == (" ", " ")
    padding = " " if padded else ""
    return f"{fence}{padding}{visible}{padding}{fence}"


def _longest_backtick_run(text: str) -> int:
    longest = run = 0
    for character in text:
        run = run + 1 if character == "`" else 0
        longest = max(longest, run)
    return longest
