"""EmDash's own database, activated and reconciled by the project's Dagster jobs, reaches
EmDash's own end state.

SQLite: a copy of `emdash-fixture.db` (created by EmDash). PostgreSQL: a twin, the same
collections (ids, slugs, fields), entries and coverage rows loaded into a fresh schema with
the project's installer and CMS writer. Both run the activation job, then the reconciliation
and work sensors and the runs they ask for until neither asks for anything, and must equal
`emdash-reference-end-state.json` and `emdash-reference-source-fingerprints.json`.
"""

import json
import shutil
from collections.abc import Iterator

import dagster as dg
import pytest
from sqlalchemy import Engine, create_engine, func, select, text
from ulid import ULID

from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, FieldSpec, SubField
from media_usage_orchestration.jobs import media_usage_activation
from media_usage_orchestration.media.fingerprints import field_fingerprint
from media_usage_orchestration.partitions import media_usage_collections
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.work.content_reads import load_fields
from media_usage_orchestration.sensors.reconciliation import media_usage_reconciliation_sensor
from media_usage_orchestration.sensors.work import media_usage_work_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import create_database_engine
from tests.fixtures import FIXTURE_DB, REFERENCE_END_STATE, REFERENCE_FINGERPRINTS
from tests.support.emdash_fence import restore_fence
from tests.support.projection_gc import age_occurrences, gc_until_quiet
from tests.support.sensor_loop import drain, output_metadata, resources_for, step_report
from tests.support.states import all_rows, count, one, status_row
from tests.support.triggers import create_trigger

FIELD_FINGERPRINT = (
    "media-usage-fields:v1:sha256:9c4d23f9605c5ae1ab09446b89dd88458742ec1d19eee62ed02d109a31befd58"
)
SLUGS = ("coll_0", "coll_1")
SOURCE_COLUMNS = (
    "source_key",
    "source_type",
    "collection_slug",
    "content_id",
    "source_variant",
    "locale",
    "content_slug",
    "content_title",
    "content_status",
    "content_deleted_at",
    "source_completeness",
    "last_error_code",
)
OCCURRENCE_COLUMNS = (
    "field_slug",
    "field_path",
    "occurrence_index",
    "reference_type",
    "media_id",
    "provider",
    "provider_asset_id",
    "media_kind",
    "mime_type",
)

# --- the PostgreSQL twin ----------------------------------------------------------------------


def _field_specs(rows) -> list[FieldSpec]:
    specs = []
    for row in rows:
        subs: tuple[SubField, ...] = ()
        if row["validation"]:
            subs = tuple(
                SubField(item["slug"], item["type"], item.get("label", ""))
                for item in json.loads(row["validation"]).get("subFields", [])
            )
        specs.append(FieldSpec(row["slug"], row["type"], row["label"] or "", subs))
    return specs


def _load_twin(source: Engine, target: Engine) -> None:
    """Copy the fixture's collections, entries, revisions and coverage rows, as EmDash stored
    them, into a freshly installed database."""
    writer = CmsWriter(target)
    with source.connect() as connection:
        registry = connection.execute(
            select(
                schema.collections.c.id, schema.collections.c.slug, schema.collections.c.label
            ).order_by(schema.collections.c.slug)
        ).all()
        for collection_id, slug, label in registry:
            fields = _field_specs(
                connection.execute(
                    select(schema.fields)
                    .where(schema.fields.c.collection_id == collection_id)
                    .order_by(schema.fields.c.sort_order)
                ).mappings()
            )
            writer.create_collection(slug, fields, collection_id=collection_id, label=label)
            json_columns = {
                spec.slug for spec in fields if spec.type in ("portableText", "repeater")
            }
            rows = [
                {
                    key: json.loads(value) if key in json_columns and value is not None else value
                    for key, value in row.items()
                }
                for row in connection.execute(text(f'SELECT * FROM "ec_{slug}" ORDER BY id'))
                .mappings()
                .all()
            ]
            writer.insert_entries(slug, rows)
        revisions = [dict(row) for row in connection.execute(select(schema.revisions)).mappings()]
        statuses = [dict(row) for row in connection.execute(select(schema.index_status)).mappings()]
    with target.begin() as connection:
        if revisions:
            connection.execute(schema.revisions.insert(), revisions)
        connection.execute(schema.index_status.delete())
        connection.execute(schema.index_status.insert(), statuses)


# --- observing the run ------------------------------------------------------------------------


def _log_field_fingerprints(engine: Engine) -> None:
    """Record every field fingerprint written to a reconciliation row while the jobs run."""
    table = schema.reconciliations.name
    with engine.begin() as connection:
        connection.execute(
            text("CREATE TABLE test_field_fingerprints (collection_id TEXT, fingerprint TEXT)")
        )
    for event in ("INSERT", "UPDATE"):
        create_trigger(
            engine,
            f"test_log_field_fingerprint_{event.lower()}",
            table=table,
            event=f"AFTER {event}",
            when="NEW.field_fingerprint IS NOT NULL",
            action="INSERT INTO test_field_fingerprints "
            "VALUES (NEW.collection_id, NEW.field_fingerprint)",
        )


def _logged_field_fingerprints(engine: Engine) -> dict[str, set[str]]:
    logged: dict[str, set[str]] = {}
    with engine.connect() as connection:
        for collection_id, fingerprint in connection.execute(
            text("SELECT collection_id, fingerprint FROM test_field_fingerprints")
        ):
            logged.setdefault(collection_id, set()).add(fingerprint)
    return logged


# --- the end state, as the reference files describe it ----------------------------------------


def _normalized(key: str, collection_ids: dict[str, str]) -> str:
    for slug, collection_id in collection_ids.items():
        key = key.replace(f":{collection_id}:", f":<{slug}>:")
    return key


def _occurrence_order(occurrence: dict) -> str:
    return json.dumps(occurrence, sort_keys=True)


def _end_state(engine: Engine, collection_ids: dict[str, str]) -> list[dict]:
    sources = sorted(all_rows(engine, schema.sources), key=lambda row: row["source_key"])
    occurrences: dict[tuple[str, str], list[dict]] = {}
    for row in all_rows(engine, schema.occurrences):
        occurrences.setdefault((row["source_key"], row["generation"]), []).append(
            {column: row[column] for column in OCCURRENCE_COLUMNS}
        )
    state = []
    for row in sources:
        item = {column: row[column] for column in SOURCE_COLUMNS}
        item["source_key"] = _normalized(row["source_key"], collection_ids)
        current = occurrences.get((row["source_key"], row["current_generation"]), [])
        item["occurrences"] = sorted(current, key=_occurrence_order)
        state.append(item)
    return sorted(state, key=lambda item: item["source_key"])


def _reference_state() -> list[dict]:
    reference = json.loads(REFERENCE_END_STATE.read_text("utf-8"))
    assert reference["orphanOrStaleOccurrenceRows"] == 0
    state = []
    for item in reference["sources"]:
        entry = {column: item[column] for column in SOURCE_COLUMNS}
        entry["occurrences"] = sorted(
            (
                {column: occurrence[column] for column in OCCURRENCE_COLUMNS}
                for occurrence in item["occurrences"]
            ),
            key=_occurrence_order,
        )
        state.append(entry)
    return sorted(state, key=lambda item: item["source_key"])


def _orphan_or_stale_occurrences(engine: Engine) -> int:
    occurrences, sources = schema.occurrences, schema.sources
    current = select(sources.c.source_key).where(
        sources.c.source_key == occurrences.c.source_key,
        sources.c.current_generation == occurrences.c.generation,
    )
    with engine.connect() as connection:
        return connection.execute(
            select(func.count()).select_from(occurrences).where(~current.exists())
        ).scalar_one()


def _finalized(result: dg.ExecuteInProcessResult) -> str | None:
    if not any(event.step_key == "finalize_coverage" for event in result.all_node_events):
        return None
    return step_report(result.all_events, "finalize_coverage")["outcome"]


# --- the test ---------------------------------------------------------------------------------


@pytest.fixture
def emdash_database(db, tmp_path) -> Iterator[tuple[str, Engine]]:
    """(URL, engine) of EmDash's database: the fixture file on SQLite, its twin on PostgreSQL."""
    copy = tmp_path / "emdash-fixture.db"
    shutil.copyfile(FIXTURE_DB, copy)
    if db.is_postgres:
        fixture = create_engine(f"sqlite:///{copy}")
        try:
            _load_twin(fixture, db.engine)
        finally:
            fixture.dispose()
        yield db.url, db.engine
        return
    engine = create_database_engine(f"sqlite:///{copy}")
    restore_fence(engine)
    yield f"sqlite:///{copy}", engine
    engine.dispose()


def test_emdash_database_reaches_emdash_end_state_through_the_jobs(emdash_database):
    url, engine = emdash_database
    with engine.connect() as connection:
        collection_ids = dict(
            connection.execute(select(schema.collections.c.slug, schema.collections.c.id)).all()
        )
        entries = {
            slug: connection.execute(text(f'SELECT COUNT(*) FROM "ec_{slug}"')).scalar_one()
            for slug in SLUGS
        }
    assert sorted(collection_ids) == list(SLUGS) and entries == {"coll_0": 200, "coll_1": 200}
    with engine.connect() as connection:
        for slug in SLUGS:
            discovery = load_fields(connection, slug, collection_ids[slug])
            assert field_fingerprint(discovery) == FIELD_FINGERPRINT
    _log_field_fingerprints(engine)
    resources = resources_for(url)

    with dg.DagsterInstance.ephemeral() as instance:
        activation = media_usage_activation.execute_in_process(
            instance=instance, resources={"database": resources["database"]}
        )
        activated = output_metadata(activation, "activate_capture")
        assert (activated["outcome"], activated["collections_activated"]) == ("active", 2)
        for slug in SLUGS:
            status = status_row(engine, slug)
            assert (status["capture_state"], status["reconciliation_required"]) == ("active", 1)

        drained = drain(
            instance, resources, [media_usage_reconciliation_sensor, media_usage_work_sensor]
        )

        # Activation recorded each collection's coverage, which adds its partition.
        assert sorted(instance.get_dynamic_partitions(media_usage_collections.name)) == list(SLUGS)
        assert drained.partitions_added == []
        reconciliations = drained.of(media_usage_reconciliation_sensor)
        completed = sorted(
            run.dagster_run.tags["media_usage/collection"]
            for run in reconciliations
            if _finalized(run) == "completed"
        )
        assert completed == list(SLUGS)
        assert drained.skip_messages == {
            media_usage_reconciliation_sensor.name: "no collection needs a reconciliation run now",
            media_usage_work_sensor.name: "no due work",
        }

    assert _logged_field_fingerprints(engine) == {
        collection_ids[slug]: {FIELD_FINGERPRINT} for slug in SLUGS
    }
    for slug in SLUGS:
        status = status_row(engine, slug)
        assert (status["status"], status["reconciliation_required"], status["cursor"]) == (
            "complete",
            0,
            None,
        )
        assert status["last_error_code"] is None
    assert count(engine, schema.work) == 0
    assert count(engine, schema.reconciliations) == 0
    assert count(engine, schema.collection_deletions) == 0

    actual = _end_state(engine, collection_ids)
    expected = _reference_state()
    assert len(actual) == len(expected) == 400
    assert sum(len(item["occurrences"]) for item in actual) == 2268
    assert [item["source_key"] for item in actual] == [item["source_key"] for item in expected]
    mismatched = [
        item["source_key"] for item, wanted in zip(actual, expected, strict=True) if item != wanted
    ]
    assert mismatched == []
    assert _orphan_or_stale_occurrences(engine) == 0

    fingerprints = {
        _normalized(row["source_key"], collection_ids): row["source_fingerprint"]
        for row in all_rows(engine, schema.sources)
    }
    reference = json.loads(REFERENCE_FINGERPRINTS.read_text("utf-8"))
    assert fingerprints == reference
    assert not verify_index(engine).has_drift

    _projection_gc_keeps_the_end_state(engine, collection_ids, expected)


def _projection_gc_keeps_the_end_state(engine: Engine, collection_ids, expected) -> None:
    """Leftovers past the safety window (a superseded copy of some sources' occurrences and
    rows of a source that no longer exists) are reaped under the fence; the current
    generations, and so EmDash's end state, stay exactly as they were."""
    occurrences = schema.occurrences
    with engine.connect() as connection:
        current = [
            dict(row) for row in connection.execute(select(occurrences).limit(40)).mappings()
        ]
    leftovers = [
        {**row, "id": str(ULID()), "generation": "00" + row["generation"][2:]} for row in current
    ] + [{**row, "id": str(ULID()), "source_key": "gone:" + row["source_key"]} for row in current]
    with engine.begin() as connection:
        connection.execute(occurrences.insert(), leftovers)
    age_occurrences(engine)
    results = gc_until_quiet(engine)
    assert sum(r.counters.deleted_orphans for r in results) == len(current)
    assert sum(r.deleted_rows for r in results) == 2 * len(current)
    assert _orphan_or_stale_occurrences(engine) == 0
    assert _end_state(engine, collection_ids) == expected
    assert one(engine, schema.cleanup_fence, task_key="projection_gc") is not None
    assert not verify_index(engine).has_drift
