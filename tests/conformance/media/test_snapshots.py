"""Loading one entry's snapshots (EmDash `media-usage-content-snapshots.test.ts`)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import MEDIA_FIELDS
from media_usage_orchestration.media.snapshots import SnapshotError, build_content_snapshots
from media_usage_orchestration.processing.work.content_reads import (
    load_content_snapshots,
    load_fields,
)
from media_usage_orchestration.store.core.engine import read_transaction
from media_usage_orchestration.values.identifiers import COLLECTION_ID_RESULT
from tests.support.factories import insert_revision
from tests.support.projection import image
from tests.support.states import make_collection


@pytest.fixture
def posts(db):
    collection = make_collection(db.engine, "posts", MEDIA_FIELDS)
    CmsWriter(db.engine).insert_entry(
        "posts",
        {
            "id": "entry-1",
            "slug": "entry-1",
            "status": "published",
            "title": "Live title",
            "hero": image("live-hero"),
            "body": [{"_type": "image", "asset": {"_ref": "body-image"}}],
        },
    )
    return collection


def load(engine, collection_id: str, content_id: str = "entry-1"):
    return load_content_snapshots(engine, "posts", content_id, collection_id)


def point_draft_at(engine, revision_id: str, data: str, entry_id: str = "entry-1") -> None:
    insert_revision(engine, id=revision_id, collection="posts", entry_id=entry_id, data=data)
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE ec_posts SET draft_revision_id = :rid WHERE id = 'entry-1'"),
            {"rid": revision_id},
        )


def test_columns_then_the_draft_overlay(db, posts):
    CmsWriter(db.engine).save_draft(
        "posts", "entry-1", {"_slug": "draft-slug", "title": "Draft title", "hero": "draft-hero"}
    )

    result = load(db.engine, posts.id)

    assert result.success
    columns, draft = result.snapshots
    assert (columns.source_variant, draft.source_variant) == ("columns", "draft_overlay")
    assert [item.provider_asset_id for item in columns.occurrences] == ["body-image", "live-hero"]
    assert [item.provider_asset_id for item in draft.occurrences] == ["body-image", "draft-hero"]
    assert (columns.content_title, draft.content_title) == ("Live title", "Draft title")
    assert (columns.content_slug, draft.content_slug) == ("entry-1", "draft-slug")
    assert draft.revision_id is not None and columns.revision_id is None
    assert columns.source_fingerprint != draft.source_fingerprint
    assert columns.identity_version == draft.identity_version == 1


def test_an_absent_entry_or_another_collection_identity_is_content_not_found(db, posts):
    assert load(db.engine, posts.id, "missing").error is SnapshotError.CONTENT_NOT_FOUND
    assert load(db.engine, "replaced-collection").error is SnapshotError.CONTENT_NOT_FOUND


@pytest.mark.parametrize(
    ("data", "entry_id", "error"),
    [
        ("{", "entry-1", SnapshotError.DRAFT_REVISION_INVALID),
        ("[1, 2]", "entry-1", SnapshotError.DRAFT_REVISION_INVALID),
        ("{}", "entry-2", SnapshotError.DRAFT_REVISION_MISMATCH),
    ],
)
def test_unusable_draft_revisions_are_reported(db, posts, data, entry_id, error):
    point_draft_at(db.engine, "rev-bad", data, entry_id)

    result = load(db.engine, posts.id)

    assert result.error is error
    assert not result.success
    assert result.attempted_source.source_variant == "draft_overlay"


def test_a_missing_draft_revision_is_reported(db, posts):
    with read_transaction(db.engine) as connection:
        discovery = load_fields(connection, "posts", posts.id)
    row = {
        "id": "entry-1",
        "slug": "entry-1",
        "draft_revision_id": "gone",
        COLLECTION_ID_RESULT: posts.id,
    }

    result = build_content_snapshots(posts.id, "posts", discovery, row, None)

    assert result.error is SnapshotError.DRAFT_REVISION_NOT_FOUND
