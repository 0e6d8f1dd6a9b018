"""Drift in the UI: the check `index_matches_content` of each collection's own asset
`media_usage_coverage/<slug>` (`coverage_history.py`): does the collection's index equal what
extraction computes from its content?

The scrubber sensor (`sensors/scrubber.py`) evaluates it as it walks a collection, without a
run: it fails on a tick that confirms a difference, naming the entries, the kinds of difference
and what healing each did, and it is evaluated once more when a sweep of the collection ends,
with the sweep's coverage (entries checked of the entries walked, entries skipped for open work)
and its drift count, passing only when the sweep found none. Severity WARN while every confirmed
difference had its work reopened, ERROR when one could not be. Executed by hand, a check runs
`verify` over its collection.

On the collection's own (unpartitioned) asset rather than a partition of `media_usage_index`:
Dagster 1.13 stores one runless evaluation per check and partition (its unique index on
`asset_check_executions` spans the partition and an empty run id), so a partitioned check
could be evaluated from a sensor only once.
"""

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence

import dagster as dg

from media_usage_orchestration.processing.integrity.scrub import Heal, ScrubPosition, ScrubTick
from media_usage_orchestration.processing.integrity.verify import Difference, verify_index
from media_usage_orchestration.resources.database import MediaUsageDatabase

INDEX_MATCHES_CONTENT = "index_matches_content"
# Differences listed in one evaluation's metadata; the counts always cover all of them.
MAX_LISTED_DIFFERENCES = 20


def _counts(position: ScrubPosition) -> dict[str, dg.MetadataValue]:
    return {
        "collection_id": dg.MetadataValue.text(position.collection_id or "-"),
        "sweep": dg.MetadataValue.text("finished" if position.done else "in progress"),
        "sweep_started_at": dg.MetadataValue.text(position.sweep_started_at or "-"),
        "entries_checked": dg.MetadataValue.int(position.entries_checked),
        "entries_total": dg.MetadataValue.int(position.entries_seen),
        "entries_skipped": dg.MetadataValue.int(position.entries_skipped),
        "drift_found": dg.MetadataValue.int(position.differences),
        "drift_healed": dg.MetadataValue.int(position.healed),
    }


def _differences_table(differences: Sequence[Difference]) -> str:
    lines = ["| entry | kind | source | detail |", "|---|---|---|---|"]
    for difference in differences[:MAX_LISTED_DIFFERENCES]:
        detail = difference.detail.replace("|", "\\|")
        lines.append(
            f"| {difference.content_id or '-'} | {difference.kind.value} "
            f"| {difference.source_key or '-'} | {detail} |"
        )
    if len(differences) > MAX_LISTED_DIFFERENCES:
        lines.append(f"| ... | {len(differences) - MAX_LISTED_DIFFERENCES} more | | |")
    return "\n".join(lines)


def _heal_line(heal: Heal) -> str:
    done = "work reopened" if heal.changed else f"work {heal.outcome.value}"
    withdrawn = f", trust withdrawn from {', '.join(heal.trust_withdrawn)}"
    return f"- {heal.content_id}: {done}{withdrawn if heal.trust_withdrawn else ''}"


def _description(slug: str, position: ScrubPosition, differences: Sequence[Difference]) -> str:
    coverage = (
        f"{position.entries_checked} of {position.entries_seen} entries checked "
        f"({position.entries_skipped} skipped for open work)"
    )
    sweep = "sweep finished" if position.done else "sweep in progress"
    if not differences:
        found = "no drift" if not position.differences else f"{position.differences} difference(s)"
        return f"{slug}: {sweep}, {coverage}, {found}"
    kinds = Counter(difference.kind.value for difference in differences)
    named = ", ".join(f"{kind}: {count}" for kind, count in sorted(kinds.items()))
    entries = sorted({difference.content_id or "-" for difference in differences})
    return (
        f"{slug}: {len(differences)} difference(s) confirmed in {', '.join(entries)} "
        f"({named}); {sweep}, {coverage}"
    )


def scrub_check_evaluation(
    tick: ScrubTick,
    asset_key: dg.AssetKey,
) -> dg.AssetCheckEvaluation:
    """The evaluation of a tick that has findings (confirmed differences, a finished sweep),
    for the check of the collection's asset `asset_key`."""
    report = tick.slice
    if report is None or not tick.has_findings:
        raise ValueError("a scrubber tick without findings has no check evaluation")
    position = tick.position
    metadata = _counts(position)
    if tick.sweep is not None:
        metadata["sweep_finished_at"] = dg.MetadataValue.text(tick.sweep.finished_at)
    if report.confirmed:
        metadata["differences"] = dg.MetadataValue.md(_differences_table(report.confirmed))
        metadata["entries"] = dg.MetadataValue.json(
            sorted({d.content_id for d in report.confirmed if d.content_id})
        )
        metadata["heals"] = dg.MetadataValue.md(
            "\n".join(_heal_line(heal) for heal in report.heals) or "-"
        )
    all_reopened = position.healed == position.differences
    return dg.AssetCheckEvaluation(
        asset_key=asset_key,
        check_name=INDEX_MATCHES_CONTENT,
        passed=position.differences == 0,
        severity=dg.AssetCheckSeverity.WARN if all_reopened else dg.AssetCheckSeverity.ERROR,
        description=_description(report.collection.slug, position, report.confirmed),
        metadata=metadata,
    )


# --- executed by hand -------------------------------------------------------------------------


def _verified(engine, slug: str, check_key: dg.AssetCheckKey) -> dg.AssetCheckResult:
    report = verify_index(engine, [slug])
    if not report.collections:
        return dg.AssetCheckResult(
            asset_key=check_key.asset_key,
            check_name=check_key.name,
            passed=False,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"no captured collection {slug!r}",
        )
    [summary] = report.collections
    metadata = {
        "collection_id": dg.MetadataValue.text(summary.collection_id),
        "entries_checked": dg.MetadataValue.int(summary.entry_count),
        "entries_total": dg.MetadataValue.int(summary.entry_count),
        "drift_found": dg.MetadataValue.int(len(report.differences)),
        "pending_work": dg.MetadataValue.int(summary.pending_work_count),
    }
    if report.differences:
        metadata["differences"] = dg.MetadataValue.md(_differences_table(report.differences))
    found = f"{len(report.differences)} difference(s)" if report.has_drift else "no drift"
    return dg.AssetCheckResult(
        asset_key=check_key.asset_key,
        check_name=check_key.name,
        passed=not report.has_drift,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{slug}: verify over {summary.entry_count} entries, {found} "
        f"({summary.pending_work_count} work item(s) pending)",
        metadata=metadata,
    )


def index_drift_checks(assets: Mapping[str, dg.AssetKey]) -> list[dg.AssetChecksDefinition]:
    """The `index_matches_content` check of each collection's asset (slug -> asset key), in
    one definition whose checks execute one by one; none without collections."""
    if not assets:
        return []
    slug_of = {key: slug for slug, key in assets.items()}
    specs = [
        dg.AssetCheckSpec(
            INDEX_MATCHES_CONTENT,
            asset=key,
            description=f"Does {slug}'s media usage index equal what extraction computes from "
            "its content? The scrubber sensor evaluates it without a run: failing on each "
            "confirmed difference (entries, kinds, heals), and at the end of every sweep of the "
            "collection with the sweep's coverage (entries_checked of entries_total) and drift "
            "count. Executing it runs `verify` over the collection.",
        )
        for slug, key in sorted(assets.items())
    ]

    @dg.multi_asset_check(specs=specs, can_subset=True, name="media_usage_index_matches_content")
    def index_matches_content(
        context: dg.AssetCheckExecutionContext, database: MediaUsageDatabase
    ) -> Iterator[dg.AssetCheckResult]:
        for check_key in sorted(context.selected_asset_check_keys, key=str):
            yield _verified(database.engine, slug_of[check_key.asset_key], check_key)

    return [index_matches_content]


__all__ = [
    "INDEX_MATCHES_CONTENT",
    "index_drift_checks",
    "scrub_check_evaluation",
]
