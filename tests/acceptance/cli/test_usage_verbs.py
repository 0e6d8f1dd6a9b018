"""`media-usage usage MEDIA_ID` (EmDash's media usage route) and `media-usage unused`, on both
dialects: drafts, trashed entries, non-local providers, partial coverage, paging, bad input."""

from __future__ import annotations

import pytest

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from tests.support.cli import (
    EXIT_OK,
    EXIT_PROBLEM,
    assert_all_refused,
    assert_unchanged,
    invoke,
    invoke_json,
)
from tests.support.media_library import add_media, create_media_table
from tests.support.projection import active_collection, image
from tests.support.projection_gc import drain
from tests.support.states import set_status, snapshot

SHARED = "m-shared"


def _entry(content_id: str, hero, status: str = "published") -> dict:
    return {
        "id": content_id,
        "slug": f"{content_id}-slug",
        "status": status,
        "title": f"Title {content_id}",
        "hero": hero,
    }


@pytest.fixture
def library(activated):
    """posts: a published entry, a draft-only entry, a published entry whose draft overlay
    switches to the shared image, a trashed entry, an entry with a cloudinary image; all
    projected. EmDash's media table holds four local items."""
    engine = activated.engine
    active_collection(engine, "posts")
    writer = CmsWriter(engine)
    writer.insert_entries(
        "posts",
        [
            _entry("p-pub", image(SHARED)),
            _entry("p-draft", image(SHARED), status="draft"),
            _entry("p-overlay", image("m-old")),
            _entry("p-trash", image(SHARED)),
            _entry("p-cloud", {"id": "cl-1", "provider": "cloudinary", "mimeType": "image/png"}),
        ],
    )
    writer.save_draft("posts", "p-overlay", {"title": "Draft title", "hero": image(SHARED)})
    writer.trash_entry("posts", "p-trash")
    drain(engine)
    create_media_table(engine)
    add_media(engine, (SHARED, 100), ("m-old", 200), ("m-spare", 500), ("m-nosize", None))
    return activated


def test_usage_lists_every_entry_with_variant_and_field_path(library):
    report = invoke_json(library, "usage", SHARED)
    items = {item["content_id"]: item for item in report["items"]}
    assert list(items) == ["p-draft", "p-overlay", "p-pub", "p-trash"]
    assert [s["variant"] for s in items["p-overlay"]["sources"]] == ["draft_overlay"]
    assert items["p-overlay"]["title"] == "Draft title"  # the draft is preferred
    assert items["p-draft"]["status"] == "draft"
    assert items["p-trash"]["deleted_at"] is not None and items["p-pub"]["deleted_at"] is None
    occurrence = items["p-pub"]["sources"][0]["occurrences"][0]
    assert occurrence == {
        "field_slug": "hero",
        "field_path": "hero",
        "occurrence_index": 0,
        "reference_type": "image_field",
    }
    assert report["coverage"]["status"] == "complete"
    assert report["coverage"]["collections"][0]["collection"] == "posts"
    assert report["unused"] is False and report["next_cursor"] is None
    assert report["media"]["size"] == 100


def test_usage_table_names_variant_status_and_coverage(library):
    result = invoke(library, "usage", SHARED)
    assert result.exit_code == EXIT_OK, result.output
    for text in (
        "p-overlay",
        "draft",
        "published",
        "trashed",
        "Title p-pub",
        "hero",
        "Coverage: complete (posts complete)",
    ):
        assert text in result.stdout, text
    old = invoke(library, "usage", "m-old")
    assert "published" in old.stdout and "p-overlay" in old.stdout  # the live columns


def test_usage_pages_by_entry_through_an_opaque_cursor(library):
    first = invoke_json(library, "usage", SHARED, "--limit", "3")
    assert [item["content_id"] for item in first["items"]] == ["p-draft", "p-overlay", "p-pub"]
    second = invoke_json(library, "usage", SHARED, "--limit", "3", "--cursor", first["next_cursor"])
    assert [item["content_id"] for item in second["items"]] == ["p-trash"]
    assert second["next_cursor"] is None


def test_not_used_is_claimed_only_under_complete_coverage(library):
    result = invoke(library, "usage", "m-spare")
    assert result.exit_code == EXIT_OK
    assert "not used in any content field" in result.stdout
    assert "not indexed" in result.stdout
    assert invoke_json(library, "usage", "m-spare")["unused"] is True

    set_status(library.engine, "posts", status="partial")
    result = invoke(library, "usage", "m-spare")
    assert "does not prove it is unused" in result.stdout and "(posts)" in result.stdout
    report = invoke_json(library, "usage", "m-spare")
    assert (report["unused"], report["coverage"]["status"]) == (False, "partial")


def test_stale_coverage_and_pending_work_do_not_prove_absence(library):
    set_status(library.engine, "posts", reconciliation_required=1)
    report = invoke_json(library, "usage", "m-spare")
    assert (report["unused"], report["coverage"]["status"]) == (False, "stale")
    set_status(library.engine, "posts", reconciliation_required=0)
    CmsWriter(library.engine).update_entry("posts", "p-pub", {"hero": image("m-spare")})
    report = invoke_json(library, "usage", "m-spare")  # the edit is not projected yet
    assert report["items"] == [] and report["unused"] is False
    assert report["coverage"]["collections"][0]["pending_work"] == 1


def test_usage_of_a_non_local_provider_asset(library):
    report = invoke_json(library, "usage", "cl-1", "--provider", "cloudinary")
    assert [item["content_id"] for item in report["items"]] == ["p-cloud"]
    assert report["media"] is None
    assert invoke_json(library, "usage", "cl-1", "--provider", "other")["items"] == []


def test_bad_usage_input_exits_2_and_changes_nothing(library):
    assert_all_refused(
        library,
        ("usage",),
        [
            ((SHARED, "--limit", "0"), "Limit must be a whole number from 1 to 100"),
            ((SHARED, "--limit", "101"), "Limit must be a whole number from 1 to 100"),
            ((SHARED, "--cursor", "not-a-cursor"), "Invalid cursor"),
            ((SHARED, "--cursor", "eyJvcmRlclZhbHVlIjoiIiwiaWQiOiIifQ=="), "Invalid cursor"),
            (("no-such-media",), "Media item not found: no-such-media"),
            (("cl-1",), "Media item not found: cl-1"),  # cloudinary ids are not local media
            ((SHARED, "--provider", ""), "A provider is required"),
        ],
    )


def test_unused_lists_unreferenced_media_and_the_reclaimable_bytes(library):
    before = snapshot(library.engine)
    report = invoke_json(library, "unused")
    assert [item["id"] for item in report["items"]] == ["m-nosize", "m-spare"]
    assert {k: report[k] for k in ("media", "used", "unused", "reclaimable_bytes")} == {
        "media": 4,
        "used": 2,
        "unused": 2,
        "reclaimable_bytes": 500,
    }
    assert "not indexed" in report["not_indexed"]
    first = invoke_json(library, "unused", "--limit", "1")
    second = invoke_json(library, "unused", "--limit", "1", "--cursor", first["next_cursor"])
    assert [i["id"] for i in first["items"] + second["items"]] == ["m-nosize", "m-spare"]
    assert second["next_cursor"] is None
    table = assert_unchanged(library, ("unused",), EXIT_OK)
    assert "4 media, 2 used, 2 unused; 500 bytes reclaimable (nothing was deleted)" in table.stdout
    assert "bylines, SEO images, sections" in table.stdout
    assert snapshot(library.engine) == before


def test_unused_media_of_a_trashed_entry_is_still_used(library):
    report = invoke_json(library, "unused")
    assert SHARED not in {item["id"] for item in report["items"]}
    CmsWriter(library.engine).update_entry("posts", "p-pub", {"hero": image("m-spare")})
    drain(library.engine)
    assert "m-spare" not in {item["id"] for item in invoke_json(library, "unused")["items"]}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"status": "partial"}, "posts partial"),
        ({"status": "running"}, "posts running"),
        ({"reconciliation_required": 1}, "posts stale"),
    ],
)
def test_unused_refuses_while_coverage_is_incomplete(library, change, reason):
    set_status(library.engine, "posts", **change)
    result = assert_unchanged(library, ("unused",), EXIT_PROBLEM)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0] and lines[0].startswith("Refused:")


def test_unused_refuses_after_an_unprojected_edit_and_without_a_media_table(library):
    # the capture trigger marks the coverage stale until the edit is projected
    CmsWriter(library.engine).update_entry("posts", "p-pub", {"hero": image("m-spare")})
    result = invoke(library, "unused")
    assert result.exit_code == EXIT_PROBLEM and "posts stale" in result.stderr
    set_status(library.engine, "posts", status="complete")  # complete, yet work is pending
    result = invoke(library, "unused")
    assert result.exit_code == EXIT_PROBLEM and "posts (1 pending work)" in result.stderr
    drain(library.engine)
    with library.engine.begin() as connection:
        connection.exec_driver_sql("DROP TABLE media")
    result = invoke(library, "unused")
    assert result.exit_code == EXIT_PROBLEM and "no EmDash `media` table" in result.stderr
