"""The scrubber sensor, ticked with `build_sensor_context` and its cursor carried from tick to
tick, on both dialects: drift planted behind the index's back is found within one sweep,
reported on the collection's `index_matches_content` check and healed through the work it
reopens; an entry edited while it is checked is not reported; only collections whose coverage
is complete are scrubbed; the position rotates across collections."""

from __future__ import annotations

import json
from collections.abc import Callable

import dagster as dg
import pytest
from sqlalchemy import delete, insert, select, update

from media_usage_orchestration.assets.coverage_history import coverage_history_key
from media_usage_orchestration.assets.index_drift import INDEX_MATCHES_CONTENT
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import sample_entry
from media_usage_orchestration.processing.integrity import scrub
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.loop.run_loop import Budget, drain_due_work
from media_usage_orchestration.sensors.scrubber import media_usage_scrubber_sensor
from media_usage_orchestration.store.core import schema
from tests.support.projection import canonical_key, processed_collection
from tests.support.sensor_loop import plain, resources_for
from tests.support.states import all_rows, count, set_status, status_row

SLICE = 3  # entries per tick: a sweep of the 8-entry sample collection takes 3 ticks
ZERO_FINGERPRINT = "media-usage-projection:v1:sha256:" + "0" * 64


class Scrubber:
    """The sensor ticked as the daemon ticks it: the cursor each tick returns is the next
    tick's, and the asset events it returns are stored in the instance."""

    def __init__(self, db, instance: dg.DagsterInstance, cursor: str | None = None) -> None:
        self.resources = resources_for(db.url, scrub_slice_entries=SLICE)
        self.instance = instance
        self.cursor = cursor

    def tick(self):
        with dg.build_sensor_context(
            instance=self.instance,
            cursor=self.cursor,
            resources=self.resources,
            definitions=defs,
        ) as context:
            data = media_usage_scrubber_sensor.evaluate_tick(context)
        assert data.run_requests == []  # the scrubber launches no runs
        for event in data.asset_events:
            self.instance.report_runless_asset_event(event)
        self.cursor = data.cursor
        return data

    @property
    def position(self) -> dict:
        return json.loads(self.cursor)

    def ticks_until_sweep_ends(self, limit: int = 10, between: Callable | None = None) -> list:
        """Ticks until one ends a sweep; `between` runs after each (the work runs' turn)."""
        ticks = []
        for _ in range(limit):
            ticks.append(self.tick())
            if self.position["done"]:
                return ticks
            if between is not None:
                between()
        raise AssertionError(f"no sweep ended in {limit} ticks: {self.position}")


def evaluations(data) -> list[dg.AssetCheckEvaluation]:
    return [event for event in data.asset_events if isinstance(event, dg.AssetCheckEvaluation)]


def collection_of(evaluation: dg.AssetCheckEvaluation) -> str:
    assert evaluation.check_name == INDEX_MATCHES_CONTENT
    [slug] = [s for s in ("articles", "pages") if evaluation.asset_key == coverage_history_key(s)]
    return slug


def check_history(instance: dg.DagsterInstance, slug: str) -> list[dg.AssetCheckEvaluation]:
    """The collection's stored evaluations, newest first."""
    check_key = dg.AssetCheckKey(coverage_history_key(slug), INDEX_MATCHES_CONTENT)
    records = instance.event_log_storage.get_asset_check_execution_history(check_key, limit=20)
    return [record.event.asset_check_evaluation for record in records]


def drain_work(db) -> None:
    drain = drain_due_work(db.engine, Budget(max_steps=1000), batch_size=25)
    assert drain.counts.failed == 0
    assert count(db.engine, schema.work) == 0


# --- drift planted behind the index's back ----------------------------------------------------


def delete_one_occurrence(engine, key: str) -> None:
    with engine.begin() as connection:
        victim = connection.execute(
            select(schema.occurrences.c.id).where(schema.occurrences.c.source_key == key).limit(1)
        ).scalar_one()
        connection.execute(delete(schema.occurrences).where(schema.occurrences.c.id == victim))


def change_fingerprint(engine, key: str) -> None:
    with engine.begin() as connection:
        connection.execute(
            update(schema.sources)
            .where(schema.sources.c.source_key == key)
            .values(source_fingerprint=ZERO_FINGERPRINT)
        )


def add_extra_source(engine, key: str) -> None:
    """A draft overlay source for an entry without a draft: a copy of its columns source."""
    extra = key.replace(":columns", ":draft_overlay")
    with engine.begin() as connection:
        row = dict(
            connection.execute(select(schema.sources).where(schema.sources.c.source_key == key))
            .one()
            ._mapping
        )
        row.update(source_key=extra, source_variant="draft_overlay")
        connection.execute(insert(schema.sources).values(row))


DRIFTS: dict[str, tuple[Callable, str]] = {
    "deleted_occurrence": (delete_one_occurrence, "missing_occurrence"),
    "changed_fingerprint": (change_fingerprint, "fingerprint_mismatch"),
    "extra_source": (add_extra_source, "unexpected_source"),
}


@pytest.mark.parametrize("drift", sorted(DRIFTS))
def test_drift_is_found_within_one_sweep_and_healed_by_the_work_it_reopens(db, instance, drift):
    collection = processed_collection(db.engine)
    entry = sample_entry("art", 4)["id"]
    plant, kind = DRIFTS[drift]
    plant(db.engine, canonical_key(collection, entry))
    assert verify_index(db.engine).has_drift
    scrubber = Scrubber(db, instance)
    states = []

    def work_runs() -> None:
        # A heal leaves the coverage stale (its epoch bump) until the work is processed.
        states.append(status_row(db.engine, "articles")["status"])
        drain_work(db)

    found = scrubber.ticks_until_sweep_ends(between=work_runs)

    assert "stale" in states
    [failed] = [e for data in found for e in evaluations(data) if e.metadata.get("differences")]
    assert (failed.passed, collection_of(failed), failed.severity) == (
        False,
        "articles",
        dg.AssetCheckSeverity.WARN,  # healed: its work was reopened
    )
    assert plain(failed.metadata)["entries"] == [entry]
    assert kind in failed.metadata["differences"].value
    assert entry in failed.description and kind in failed.description
    assert f"{entry}: work reopened" in failed.metadata["heals"].value
    [end] = evaluations(found[-1])
    assert not end.passed
    sweep = plain(end.metadata)
    assert (sweep["sweep"], sweep["entries_total"], sweep["drift_found"]) == ("finished", 8, 1)
    assert sweep["drift_healed"] == 1
    assert sweep["entries_checked"] + sweep["entries_skipped"] == 8
    # Stored as the daemon stores them, each evaluation beside the earlier ones.
    assert check_history(instance, "articles")[:2] == [end, failed]
    assert not verify_index(db.engine).has_drift
    clean = scrubber.ticks_until_sweep_ends()
    [passed] = evaluations(clean[-1])
    assert passed.passed
    assert plain(passed.metadata)["entries_checked"] == 8
    assert plain(passed.metadata)["drift_found"] == 0


def test_an_entry_edited_while_it_is_checked_is_not_reported(db, instance, monkeypatch):
    collection = processed_collection(db.engine)
    entry = sample_entry("art", 1)["id"]
    change_fingerprint(db.engine, canonical_key(collection, entry))
    confirm = scrub.confirm_entry
    edited = []

    def edit_then_confirm(engine, collection_, discovery, first):
        # The editor saves between the slice's read and its confirmation.
        CmsWriter(engine).update_entry("articles", first["id"], {"title": "edited meanwhile"})
        edited.append(first["id"])
        return confirm(engine, collection_, discovery, first)

    monkeypatch.setattr(scrub, "confirm_entry", edit_then_confirm)
    scrubber = Scrubber(db, instance)

    first = scrubber.tick()  # the slice holding the entry

    assert edited == [entry]
    assert evaluations(first) == []
    assert "0 of 0" not in first.skip_message and "1 not confirmed" in first.skip_message
    assert scrubber.position["differences"] == 0
    # The edit's own work, not the scrubber, brings the entry's index up to date.
    [work] = all_rows(db.engine, schema.work)
    assert (work["content_id"], work["state"]) == (entry, "pending")
    drain_work(db)
    assert not verify_index(db.engine).has_drift
    rest = scrubber.ticks_until_sweep_ends()
    [end] = evaluations(rest[-1])
    assert end.passed and plain(end.metadata)["drift_found"] == 0
    assert edited == [entry]  # nothing else differed


# --- which collections, in which order --------------------------------------------------------


def test_a_collection_whose_coverage_is_not_complete_is_not_scrubbed(db, instance):
    processed_collection(db.engine, "articles", entries=6)
    pages = processed_collection(db.engine, "pages", entries=6)
    change_fingerprint(db.engine, canonical_key(pages, sample_entry("pag", 0)["id"]))
    set_status(db.engine, "pages", reconciliation_required=1)
    scrubber = Scrubber(db, instance)

    ticks = [scrubber.tick() for _ in range(6)]

    assert {collection_of(e) for data in ticks for e in evaluations(data)} == {"articles"}
    assert all(e.passed for data in ticks for e in evaluations(data))
    assert scrubber.position["collection_slug"] == "articles"
    set_status(db.engine, "articles", status="stale")
    idle = scrubber.tick()
    assert "no captured collection's coverage is complete" in idle.skip_message
    assert idle.cursor == ticks[-1].cursor  # the position is kept for later


def test_the_position_rotates_across_collections_and_survives_in_the_cursor(db, instance):
    processed_collection(db.engine, "articles", entries=7)
    processed_collection(db.engine, "pages", entries=8)
    first = Scrubber(db, instance)
    walked, sweeps = [], []

    def tick(scrubber: Scrubber) -> None:
        data = scrubber.tick()
        walked.append((scrubber.position["collection_slug"], scrubber.position["after"]))
        sweeps.extend(
            (collection_of(e), plain(e.metadata)["entries_total"]) for e in evaluations(data)
        )

    for _ in range(3):
        tick(first)
    # A new context (as after a daemon restart) goes on from the stored cursor alone.
    resumed = Scrubber(db, instance, cursor=first.cursor)
    for _ in range(4):
        tick(resumed)

    art, pag = sample_entry("art", 0)["id"][:-1], sample_entry("pag", 0)["id"][:-1]
    assert walked == [
        ("articles", f"{art}2"),
        ("articles", f"{art}5"),
        ("articles", f"{art}6"),  # the end of articles: its sweep is done
        ("pages", f"{pag}2"),
        ("pages", f"{pag}5"),
        ("pages", f"{pag}7"),
        ("articles", f"{art}2"),  # around again
    ]
    assert sweeps == [("articles", 7), ("pages", 8)]


def test_a_cursor_it_did_not_write_starts_a_new_sweep(db, instance):
    processed_collection(db.engine, "articles", entries=6)
    scrubber = Scrubber(db, instance, cursor="{not a position")

    scrubber.tick()

    assert scrubber.position["collection_slug"] == "articles"
    assert scrubber.position["entries_seen"] == SLICE
