"""Coverage history: the code location declares one asset `media_usage_coverage/<slug>` per
live collection, read from the registry when it loads (never by run workers), with its checks;
the queue sensor observes it with the numbers of the collection's partition, and no run
materializes it."""

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.code_pointer import CodePointer
from dagster._core.definitions.definitions_load_context import DefinitionsLoadContext
from dagster._core.definitions.reconstruct import (
    initialize_repository_def_from_pointer,
    reconstruct_repository_def_from_pointer,
)

from media_usage_orchestration.assets import coverage_history
from media_usage_orchestration.assets.coverage_history import (
    COVERAGE_HISTORY_GROUP,
    coverage_history_key,
)
from media_usage_orchestration.assets.index import MEDIA_USAGE_INDEX
from media_usage_orchestration.assets.index_drift import INDEX_MATCHES_CONTENT
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.sensors.queue import media_usage_queue_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV
from media_usage_orchestration.store.deletion.repository import DeletionRepository
from media_usage_orchestration.store.host.registry import read_live_collection_slugs_at
from media_usage_orchestration.values.errors import RegistryUnreadable
from tests.support.projection import canonical_key, processed_collection
from tests.support.reconciliation_runs import (
    PARTITIONS,
    activate_with_job,
    run_partition,
    write_collections,
)
from tests.support.sensor_loop import plain, resources

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LOCATION = CodePointer.from_module(
    "media_usage_orchestration.definitions", "media_usage_definitions", str(PROJECT_ROOT)
)
BASE_KEYS = set(defs.resolve_asset_graph().get_all_asset_keys())


@pytest.fixture(autouse=True)
def _restore_load_context() -> Iterator[None]:
    # Loading a code location installs a process-wide DefinitionsLoadContext.
    previous = DefinitionsLoadContext._instance
    yield
    DefinitionsLoadContext._instance = previous


def _load(monkeypatch, url: str):
    """The code location as the code server loads it, with the database at `url`."""
    monkeypatch.setenv(DATABASE_URL_ENV, url)
    return initialize_repository_def_from_pointer(LOCATION)


def _history_keys(repository) -> set[dg.AssetKey]:
    added = set(repository.asset_graph.get_all_asset_keys()) - BASE_KEYS
    return {key for key in added if key.path[0] == COVERAGE_HISTORY_GROUP}


def _unreadable(url: str):
    raise AssertionError(f"the registry was read at {url}")


def test_the_location_declares_one_asset_per_live_collection(db, monkeypatch):
    collections = write_collections(db.engine, {"alpha": 1, "beta": 1, "gamma": 1})
    DeletionRepository(db.engine).create_tombstone(collections["gamma"].id, "gamma", True)

    repository = _load(monkeypatch, db.url)

    assert _history_keys(repository) == {
        coverage_history_key("alpha"),
        coverage_history_key("beta"),
    }
    assert set(repository.asset_graph.get_all_asset_keys()) >= BASE_KEYS
    alpha = repository.asset_graph.get(coverage_history_key("alpha"))
    assert (alpha.group_name, alpha.partitions_def) == (COVERAGE_HISTORY_GROUP, None)
    assert "entries" in alpha.description and "observed" in alpha.description
    assert {(key.asset_key, key.name) for key in repository.asset_graph.asset_check_keys} >= {
        (coverage_history_key("alpha"), "coverage_complete"),
        (coverage_history_key("alpha"), "index_matches_content"),
    }
    # Every job of `defs` still loads unchanged.
    assert {job.name for job in repository.get_all_jobs()} >= {
        job.name for job in defs.resolve_all_job_defs()
    }


def test_each_collection_asset_has_an_index_check_that_runs_verify(db, monkeypatch):
    articles = processed_collection(db.engine)
    with db.engine.begin() as connection:
        lost = connection.execute(
            schema.occurrences.delete().where(
                schema.occurrences.c.source_key == canonical_key(articles, "art-e00001")
            )
        ).rowcount
    repository = _load(monkeypatch, db.url)
    check = dg.AssetCheckKey(coverage_history_key("articles"), INDEX_MATCHES_CONTENT)
    assert check in repository.asset_graph.asset_check_keys

    job = repository.get_implicit_global_asset_job_def()
    subset = job.get_subset(asset_check_selection={check}, asset_selection=set())
    result = subset.execute_in_process(resources=resources(db), raise_on_error=False)

    [evaluation] = result.get_asset_check_evaluations()
    assert (evaluation.asset_check_key, evaluation.passed) == (check, False)
    found = plain(evaluation.metadata)
    assert (found["entries_checked"], found["drift_found"]) == (8, lost)
    assert "art-e00001" in found["differences"] and "missing_occurrence" in found["differences"]


def test_without_a_schema_the_location_loads_the_base_definitions(empty_db, monkeypatch):
    with empty_db.engine.connect():  # the database exists (a SQLite file), with no tables
        pass
    assert read_live_collection_slugs_at(empty_db.url) == []

    repository = _load(monkeypatch, empty_db.url)

    assert set(repository.asset_graph.get_all_asset_keys()) == BASE_KEYS


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://nobody@127.0.0.1:1/none",  # nothing listens on port 1
        "mysql://nobody@localhost/none",  # a driver the project refuses
    ],
)
def test_an_unreachable_database_loads_the_base_definitions(monkeypatch, url, tmp_path, caplog):
    with pytest.raises(RegistryUnreadable):
        read_live_collection_slugs_at(url)
    assert set(_load(monkeypatch, url).asset_graph.get_all_asset_keys()) == BASE_KEYS
    assert "no coverage history assets: the registry is unreadable" in caplog.text
    missing_file = f"sqlite:///{tmp_path / 'absent.db'}"
    assert set(_load(monkeypatch, missing_file).asset_graph.get_all_asset_keys()) == BASE_KEYS
    assert not (tmp_path / "absent.db").exists()


def test_run_workers_rebuild_the_assets_without_reading_the_database(db, monkeypatch):
    write_collections(db.engine, {"alpha": 1, "beta": 1})
    loaded = _load(monkeypatch, db.url)
    monkeypatch.setattr(coverage_history, "read_live_collection_slugs_at", _unreadable)

    rebuilt = reconstruct_repository_def_from_pointer(LOCATION, loaded.repository_load_data)

    assert (
        _history_keys(rebuilt)
        == _history_keys(loaded)
        == {
            coverage_history_key("alpha"),
            coverage_history_key("beta"),
        }
    )


def test_a_reload_drops_a_deleted_collection(db, monkeypatch):
    write_collections(db.engine, {"alpha": 1, "beta": 1})
    assert coverage_history_key("beta") in _history_keys(_load(monkeypatch, db.url))
    with db.engine.begin() as connection:
        connection.exec_driver_sql("DELETE FROM _emdash_collections WHERE slug = 'beta'")

    assert _history_keys(_load(monkeypatch, db.url)) == {coverage_history_key("alpha")}


def test_the_queue_sensor_observes_the_collection_history_runs_only_its_partition(db):
    write_collections(db.engine, {"articles": 12, "pages": 5})
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        instance.add_dynamic_partitions(PARTITIONS, ["articles", "pages"])
        assert run_partition(db, instance, "articles").success
        observe(db, instance)

        partition = _metadata(instance, MEDIA_USAGE_INDEX, "articles")
        history = _metadata(instance, coverage_history_key("articles"))
        observed = _observed(instance, coverage_history_key("articles"))

    # Activation and the reconciliation each materialized the partition; no run materialized
    # the collection's own asset, which the sensor observed with the same numbers.
    assert len(partition) == 2 and history == []
    [latest] = observed
    shown = ("coverage", "entries", "sources", "occurrences", "pending_work", "failed_work")
    assert {name: latest[name] for name in shown} == {name: partition[-1][name] for name in shown}
    assert (latest["coverage"], latest["entries"], latest["sources"]) == ("complete", 12, 12)
    assert partition[-1]["duration_seconds"] >= 0


def observe(db, instance) -> None:
    with dg.build_sensor_context(instance=instance, resources=resources(db)) as context:
        data = media_usage_queue_sensor.evaluate_tick(context)
    for event in data.asset_events:
        instance.report_runless_asset_event(event)


def _observed(instance, key: dg.AssetKey) -> list[dict]:
    records = instance.fetch_observations(key, limit=100, ascending=True).records
    return [plain(record.asset_observation.metadata) for record in records]


def _metadata(instance, key: dg.AssetKey, partition: str | None = None) -> list[dict]:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None),
        limit=100,
        ascending=True,
    ).records
    return [plain(record.asset_materialization.metadata) for record in records]


def test_a_deletion_request_wipes_the_collection_history_only(db):
    write_collections(db.engine, {"articles": 3, "pages": 3})
    request = defs.resolve_job_def("request_collection_deletion")
    with dg.DagsterInstance.ephemeral() as instance:
        activate_with_job(db, instance)
        observe(db, instance)
        assert _observed(instance, coverage_history_key("pages"))

        result = request.execute_in_process(
            instance=instance,
            resources=resources(db),
            run_config={
                "ops": {"request_deletion": {"config": {"collection": "pages", "force": True}}}
            },
        )

        assert result.success
        # The catalog lists keys with stored events: the deleted collection's has none left.
        assert coverage_history_key("pages") not in instance.all_asset_keys()
        assert len(_observed(instance, coverage_history_key("articles"))) == 1
