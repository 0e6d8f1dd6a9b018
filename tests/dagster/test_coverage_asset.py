"""Coverage in the UI: runs record events of the asset `media_usage_index`, one partition per
collection slug, whose numbers equal what the database holds at that moment."""

from dataclasses import replace

import dagster as dg

from media_usage_orchestration.assets.index import MEDIA_USAGE_INDEX
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import sample_entry
from media_usage_orchestration.processing.loop.retry_policy import RECONCILIATION_RETRY
from media_usage_orchestration.processing.reconciliation import steps
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.reads.coverage import read_collection_coverage
from tests.support.reconciliation_runs import (
    FAILED_CODE,
    PARTITIONS,
    activate_with_job,
    run_partition,
    write_collections,
)
from tests.support.sensor_loop import plain, resources
from tests.support.states import count, status_row

WORK_JOB = defs.resolve_job_def("media_usage_work")


def _materializations(instance: dg.DagsterInstance, slug: str) -> list[dict]:
    """The partition's materializations' metadata, oldest first."""
    records = instance.fetch_materializations(_partition(slug), limit=100, ascending=True)
    return [plain(record.asset_materialization.metadata) for record in records.records]


def _partition(slug: str) -> dg.AssetRecordsFilter:
    return dg.AssetRecordsFilter(asset_key=MEDIA_USAGE_INDEX, asset_partitions=[slug])


def test_the_asset_is_declared_with_the_collection_partitions():
    spec = defs.resolve_assets_def(MEDIA_USAGE_INDEX)
    assert spec.partitions_def.name == PARTITIONS


def test_a_completed_reconciliation_materializes_its_collection_partition(db):
    collections = write_collections(db.engine, {"articles": 60, "pages": 30})
    articles = collections["articles"]
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        instance.add_dynamic_partitions(PARTITIONS, ["articles", "pages"])
        before = {slug: len(_materializations(instance, slug)) for slug in ("articles", "pages")}
        assert run_partition(db, instance, "articles").success

        [metadata] = _materializations(instance, "articles")[before["articles"] :]
        assert len(_materializations(instance, "pages")) == before["pages"]

    status = status_row(db.engine, "articles")
    coverage = read_collection_coverage(db.engine, articles.id)
    occurrences = count(db.engine, schema.occurrences)
    assert occurrences > 0
    assert {key: metadata[key] for key in ("coverage", "collection_id", "change_epoch")} == {
        "coverage": "complete",
        "collection_id": articles.id,
        "change_epoch": status["change_epoch"],
    }
    assert (metadata["entries"], metadata["sources"]) == (60, 60)
    assert (metadata["occurrences"], metadata["pending_work"]) == (coverage.occurrences, 0)
    assert metadata["occurrences"] == occurrences
    assert 0 <= metadata["duration_seconds"] < 120


def test_each_work_run_materializes_the_collection_it_projected(db):
    write_collections(db.engine, {"articles": 20, "pages": 20, "posts": 20})
    writer = CmsWriter(db.engine)
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        instance.add_dynamic_partitions(PARTITIONS, ["articles"])
        assert run_partition(db, instance, "articles").success
        before = len(_materializations(instance, "articles"))
        for index in range(3):
            entry = sample_entry("art", index)
            writer.update_entry("articles", entry["id"], {"title": f"edited {index}"})
        writer.insert_entry("pages", sample_entry("pag", 500))

        # One run per collection: launched without one, each takes the earliest due.
        runs = [
            WORK_JOB.execute_in_process(instance=instance, resources=resources(db))
            for _ in range(2)
        ]

        assert all(run.success for run in runs)
        assert [
            instance.get_run_by_id(run.run_id).tags["media_usage/collection"] for run in runs
        ] == ["articles", "pages"]
        articles = _materializations(instance, "articles")[before:]
        pages = _materializations(instance, "pages")
        posts = _materializations(instance, "posts")
        # The work run added the partition of a collection it projected before any
        # reconciliation had.
        assert "pages" in instance.get_dynamic_partitions(PARTITIONS)

    # Activation materialized every collection once; the work runs only those they projected.
    assert len(articles) == 1 and len(pages) == 2 and len(posts) == 1
    pages = pages[1:]
    assert articles[0]["entries_projected"] == 3
    assert pages[0]["entries_projected"] == 1
    assert articles[0]["entries"] == 20 and pages[0]["entries"] == 21
    assert articles[0]["sources"] == 20 and articles[0]["coverage"] == "complete"
    assert articles[0]["duration_seconds"] >= 0


def test_failed_coverage_is_recorded_with_its_error_code(db, monkeypatch):
    write_collections(db.engine, {"articles": 10})

    def failing_source_page(engine, claim):
        raise RuntimeError("injected")

    monkeypatch.setattr(steps, "source_page", failing_source_page)
    # Every failure is the last attempt.
    monkeypatch.setattr(
        steps, "RECONCILIATION_RETRY", replace(RECONCILIATION_RETRY, max_attempts=1)
    )
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        instance.add_dynamic_partitions(PARTITIONS, ["articles"])

        result = run_partition(db, instance, "articles", raise_on_error=False)

        assert not result.success
        # Activation recorded the collection first; the failure is the latest record.
        activation, observation = _materializations(instance, "articles")

    # Sources of the scanned page exist, so EmDash publishes the failure as `partial`.
    assert status_row(db.engine, "articles")["status"] == "partial"
    assert (observation["reconciliation"], observation["coverage"]) == ("failed", "partial")
    assert observation["error_code"] == FAILED_CODE
    assert observation["entries"] == 10
    assert (activation["activation"], activation["error_code"]) == ("active", "-")


def test_a_failure_that_will_be_retried_records_no_coverage_event(db, monkeypatch):
    write_collections(db.engine, {"articles": 10})

    def failing_source_page(engine, claim):
        raise RuntimeError("injected")

    monkeypatch.setattr(steps, "source_page", failing_source_page)
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        instance.add_dynamic_partitions(PARTITIONS, ["articles"])

        result = run_partition(db, instance, "articles", raise_on_error=False)

        assert not result.success
        assert [each.get("activation") for each in _materializations(instance, "articles")] == [
            "active"  # activation's record only
        ]
    assert status_row(db.engine, "articles")["status"] != "failed"
