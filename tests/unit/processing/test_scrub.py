"""The scrubber's pure logic, without a database: its position as a cursor, which collection a
tick scrubs, how a slice moves the position, and which sources need their trust withdrawn."""

import json
from dataclasses import replace

import pytest

from media_usage_orchestration.processing.integrity.scrub import (
    MAX_PAUSED_TICKS,
    CollectionState,
    Paused,
    ScrubPosition,
    SliceReport,
    advance,
    keys_the_work_would_skip,
    parse_position,
    plan_tick,
)
from media_usage_orchestration.processing.integrity.verify import Difference, DriftKind
from media_usage_orchestration.store.host.registry import RegisteredCollection

ARTICLES = CollectionState("id-articles", "articles", complete=True)
PAGES = CollectionState("id-pages", "pages", complete=True)
POSTS = CollectionState("id-posts", "posts", complete=True)


def sweeping(state: CollectionState, after: str = "e-3", **counts) -> ScrubPosition:
    return ScrubPosition(
        state.collection_id,
        state.collection_slug,
        after=after,
        sweep_started_at="2026-12-01T00:00:00.000Z",
        **counts,
    )


def slice_of(state: CollectionState, after: str | None, **values) -> SliceReport:
    collection = RegisteredCollection(state.collection_id, state.collection_slug)
    return SliceReport(collection, "2026-12-01T00:01:00.000Z", after, **values)


def difference(kind: DriftKind, key: str | None = "key-1") -> Difference:
    return Difference(kind, "articles", "entry-1", key, "detail")


# --- the cursor -------------------------------------------------------------------------------


def test_a_position_survives_its_cursor():
    position = sweeping(ARTICLES, entries_seen=9, entries_checked=8, differences=1, healed=1)

    assert parse_position(position.to_cursor()) == position
    assert parse_position(replace(position, done=True).to_cursor()).done is True


def test_no_cursor_is_a_fresh_position():
    assert parse_position(None) == ScrubPosition()


@pytest.mark.parametrize(
    "cursor",
    [
        "not json",
        "[]",
        json.dumps({**json.loads(ScrubPosition().to_cursor()), "v": 2}),
        json.dumps({"collection_id": None}),
        ScrubPosition().to_cursor().replace('"entries_seen": 0', '"entries_seen": -1'),
        ScrubPosition().to_cursor().replace('"entries_seen": 0', '"entries_seen": true'),
        ScrubPosition().to_cursor().replace('"done": false', '"done": 0'),
        ScrubPosition().to_cursor().replace('"after": null', '"after": 7'),
        ScrubPosition().to_cursor()[:-1] + ', "extra": 1}',
    ],
)
def test_a_cursor_this_version_did_not_write_is_refused(cursor):
    assert parse_position(cursor) is None


# --- which collection ---------------------------------------------------------------------------


def test_a_fresh_position_starts_on_the_first_complete_collection_by_slug():
    planned = plan_tick(ScrubPosition(), [POSTS, replace(ARTICLES, complete=False), PAGES])

    assert planned == ScrubPosition(PAGES.collection_id, "pages")


def test_a_sweep_goes_on_where_it_stopped():
    position = sweeping(PAGES, paused_ticks=2)

    assert plan_tick(position, [ARTICLES, PAGES]) == replace(position, paused_ticks=0)


def test_a_finished_sweep_moves_to_the_next_collection_and_wraps_around():
    done = replace(sweeping(PAGES), done=True)

    assert plan_tick(done, [ARTICLES, PAGES, POSTS]) == ScrubPosition(POSTS.collection_id, "posts")
    wrapped = plan_tick(replace(sweeping(POSTS), done=True), [ARTICLES, PAGES, POSTS])
    assert wrapped == ScrubPosition(ARTICLES.collection_id, "articles")
    alone = plan_tick(done, [PAGES])
    assert alone == ScrubPosition(PAGES.collection_id, "pages")  # a new sweep of it


def test_a_sweep_waits_for_its_collection_then_moves_on():
    position = sweeping(PAGES)
    stale = [ARTICLES, replace(PAGES, complete=False), POSTS]

    waits = plan_tick(position, stale)
    assert waits == Paused(replace(position, paused_ticks=1))
    last = plan_tick(replace(position, paused_ticks=MAX_PAUSED_TICKS - 1), stale)
    assert last == Paused(replace(position, paused_ticks=MAX_PAUSED_TICKS))
    gave_up = plan_tick(replace(position, paused_ticks=MAX_PAUSED_TICKS), stale)
    assert gave_up == ScrubPosition(POSTS.collection_id, "posts")


def test_a_collection_gone_from_capture_is_left_for_the_next():
    assert plan_tick(sweeping(PAGES), [ARTICLES, POSTS]) == ScrubPosition(
        POSTS.collection_id, "posts"
    )


def test_nothing_is_scrubbed_while_no_coverage_is_complete():
    incomplete = [replace(state, complete=False) for state in (ARTICLES, PAGES)]

    assert plan_tick(ScrubPosition(), incomplete) is None
    assert plan_tick(ScrubPosition(), []) is None


# --- how a slice moves the position -----------------------------------------------------------


def test_a_slice_adds_its_counts_and_starts_the_sweep_clock():
    start = ScrubPosition(ARTICLES.collection_id, "articles", paused_ticks=3)
    report = slice_of(
        ARTICLES,
        "e-3",
        entries_seen=3,
        entries_checked=2,
        entries_skipped=1,
        confirmed=[difference(DriftKind.MISSING_OCCURRENCE)],
    )

    moved, sweep = advance(start, report)

    assert sweep is None
    assert moved == replace(
        start,
        after="e-3",
        sweep_started_at=report.read_at,
        entries_seen=3,
        entries_checked=2,
        entries_skipped=1,
        differences=1,
        paused_ticks=0,
    )


def test_the_slice_that_reaches_the_end_finishes_the_sweep():
    position = sweeping(ARTICLES, entries_seen=3, entries_checked=3, differences=1, healed=1)
    report = slice_of(ARTICLES, "e-5", entries_seen=2, entries_checked=2, reached_end=True)

    moved, sweep = advance(position, report)

    assert moved.done and moved.after == "e-5"
    assert sweep is not None
    assert (sweep.collection_slug, sweep.started_at, sweep.finished_at) == (
        "articles",
        position.sweep_started_at,
        report.read_at,
    )
    assert (sweep.entries_seen, sweep.entries_checked, sweep.differences, sweep.healed) == (
        5,
        5,
        1,
        1,
    )


# --- trust ------------------------------------------------------------------------------------


def test_only_sources_whose_fingerprint_still_matches_need_their_trust_withdrawn():
    differences = [
        difference(DriftKind.MISSING_OCCURRENCE, "kept-fingerprint"),
        difference(DriftKind.COLUMN_MISMATCH, "kept-fingerprint"),
        difference(DriftKind.UNEXPECTED_OCCURRENCE, "changed-fingerprint"),
        difference(DriftKind.FINGERPRINT_MISMATCH, "changed-fingerprint"),
        difference(DriftKind.MISSING_SOURCE, "missing"),
        difference(DriftKind.UNEXPECTED_SOURCE, "extra"),
        difference(DriftKind.SNAPSHOT_FAILED, None),
    ]

    assert keys_the_work_would_skip(differences) == {"kept-fingerprint"}
