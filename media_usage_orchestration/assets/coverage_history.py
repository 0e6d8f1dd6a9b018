"""Coverage history in the UI: one unpartitioned asset `media_usage_coverage/<slug>` per live
collection, so each collection's numbers plot over time on their own asset's Plots view.

Dagster 1.13 plots a partitioned asset's metadata per partition (latest value each) or over
time on one line across all partitions; it plots an asset's history only for keys that are in
the loaded definitions. So the code location declares one asset per collection, from the
registry as it is when the location loads (the code server's start, "Reload definitions").
Run and step workers rebuild the same assets from the slugs the load stored as reconstruction
metadata, without reading the database. When the registry cannot be read (no database, no
schema, no driver) the location loads without these assets.
"""

import json
from collections.abc import Sequence

import dagster as dg
from dagster._core.definitions.definitions_load_context import (
    DefinitionsLoadContext,
    DefinitionsLoadType,
)

from media_usage_orchestration.assets.index_drift import index_drift_checks
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.store.registry import read_live_collection_slugs_at
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
            description=f"Coverage of the collection {slug!r} over time: materialized with "
            "the same numbers as its media_usage_index partition whenever a run changes the "
            "collection, so its Plots show entries, sources, occurrences, pending_work, "
            "failed_work, stuck_work and duration_seconds over time.",
        )
        for slug in slugs
    ]


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
    """`base` with one coverage history asset per collection, each with its
    `index_matches_content` check (`index_drift.py`), the slugs kept for workers."""
    slugs = coverage_history_slugs(database)
    checks = index_drift_checks({slug: coverage_history_key(slug) for slug in slugs})
    return dg.Definitions.merge(
        base, dg.Definitions(assets=coverage_history_specs(slugs), asset_checks=checks)
    )
