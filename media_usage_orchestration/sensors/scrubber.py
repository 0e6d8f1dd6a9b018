"""The scrubber sensor: the index checked against the content continuously, one bounded slice
per tick (`processing/integrity/scrub.py`), healing confirmed drift through the operator's work retry.

It launches no runs: what it finds is the `index_matches_content` check of the collection's
asset `media_usage_coverage/<slug>` (`assets/index_drift.py`), evaluated from the tick; the work it reopens is run by the
work sensor. Its cursor is the scrubber's position (JSON): the collection, the last entry
compared, when the sweep started, and the sweep's counts so far."""

import functools

import dagster as dg

from media_usage_orchestration.assets.coverage_history import coverage_history_key
from media_usage_orchestration.assets.index_drift import scrub_check_evaluation
from media_usage_orchestration.dagster_kit.default_status import automation_default_status
from media_usage_orchestration.processing.integrity.scrub import (
    ScrubLimits,
    ScrubPosition,
    ScrubTick,
    parse_position,
    scrub_tick,
)
from media_usage_orchestration.resources.automation import MediaUsageAutomation
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.common import probe_when_ready

SCRUB_INTERVAL_SECONDS = 30


def _summary(tick: ScrubTick) -> str:
    """The tick in one line for the tick history."""
    report = tick.slice
    if report is None:
        return f"scrubbed nothing: {tick.idle_reason}"
    position = tick.position
    found = f"{len(report.confirmed)} difference(s) confirmed" if report.confirmed else "no drift"
    where = "sweep finished" if tick.sweep else f"next after {position.after}"
    return (
        f"{report.collection.slug}: {report.entries_checked} of {report.entries_seen} entries "
        f"checked, {found}, {report.unconfirmed} not confirmed on re-read; {where} "
        f"(sweep so far: {position.entries_checked} checked, {position.differences} drift)"
    )


@dg.sensor(
    minimum_interval_seconds=SCRUB_INTERVAL_SECONDS,
    default_status=automation_default_status(),
    description="Compares the next slice of a complete collection's entries with their "
    "content each tick (scrub_slice_entries within scrub_slice_seconds), sweeping every "
    "collection in turn; confirmed drift fails the collection's index_matches_content check "
    "and has its work reopened. Launches no runs.",
)
def media_usage_scrubber_sensor(
    context: dg.SensorEvaluationContext,
    database: MediaUsageDatabase,
    automation: MediaUsageAutomation,
):
    position = parse_position(context.cursor)
    if position is None:
        context.log.warning("the scrubber's cursor is not one it wrote; a new sweep starts")
        position = ScrubPosition()
    limits = ScrubLimits(automation.scrub_slice_entries, automation.scrub_slice_seconds)
    tick = probe_when_ready(
        database, functools.partial(scrub_tick, position=position, limits=limits)
    )
    if isinstance(tick, dg.SkipReason):
        return tick
    events = []
    if tick.has_findings:
        asset_key = coverage_history_key(tick.slice.collection.slug)
        # The asset is only ever observed: no materialization can turn this finding into
        # "not evaluated" on the asset's page.
        events.append(scrub_check_evaluation(tick, asset_key))
    return dg.SensorResult(
        skip_reason=dg.SkipReason(_summary(tick)),
        cursor=tick.position.to_cursor(),
        asset_events=events,
    )
