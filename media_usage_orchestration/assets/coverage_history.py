"""Coverage history in the UI: one unpartitioned asset `media_usage_coverage/<slug>` per live
collection, so each collection's numbers plot over time on their own asset's Plots view, with
its checks `coverage_complete` (`health.py`) and `index_matches_content` (`index_drift.py`).

No run writes it: the queue sensor observes it when the collection's state changes and every 5
minutes while its numbers move or work is due, and evaluates `coverage_complete`; the scrubber
sensor evaluates `index_matches_content`. Never materialized, its checks' latest evaluations
are what the UI shows (a materialization newer than an evaluation would show the check as
"not evaluated").

Dagster 1.13 plots a partitioned asset's metadata per partition (latest value each) or over
time on one line across all partitions; it plots an asset's history only for keys that are in
the loaded definitions. So the code location declares one asset per collection, from the
registry as it is when the location loads (the code server's start, "Reload definitions").
Run and step workers rebuild the same assets from the slugs the load stored as reconstruction
metadata, without reading the database. When the registry cannot be read (no database, no
schema, no driver) the location loads without these assets.
"""

import json
from collections.abc import Iterator, Sequence

import dagster as dg

from media_usage_orchestration.assets.health import (
    COVERAGE_CHECK,
    collection_check_specs,
    coverage_metadata,
    coverage_verdict,
    missing_collection,
    observable_collection_assets,
    tag_check_run,
)
from media_usage_orchestration.assets.index_drift import index_drift_checks
from media_usage_orchestration.dagster_kit.dagster_internals import (
    DefinitionsLoadContext,
    DefinitionsLoadType,
)
from media_usage_orchestration.resources.automation import MediaUsageAutomation
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.host.registry import read_live_collection_slugs_at
from media_usage_orchestration.store.reads.coverage import CollectionCoverage, read_all_coverage
from media_usage_orchestration.store.runs.run_leases import database_now
from media_usage_orchestration.values.errors import RegistryUnreadable

COVERAGE_HISTORY_GROUP = "media_usage_coverage"
# The reconstruction metadata key holding the loaded slugs (a JSON list).
COVERAGE_HISTORY_SLUGS = "media_usage_coverage_slugs"

_log = dg.get_dagster_logger()


def coverage_history_key(slug: str) -> dg.AssetKey:
    return dg.AssetKey([COVERAGE_HISTORY_GROUP, slug])


def coverage_history_specs(slugs: Sequence[str]) -> list[dg.AssetSpec]:
    return [
        dg.AssetSpec(
            coverage_history_key(slug),
            group_name=COVERAGE_HISTORY_GROUP,
            kinds={"sql"},
            description=f"Coverage of the collection {slug!r} over time, observed by the sensor "
            "media_usage_queue_sensor when its state changes and every 5 minutes while its "
            "numbers move or work is due (no run): its Plots show entries, sources, occurrences, "
            "pending_work, failed_work and stuck_work over time. Its check coverage_complete "
            "says whether the index can be trusted; index_matches_content what the scrubber "
            "found.",
        )
        for slug in slugs
    ]


def coverage_observation(coverage: CollectionCoverage) -> dg.AssetObservation:
    return dg.AssetObservation(
        asset_key=coverage_history_key(coverage.collection_slug),
        metadata=coverage_metadata(coverage),
    )


def coverage_check_specs(slugs: Sequence[str]) -> list[dg.AssetCheckSpec]:
    return collection_check_specs(
        COVERAGE_CHECK,
        [coverage_history_key(slug) for slug in slugs],
        "Fails (ERROR) on work that failed for good, a failed reconciliation, or coverage that "
        "stays incomplete without progress for queue_stall_seconds; passes through an edit in "
        "flight or a reconciliation making progress. The queue sensor evaluates it whenever its "
        "verdict changes; executing it here reads the database now.",
    )


def coverage_assets(slugs: Sequence[str]) -> list[dg.AssetsDefinition]:
    """The collections' coverage assets as observable sources (the UI shows when each was last
    observed, and "Observe" reads the coverage now), with their `coverage_complete` checks;
    none without collections."""
    if not slugs:
        return []
    return [
        observable_collection_assets(
            "media_usage_coverage",
            coverage_history_specs(slugs),
            coverage_check_specs(slugs),
            _observe_coverage_now,
        )
    ]


def _observe_coverage_now(
    context: dg.AssetExecutionContext,
    database: MediaUsageDatabase,
    automation: MediaUsageAutomation,
) -> Iterator[dg.ObserveResult | dg.AssetCheckResult]:
    engine = database.engine
    by_slug = {coverage.collection_slug: coverage for coverage in read_all_coverage(engine)}
    read_at = database_now(engine)
    keys = sorted(context.selected_asset_check_keys, key=str)
    assets = sorted(context.selected_asset_keys, key=str)
    tag_check_run(context, [*keys, *(dg.AssetCheckKey(key, COVERAGE_CHECK) for key in assets)])
    for key in assets:
        if (coverage := by_slug.get(key.path[1])) is not None:
            yield dg.ObserveResult(asset_key=key, metadata=coverage_metadata(coverage))
    for key in keys:
        slug = key.asset_key.path[1]
        coverage = by_slug.get(slug)
        verdict = (
            missing_collection(f"no registry collection {slug!r}")
            if coverage is None
            else coverage_verdict(coverage, read_at, automation.queue_stall_seconds)
        )
        yield verdict.result(key)


def coverage_history_slugs(database: MediaUsageDatabase) -> list[str]:
    """The slugs to declare: on reconstruction (a run or step worker) those the location's
    load stored; on a load, the registry's live collections, or none when it is unreadable."""
    context = DefinitionsLoadContext.get()
    if context.load_type == DefinitionsLoadType.RECONSTRUCTION:
        stored = context.reconstruction_metadata.get(COVERAGE_HISTORY_SLUGS)
        if stored is not None:
            return json.loads(stored)
    try:
        slugs = read_live_collection_slugs_at(database.resolved_url())
    except RegistryUnreadable as error:
        _log.warning(f"no coverage history assets: the registry is unreadable ({error})")
        slugs = []
    context.add_to_pending_reconstruction_metadata(COVERAGE_HISTORY_SLUGS, json.dumps(slugs))
    return slugs


def with_coverage_history(base: dg.Definitions, database: MediaUsageDatabase) -> dg.Definitions:
    """`base` with one coverage history asset per collection, each with its checks
    `coverage_complete` and `index_matches_content`, the slugs kept for workers."""
    slugs = coverage_history_slugs(database)
    checks = index_drift_checks({slug: coverage_history_key(slug) for slug in slugs})
    return dg.Definitions.merge(
        base, dg.Definitions(assets=coverage_assets(slugs), asset_checks=checks)
    )
