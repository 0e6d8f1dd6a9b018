"""Capture and projection end to end, through Dagster: the activation job, then content
writes of every kind, then `media_usage_work_sensor` ticks and the `media_usage_work` runs they
ask for, until the sensor has nothing left to ask; the index must then equal the content."""

import dagster as dg
from dagster._core.remote_origin import (
    InProcessCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from sqlalchemy import text

from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_TAG, OUTCOME_TAG
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import (
    MEDIA_FIELDS,
    draft_revision_data,
    sample_entries,
)
from media_usage_orchestration.jobs import media_usage_activation, media_usage_work
from media_usage_orchestration.local import in_process_lane
from media_usage_orchestration.media.sources import source_key
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.resources.automation import WORK_LINGER_ENV
from media_usage_orchestration.sensors.common import COLLECTION_ID_TAG
from media_usage_orchestration.sensors.work import media_usage_work_sensor
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.sources.writes import SourceRepository
from tests.support.projection import active_collection, insert_entry
from tests.support.sensor_loop import (
    RUN_KEY_TAG,
    drain,
    evaluate,
    execute_request,
    output_metadata,
    resources_for,
)
from tests.support.states import all_rows, backdate, count, status_row

SLUGS = ("articles", "pages", "products")
PER_COLLECTION = 100
ITEMS_PER_RUN = 60

# Entry indexes (per collection) and what happens to them.
DELETED_BEFORE_PROJECTION = range(0, 5)
EDITED_BEFORE_PROJECTION = range(5, 10)
EDITED = range(10, 30)
TRASHED = range(30, 40)
DELETED = range(40, 50)
DRAFTED = range(50, 70)
DRAFTED_THEN_TRASHED = range(60, 65)
EDITED_THEN_DELETED = range(25, 30)


def _content_id(slug: str, index: int) -> str:
    return f"{slug}-e{index:05d}"


def _work_runs(instance, resources) -> list[dg.ExecuteInProcessResult]:
    """Tick and run until the sensor skips; every request's config is validated."""
    drained = drain(instance, resources, [media_usage_work_sensor])
    keys = drained.run_keys.get(media_usage_work_sensor.name, [])
    assert len(keys) == len(set(keys)), "a run key repeated while work was still due"
    assert drained.skip_messages[media_usage_work_sensor.name] == "no due work"
    return drained.of(media_usage_work_sensor)


def _totals(runs) -> dict[str, int]:
    totals: dict[str, int] = {}
    for result in runs:
        metadata = output_metadata(result, "drain_due_work")
        assert metadata["claimed"] <= ITEMS_PER_RUN
        for name in ("claimed", "completed", "retry", "failed", "superseded", "obsolete"):
            totals[name] = totals.get(name, 0) + metadata[name]
    return totals


def _assert_one_collection_each(instance, results, collections) -> None:
    """Every work run claimed one collection's items and is found by its collection tag, with
    what it did in its tags: `projected` and the counts."""
    slug_of = {collection.id: slug for slug, collection in collections.items()}
    for result in results:
        run = instance.get_run_by_id(result.run_id)
        config = run.run_config["ops"]["drain_due_work"]["config"]
        metadata = output_metadata(result, "drain_due_work")
        assert run.tags[COLLECTION_TAG] == slug_of[config["collection_id"]]
        assert run.tags[OUTCOME_TAG] == "projected"
        assert run.tags["media_usage/completed"] == str(metadata["completed"])
        assert run.tags["media_usage/claimed"] == str(metadata["claimed"])
        assert run.tags["media_usage/failed"] == "0"
        tagged = instance.get_runs(
            filters=dg.RunsFilter(tags={COLLECTION_TAG: run.tags[COLLECTION_TAG]})
        )
        assert run.run_id in {found.run_id for found in tagged}


def _current_occurrences(engine, key: str) -> list[dict]:
    source = SourceRepository(engine).find_source(key)
    assert source is not None, key
    return all_rows(
        engine, schema.occurrences, source_key=key, generation=source.current_generation
    )


def test_activation_then_sensor_driven_work_runs_project_every_write(db):
    writer = CmsWriter(db.engine)
    collections = {slug: writer.create_collection(slug, MEDIA_FIELDS) for slug in SLUGS}
    resources = resources_for(
        db.url, max_work_runs=2, work_items_per_run=ITEMS_PER_RUN, work_batch_size=20
    )
    with dg.DagsterInstance.ephemeral() as instance:
        activation = media_usage_activation.execute_in_process(
            instance=instance, resources={"database": resources["database"]}
        )
        activated = output_metadata(activation, "activate_capture")
        assert (activated["outcome"], activated["collections_activated"]) == ("active", 3)

        entries = {slug: sample_entries(slug, PER_COLLECTION) for slug in SLUGS}
        for slug in SLUGS:
            writer.insert_entries(slug, entries[slug])
            for index in DELETED_BEFORE_PROJECTION:
                writer.delete_entry(slug, _content_id(slug, index))
            for index in EDITED_BEFORE_PROJECTION:
                writer.update_entry(slug, _content_id(slug, index), {"title": f"early {index}"})
        assert count(db.engine, schema.work) == len(SLUGS) * PER_COLLECTION

        first = _work_runs(instance, resources)

        # One run per collection at a time: 100 items each, 60 a run.
        assert len(first) == 6
        _assert_one_collection_each(instance, first, collections)
        assert _totals(first) == {
            "claimed": 300,
            "completed": 300,
            "retry": 0,
            "failed": 0,
            "superseded": 0,
            "obsolete": 0,
        }
        assert count(db.engine, schema.work) == 0
        assert not verify_index(db.engine).has_drift

        drafts: dict[str, str] = {}
        for slug in SLUGS:
            for index in EDITED:
                writer.update_entry(
                    slug,
                    _content_id(slug, index),
                    {"hero": {"id": f"edited-{slug}-{index}", "mimeType": "image/png"}},
                )
            for index in TRASHED:
                writer.trash_entry(slug, _content_id(slug, index))
            for index in DELETED:
                writer.delete_entry(slug, _content_id(slug, index))
            for index in DRAFTED:
                content_id = _content_id(slug, index)
                drafts[content_id] = writer.save_draft(
                    slug, content_id, draft_revision_data(entries[slug][index])
                )
            for index in DRAFTED_THEN_TRASHED:
                writer.trash_entry(slug, _content_id(slug, index))
            for index in EDITED_THEN_DELETED:
                writer.delete_entry(slug, _content_id(slug, index))

        second = _work_runs(instance, resources)

        touched = len({*EDITED, *TRASHED, *DELETED, *DRAFTED})
        assert _totals(second)["completed"] == len(SLUGS) * touched
        assert _totals(second)["claimed"] == len(SLUGS) * touched
        assert len(second) == 3
        _assert_one_collection_each(instance, second, collections)
        runs = instance.get_runs(filters=dg.RunsFilter(job_name=media_usage_work.name))
        assert len(runs) == 9
        assert len({run.tags[RUN_KEY_TAG] for run in runs}) == 9

    assert count(db.engine, schema.work) == 0
    report = verify_index(db.engine)
    assert not report.has_drift, report.differences[:5]
    assert report.pending_work_count == 0
    # Generations replaced by the second round wait for the projection GC; nothing else may.
    current = {
        row["source_key"]: row["current_generation"] for row in all_rows(db.engine, schema.sources)
    }
    replaced_keys = {
        row["source_key"]
        for row in all_rows(db.engine, schema.occurrences)
        if current.get(row["source_key"]) != row["generation"]
    }
    assert report.abandoned_occurrence_count > 0
    assert {key.split(":")[2] for key in replaced_keys} <= {
        _content_id(slug, index) for slug in SLUGS for index in (*EDITED, *TRASHED, *DRAFTED)
    }

    deleted = {*DELETED_BEFORE_PROJECTION, *DELETED, *EDITED_THEN_DELETED}
    sources = SourceRepository(db.engine)
    for slug, collection in collections.items():
        status = status_row(db.engine, slug)
        assert status["capture_state"] == "active"
        assert status["last_incremental_success_at"] is not None
        # Never reconciled: incremental work alone does not make coverage trusted.
        assert (status["reconciliation_required"], status["status"]) == (1, "never")
        for index in range(PER_COLLECTION):
            content_id = _content_id(slug, index)
            columns = source_key(collection.id, content_id, "columns")
            overlay = source_key(collection.id, content_id, "draft_overlay")
            if index in deleted:
                assert sources.find_source(columns) is None
                assert sources.find_source(overlay) is None
                continue
            projected = sources.find_source(columns)
            assert projected is not None, content_id
            trashed = index in TRASHED or index in DRAFTED_THEN_TRASHED
            assert (projected.content_deleted_at is not None) is trashed
            hero = {
                row["media_id"]
                for row in _current_occurrences(db.engine, columns)
                if row["field_slug"] == "hero"
            }
            if index in EDITED:
                assert hero == {f"edited-{slug}-{index}"}
            if index in DRAFTED:
                draft = sources.find_source(overlay)
                assert draft is not None and draft.revision_id == drafts[content_id]
                draft_hero = {
                    row["media_id"]
                    for row in _current_occurrences(db.engine, overlay)
                    if row["field_slug"] == "hero"
                }
                assert draft_hero == {f"{content_id}-draft"}
            else:
                assert sources.find_source(overlay) is None
        live = PER_COLLECTION - len(deleted)
        assert count(db.engine, schema.sources, collection_id=collection.id) == live + len(DRAFTED)
    for slug in SLUGS:
        for index in deleted:
            for variant in ("columns", "draft_overlay"):
                key = source_key(collections[slug].id, _content_id(slug, index), variant)
                assert count(db.engine, schema.occurrences, source_key=key) == 0


def test_the_run_key_follows_the_due_set_and_the_sensor_skips_when_nothing_is_due(db, monkeypatch):
    posts = active_collection(db.engine, "posts")
    resources = resources_for(db.url, max_work_runs=1, work_items_per_run=1)
    with dg.DagsterInstance.ephemeral() as instance:
        skipped = evaluate(media_usage_work_sensor, instance, resources)
        assert (skipped.run_requests, skipped.skip_message) == ([], "no due work")

        insert_entry(db.engine, "posts", "entry-1")
        insert_entry(db.engine, "posts", "entry-2")
        backdate(db.engine, schema.work, "next_attempt_at", 60, content_id="entry-1")

        first = evaluate(media_usage_work_sensor, instance, resources)
        again = evaluate(media_usage_work_sensor, instance, resources)
        assert len(first.run_requests) == len(again.run_requests) == 1
        request = first.run_requests[0]
        assert request.run_key == again.run_requests[0].run_key
        assert request.run_key.startswith(f"work:{posts.id}:")
        assert request.tags["media_usage/workflow"] == "work"
        config = request.run_config["ops"]["drain_due_work"]["config"]
        assert (config["max_items"], config["linger_seconds"], config["max_work_runs"]) == (1, 0, 1)
        # Unset, the environment leaves the automation resource's linger in place.
        monkeypatch.delenv(WORK_LINGER_ENV)
        lingering = resources_for(db.url, work_linger_seconds=45)
        [asked] = evaluate(media_usage_work_sensor, instance, lingering).run_requests
        assert asked.run_config["ops"]["drain_due_work"]["config"]["linger_seconds"] == 45

        result = execute_request(media_usage_work_sensor, request, instance, resources)
        assert output_metadata(result, "drain_due_work")["completed"] == 1
        assert [row["content_id"] for row in all_rows(db.engine, schema.work)] == ["entry-2"]

        after = evaluate(media_usage_work_sensor, instance, resources)
        assert len(after.run_requests) == 1
        assert after.run_requests[0].run_key != request.run_key

        # A write to the entry that is due next moves the due set: a new key again.
        CmsWriter(db.engine).update_entry("posts", "entry-2", {"title": "edited"})
        moved = evaluate(media_usage_work_sensor, instance, resources)
        assert moved.run_requests[0].run_key not in {request.run_key, after.run_requests[0].run_key}

        execute_request(media_usage_work_sensor, moved.run_requests[0], instance, resources)
        assert count(db.engine, schema.work) == 0
        done = evaluate(media_usage_work_sensor, instance, resources)
        assert (done.run_requests, done.skip_message) == ([], "no due work")


def _queued_origin() -> RemoteJobOrigin:
    """Queued runs must say where their code lives (the run queue launches them from there);
    Dagster's own origin classes, as pinned (1.13.27)."""
    location = InProcessCodeLocationOrigin(
        loadable_target_origin=LoadableTargetOrigin(
            module_name="media_usage_orchestration.definitions"
        )
    )
    return RemoteJobOrigin(
        repository_origin=RemoteRepositoryOrigin(location, "__repository__"),
        job_name=media_usage_work.name,
    )


def test_the_sensor_respects_max_work_runs_for_queued_and_running_runs(db):
    active_collection(db.engine, "posts")
    insert_entry(db.engine, "posts", "entry-1")
    one_run = resources_for(db.url, max_work_runs=1)
    two_runs = resources_for(db.url, max_work_runs=2, work_runs_per_collection=2)
    with dg.DagsterInstance.ephemeral() as instance:
        idle = evaluate(media_usage_work_sensor, instance, one_run).run_requests[0]
        queued = _created(instance, idle, dg.DagsterRunStatus.QUEUED)

        capped = evaluate(media_usage_work_sensor, instance, one_run)
        assert capped.run_requests == []
        assert capped.skip_message == (
            "work is due in 1 collection(s), but 1 work runs are already queued or running"
        )

        # A queued run drains what is due when it starts: never a second one beside it.
        waiting = evaluate(media_usage_work_sensor, instance, two_runs)
        assert waiting.run_requests == []
        assert waiting.skip_message == (
            "work is due in 1 collection(s), each with its work run queued or running"
        )
        # Once it runs, work_runs_per_collection=2 lets a second one run beside it.
        instance.report_run_canceled(queued)
        running = _created(instance, idle, dg.DagsterRunStatus.STARTED)
        second = evaluate(media_usage_work_sensor, instance, two_runs).run_requests
        assert len(second) == 1 and second[0].run_key != idle.run_key
        started = _created(instance, second[0], dg.DagsterRunStatus.STARTED)
        full = evaluate(media_usage_work_sensor, instance, two_runs)
        assert full.run_requests == []
        assert full.skip_message == (
            "work is due in 1 collection(s), but 2 work runs are already queued or running"
        )

        # Finished runs do not count against the cap.
        instance.report_run_canceled(running)
        instance.report_run_failed(started)
        assert len(evaluate(media_usage_work_sensor, instance, one_run).run_requests) == 1
    assert count(db.engine, schema.work) == 1


def _created(instance, request: dg.RunRequest, status: dg.DagsterRunStatus) -> dg.DagsterRun:
    """The run the daemon would create for `request`, in `status`."""
    return instance.create_run_for_job(
        job_def=media_usage_work,
        run_config=request.run_config,
        status=status,
        tags={**request.tags, RUN_KEY_TAG: request.run_key},
        remote_job_origin=_queued_origin(),
    )


def test_each_collection_gets_its_own_run_earliest_due_first_one_at_a_time(db):
    """`work_runs_per_collection` (1) holds a collection back while its run is in flight; the
    other collections are served, earliest due first, up to `max_work_runs`."""
    posts = active_collection(db.engine, "posts")
    pages = active_collection(db.engine, "pages")
    notes = active_collection(db.engine, "notes")
    for slug in ("posts", "pages", "notes"):
        insert_entry(db.engine, slug, f"{slug}-1")
    backdate(db.engine, schema.work, "next_attempt_at", 60, collection_id=pages.id)
    backdate(db.engine, schema.work, "updated_at", 60, collection_id=pages.id)
    resources = resources_for(db.url, max_work_runs=2)
    with dg.DagsterInstance.ephemeral() as instance:
        requests = evaluate(media_usage_work_sensor, instance, resources).run_requests
        slugs = [request.tags[COLLECTION_TAG] for request in requests]
        assert slugs[0] == "pages" and len(slugs) == 2 and len(set(slugs)) == 2
        ids = {request.tags[COLLECTION_ID_TAG] for request in requests}
        assert ids <= {posts.id, pages.id, notes.id}
        for request in requests:
            config = request.run_config["ops"]["drain_due_work"]["config"]
            assert config["collection_id"] == request.tags[COLLECTION_ID_TAG]
            _created(instance, request, dg.DagsterRunStatus.STARTED)

        held = evaluate(media_usage_work_sensor, instance, resources)
        assert held.run_requests == []
        # A third collection waits for a slot; a collection in flight waits for its run.
        roomier = resources_for(db.url, max_work_runs=3)
        [third] = evaluate(media_usage_work_sensor, instance, roomier).run_requests
        assert third.tags[COLLECTION_TAG] not in slugs

        result = execute_request(media_usage_work_sensor, third, instance, roomier)
        run = instance.get_run_by_id(result.run_id)
        assert (run.tags[OUTCOME_TAG], run.tags["media_usage/completed"]) == ("projected", "1")
        # It claimed its own collection's item only: the two in flight still have theirs.
        assert {row["collection_id"] for row in all_rows(db.engine, schema.work)} == ids


def test_after_a_run_fails_or_is_canceled_without_progress_the_key_changes(db):
    """The daemon never launches a key it has seen, whatever that run's status: if a run
    that claimed nothing kept its key, the due work would never be asked for again."""
    active_collection(db.engine, "posts")
    insert_entry(db.engine, "posts", "entry-1")
    resources = resources_for(db.url)
    with dg.DagsterInstance.ephemeral() as instance:
        request = evaluate(media_usage_work_sensor, instance, resources).run_requests[0]
        with db.engine.begin() as connection:
            connection.execute(text("ALTER TABLE _emdash_media_usage_work RENAME TO moved_work"))
        failed = in_process_lane.execute_request(
            instance, resources, media_usage_work.name, request
        )
        assert not failed.success
        with db.engine.begin() as connection:
            connection.execute(text("ALTER TABLE moved_work RENAME TO _emdash_media_usage_work"))
        assert all_rows(db.engine, schema.work)[0]["state"] == "pending"

        after_failure = evaluate(media_usage_work_sensor, instance, resources).run_requests
        assert len(after_failure) == 1
        assert after_failure[0].run_key != request.run_key
        # Stable again until something else happens.
        assert (
            evaluate(media_usage_work_sensor, instance, resources).run_requests[0].run_key
            == after_failure[0].run_key
        )

        queued = _created(instance, after_failure[0], dg.DagsterRunStatus.QUEUED)
        instance.report_run_canceled(queued)
        after_cancel = evaluate(media_usage_work_sensor, instance, resources).run_requests
        assert after_cancel[0].run_key not in {request.run_key, after_failure[0].run_key}

        done = execute_request(media_usage_work_sensor, after_cancel[0], instance, resources)
        assert output_metadata(done, "drain_due_work")["completed"] == 1
    assert count(db.engine, schema.work) == 0
