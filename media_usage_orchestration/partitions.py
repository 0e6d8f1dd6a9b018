"""The reconciliation job is partitioned by collection slug, kept in sync with the registry."""

import dagster as dg

media_usage_collections = dg.DynamicPartitionsDefinition(name="media_usage_collections")


def partition_changes(
    instance: dg.DagsterInstance, slugs: list[str]
) -> tuple[list[str], list[str]]:
    """(to add, to delete) so the partitions equal the registry's slugs."""
    existing = set(instance.get_dynamic_partitions(media_usage_collections.name))
    wanted = set(slugs)
    return sorted(wanted - existing), sorted(existing - wanted)
