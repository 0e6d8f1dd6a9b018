"""The media library summary (`UsageRepository.media_summary`): its counts equal what the
content references, read from the content itself (past generations, trashed entries and draft
overlays as the listing treats them), and on PostgreSQL its plan joins without nested loops
whatever the planner's statistics say, within a time limit."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from media_usage_orchestration.bench.database import create_collection, insert_entries
from media_usage_orchestration.bench.measure import DriverMode
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.processing.activation.capture import activate
from media_usage_orchestration.store.core.engine import bounded_read, prefer_linear_plans
from media_usage_orchestration.store.sources.usage import (
    MEDIA_SUMMARY,
    UsageRepository,
    unused_media_page,
)
from tests.support.media_library import add_media, create_media_table, media_referenced_by_content
from tests.support.projection import drain


@pytest.fixture
def library(db):
    """A reconciled collection whose entries were then edited (their earlier generations'
    occurrences stay until the GC reaps them) and one trashed, and a media table holding
    every referenced id with a size, ids nothing references, and referenced ids it lacks."""
    collection = create_collection(db.engine)
    insert_entries(db.engine, 30)
    activate(db.engine)
    DriverMode(db.engine, collection).reconcile()
    writer = CmsWriter(db.engine)
    for index in range(5):
        hero = {"id": f"replacement-{index}", "provider": "local", "mimeType": "image/webp"}
        writer.update_entry(collection.slug, f"art-e{index:05d}", {"hero": hero})
    writer.trash_entry(collection.slug, "art-e00010")
    drain(db.engine)
    referenced = sorted(media_referenced_by_content(db.engine))
    create_media_table(db.engine)
    sizes = {media_id: 100 + number for number, media_id in enumerate(referenced[2:])}
    sizes.update({f"orphan-{number}": 1000 * (number + 1) for number in range(4)})
    sizes["orphan-without-size"] = None
    add_media(db.engine, *sizes.items())
    return referenced, sizes


def test_the_summary_counts_what_the_content_references(db, library):
    referenced, sizes = library

    summary = UsageRepository(db.engine).media_summary()

    used = set(sizes) & set(referenced)
    assert (summary.media, summary.used) == (len(sizes), len(used))
    assert summary.reclaimable_bytes == sum(
        size or 0 for media_id, size in sizes.items() if media_id not in used
    )
    # The listing agrees: every media row it calls unused, and only those.
    repository = UsageRepository(db.engine)
    unused, _ = repository.unused_media(None, 1000)
    assert {item.id for item in unused} == set(sizes) - used


def _plan(db, statement) -> str:
    text_ = str(statement.compile(db.engine, compile_kwargs={"literal_binds": True}))
    with bounded_read(db.engine, 30) as connection:
        prefer_linear_plans(connection)
        if db.is_postgres:
            return "\n".join(connection.execute(text(f"EXPLAIN {text_}")).scalars())
        rows = connection.execute(text(f"EXPLAIN QUERY PLAN {text_}"))
        return "\n".join(str(row[-1]) for row in rows)


def test_the_unused_listing_is_planned_without_a_scan_per_media_row(db, library):
    """PostgreSQL: without statistics a nested loop over the used set took 50 s for one page of
    a large library; with hash or merge joins only it is an anti join of two sorted or hashed
    sets. SQLite: each media row's lookup is an index search by media id, never a scan."""
    plan = _plan(db, unused_media_page("lib-999", 51))
    if db.is_postgres:
        assert "Nested Loop" not in plan, plan
        assert "Anti Join" in plan, plan
    else:
        assert "(media_id=?)" in plan and "SCAN" not in plan, plan


def test_the_summary_is_planned_as_one_pass_not_a_lookup_per_media_row(db, library):
    """PostgreSQL: hash or merge joins only, whatever its statistics say. SQLite (no
    statistics unless asked, no hints): the used ids are a set built once, not a correlated
    subquery run per media row."""
    plan = _plan(db, MEDIA_SUMMARY)
    if db.is_postgres:
        assert "Nested Loop" not in plan, plan
        assert "Hash" in plan or "Merge" in plan, plan
    else:
        assert "CORRELATED" not in plan, plan
        assert "used" in plan, plan
