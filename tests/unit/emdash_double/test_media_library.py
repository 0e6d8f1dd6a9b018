"""The EmDash double's media library: EmDash's exact `media` DDL on each dialect, upload-shaped
rows, and the local media ids the sample content references."""

from __future__ import annotations

import re

import pytest

from media_usage_orchestration.emdash_double import sample_content
from media_usage_orchestration.emdash_double.media_library import (
    MEDIA_TABLE_DDL,
    MediaFile,
    media_row,
)
from tests.fixtures import SCHEMA_POSTGRES, SCHEMA_SQLITE

# Every statement of EmDash's dumps whose target is the `media` table (not a foreign key of
# another table that refers to it).
MEDIA_STATEMENTS = {
    "sqlite": (SCHEMA_SQLITE, r'^CREATE (?:TABLE|(?:UNIQUE )?INDEX "\w+" on) "media" .*?;$'),
    "postgresql": (
        SCHEMA_POSTGRES,
        r"^(?:CREATE TABLE|ALTER TABLE ONLY|CREATE (?:UNIQUE )?INDEX \w+ ON) public\.media\b.*?;$",
    ),
}


@pytest.mark.parametrize("dialect_name", sorted(MEDIA_STATEMENTS))
def test_the_media_ddl_is_emdashs_own_statement_for_statement(dialect_name):
    dump, pattern = MEDIA_STATEMENTS[dialect_name]
    emdash = re.findall(pattern, dump.read_text(), re.M | re.S)
    assert len(emdash) >= 7  # the table, its primary key (inline on SQLite) and six indexes
    assert sorted(MEDIA_TABLE_DDL[dialect_name]) == sorted(emdash)


def test_a_media_row_is_an_upload_of_its_kind_and_always_the_same():
    photo = media_row(MediaFile("art-img-00001", "image/jpeg"))
    assert photo == media_row(MediaFile("art-img-00001", "image/jpeg"))
    assert photo["filename"] == photo["storage_key"] == "art-img-00001.jpg"
    assert 90_000 <= photo["size"] < 2_400_000 and photo["status"] == "ready"
    assert (photo["width"], photo["height"]) > (0, 0) and len(photo["content_hash"]) == 64
    text = media_row(MediaFile("t-1", "text/plain; charset=utf-8", "notes.txt"))
    assert (text["filename"], text["storage_key"], text["mime_type"]) == (
        "notes.txt",
        "t-1.txt",
        "text/plain; charset=utf-8",
    )
    assert 800 <= text["size"] < 60_000 and text["width"] is None
    video = media_row(MediaFile("v-1", "video/mp4"))
    assert video["size"] > 4_000_000


def test_local_media_skips_other_providers_external_and_url_like_references():
    entry = sample_content.sample_entry("art", 5)  # index 5: an `external` hero
    found = dict(sample_content.local_media(entry))
    assert found == {
        "art-doc-00005": "application/pdf",
        "art-pt-00005": "image/png",
        "art-gal-00005": "image/gif",
        "art-gal-00006": None,  # the second gallery item names no mime type
    }
    legacy = sample_content.sample_entry("art", 3)  # index 3: a bare-string hero
    assert ("art-img-00003", "image/jpeg") in sample_content.local_media(legacy)
    edit = {"hero": sample_content.edited_hero("art-e00001"), "title": "edited"}
    assert sample_content.local_media(edit) == [("art-e00001-v2", "image/webp")]


def test_the_library_has_one_upload_per_id_with_the_mime_type_some_reference_names():
    entries = sample_content.sample_entries("art", 8)
    files = {file.id: file.mime_type for file in sample_content.library_files(entries)}
    assert files["art-gal-00006"] == "image/gif"  # named by entry 6, not by entry 5
    assert files["art-img-00003"] == "image/jpeg"
    referenced = [
        media_id for entry in entries for media_id, _ in sample_content.local_media(entry)
    ]
    assert sorted(files) == sorted(set(referenced))
    assert not {file.id for file in sample_content.UNUSED_UPLOADS} & set(files)
