"""What an operator does in the Dagster UI, in headless Chromium, on a demo instance.

One `dagster-webserver` for the module serves `workspace.yaml` on a small demo (its SQLite
database and its own instance, made by `run_demo`); runs the UI launches go to a run worker
process each (the default run launcher and coordinator). The backfill dialog only stores a
backfill: the test then runs the backfill daemon's own iteration once, as `dagster-daemon`
would, over the same instance. Every test leaves a screenshot in `ui-screenshots/`.

The tests build on each other in file order, as one operator session: re-execute a demo run
of `articles`, fail a `pages` item for good, force a backfill of `articles`, find every
`articles` run through the tag filter, read the Plots of `media_usage_coverage/articles` after
several work runs, then delete `pages` and see its key leave the catalog on "Reload
definitions".
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._core.execution.backfill import BulkActionStatus
from dagster._core.storage.tags import BACKFILL_ID_TAG, PARTITION_NAME_TAG
from dagster_graphql import DagsterGraphQLClient
from playwright.sync_api import Page, expect, sync_playwright
from rich.console import Console

from media_usage_orchestration.assets.coverage_history import coverage_history_key
from media_usage_orchestration.assets.health import COVERAGE_CHECK
from media_usage_orchestration.assets.queue import queue_key
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.demo import DELETED_COLLECTION, DemoCollection, run_demo
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import sample_entry
from media_usage_orchestration.local.in_process_lane import execute_job
from media_usage_orchestration.ops.reconciliation import FORCE_TAG
from media_usage_orchestration.ops.work import COUNT_TAGS
from media_usage_orchestration.resources.automation import MediaUsageAutomation
from media_usage_orchestration.resources.database import MediaUsageDatabase
from media_usage_orchestration.sensors.common import COLLECTION_ID_TAG
from media_usage_orchestration.sensors.queue import media_usage_queue_sensor
from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV, create_database_engine
from media_usage_orchestration.store.host.registry import read_collection_id
from tests.dagster.test_coverage_check import SHOWN
from tests.dagster.test_webserver_smoke import INSTANCE_YAML, running_webserver
from tests.support.browser import (
    LOCATION_PATH,
    UI_TIMEOUT_MS,
    DemoUi,
    launch_chromium,
    listed_run_ids,
    require_chromium,
    run_link,
)
from tests.support.reconciliation_runs import (
    COLLECTION_TAG,
    COMPLETE_RUN,
    OUTCOME_TAG,
    RECONCILIATION_JOB,
    RESOURCE_LIMIT,
    backfill_runs,
    daemon_workspace,
    index_drift,
    lose_one_source,
    oversized_entry,
    run_events,
    step_outcomes,
)
from tests.support.states import status_row

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.filterwarnings(
        "ignore:Using variable_values and operation_name:DeprecationWarning"
    ),
]

DEMO = (
    DemoCollection("articles", "art", 12),
    DemoCollection("pages", "pag", 8),
    DemoCollection(DELETED_COLLECTION, "pro", 4),
)
JOB_PATH = f"{LOCATION_PATH}/jobs/{RECONCILIATION_JOB.name}"
WORK_JOB = "media_usage_work"
COVERAGE_KEY = dg.AssetCheckKey(coverage_history_key("pages"), COVERAGE_CHECK)
COMPLETED_TAG = COUNT_TAGS["completed"]
MEDIA_LIBRARY_KEY = dg.AssetKey("media_usage_media_library")


@pytest.fixture(scope="module")
def ui(tmp_path_factory) -> Iterator[DemoUi]:
    require_chromium()
    root = tmp_path_factory.mktemp("ui")
    home = root / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(INSTANCE_YAML)
    url = f"sqlite:///{root / 'media_usage.db'}"
    output = io.StringIO()
    assert run_demo(url, Console(file=output, width=120), home, DEMO) == 0, output.getvalue()
    engine = create_database_engine(url)
    with (
        pytest.MonkeyPatch.context() as environment,
        running_webserver(root, url, home) as webserver,
        dg.DagsterInstance.from_config(str(home)) as instance,
        sync_playwright() as playwright,
    ):
        environment.setenv(DATABASE_URL_ENV, url)  # for the backfill daemon's code server
        expect.set_options(timeout=UI_TIMEOUT_MS)
        browser = launch_chromium(playwright)
        try:
            yield DemoUi(webserver, instance, engine, browser)
        finally:
            browser.close()
            engine.dispose()


def _reconciliation_runs(ui: DemoUi, slug: str) -> list[dg.DagsterRun]:
    return ui.instance.get_runs(
        filters=dg.RunsFilter(job_name=RECONCILIATION_JOB.name, tags={PARTITION_NAME_TAG: slug})
    )


# --- (a) a demo run on its job's Runs tab, re-executed -----------------------------------------


def test_a_demo_run_is_on_its_jobs_runs_tab_and_re_execute_all_succeeds(ui):
    # The demo's own run: the other tests' runs of the same fixture are forced or re-executions.
    [demo_run] = [
        run
        for run in _reconciliation_runs(ui, "articles")
        if not run.parent_run_id and FORCE_TAG not in run.tags
    ]

    with ui.page("a_reexecute_all") as page:
        page.goto(ui.url(f"{JOB_PATH}/runs"))
        run_link(page, demo_run.run_id).click()
        page.wait_for_url(f"**/runs/{demo_run.run_id}")
        page.get_by_role("button", name=re.compile(r"^Re-execute all")).click()
        page.wait_for_url(re.compile(r"/runs/(?!" + demo_run.run_id + r")[0-9a-f-]{36}"))
        new_run_id = page.url.rsplit("/runs/", 1)[1].split("?")[0]
        rerun = ui.wait_for_run(new_run_id)
        expect(page.get_by_text("Success").first).to_be_visible()

    assert rerun.status is dg.DagsterRunStatus.SUCCESS, ui.webserver.stderr_tail()
    assert (rerun.parent_run_id, rerun.tags[COLLECTION_TAG]) == (demo_run.run_id, "articles")
    # Coverage was already complete: the re-executed run had nothing to do, and says so.
    assert rerun.tags[OUTCOME_TAG] == "already_complete"


# --- the demo's media library, with its unused count -------------------------------------------


def test_the_demos_media_library_page_shows_its_unused_count(ui):
    latest = ui.instance.get_latest_materialization_event(MEDIA_LIBRARY_KEY)
    assert latest is not None, "the demo materializes the media library"
    unused = latest.asset_materialization.metadata["unused"].value
    assert unused > 0

    with ui.page("media_library") as page:
        page.goto(ui.url("/assets/media_usage_media_library"))
        # The overview's metadata of the latest materialization: the key, then its value.
        expect(page.get_by_text("unused", exact=True).first).to_be_visible()
        expect(page.get_by_text(re.compile(f"^({unused:,}|{unused})$")).first).to_be_visible()


# --- (b) an item failed for good fails the coverage check ------------------------------------


def test_an_item_failed_for_good_fails_the_coverage_check_without_a_run(ui):
    CmsWriter(ui.engine).insert_entry("pages", oversized_entry("oversized"))
    work = ui.wait_for_run(ui.webserver.submit_job_execution(WORK_JOB))
    assert work.status is dg.DagsterRunStatus.SUCCESS, ui.webserver.stderr_tail()
    assert status_row(ui.engine, "pages")["status"] != "complete"
    _observe_the_queues(ui)  # the checks' one writer
    latest = ui.instance.get_latest_asset_check_evaluation_record(COVERAGE_KEY)
    assert (latest.evaluation.passed, latest.run_id) == (False, "")

    with ui.page("b_checks_tab") as page:
        page.goto(ui.url("/assets/media_usage_coverage/pages?view=checks"))
        page.get_by_text(COVERAGE_CHECK, exact=True).first.click()
        expect(_field(page, "Evaluation result")).to_contain_text("Failed")
        expect(page.get_by_text(f"({RESOURCE_LIMIT}: 1)").first).to_be_visible()
        _expect_history_starts_with(page, "Failed")
    with ui.page("b_asset_overview") as page:
        # The asset's overview: observed (not "never materialized"), with its checks' results
        # and the status numbers.
        page.goto(ui.url("/assets/media_usage_coverage/pages"))
        expect(page.get_by_text("Latest observation")).to_be_visible()
        expect(page.get_by_text("Latest check results")).to_be_visible()
        expect(page.get_by_text("MEDIA_USAGE_RESOURCE_LIMIT: 1").first).to_be_visible()


def _expect_history_starts_with(page: Page, verdict: str) -> None:
    """The check's execution history, newest first, starts with `verdict`."""
    page.get_by_role("tab", name="Execution history").click()
    expect(page.locator("tbody tr").first).to_contain_text(verdict)


def _observe_the_queues(ui: DemoUi) -> None:
    """One queue sensor tick, its events stored as the sensor daemon stores them."""
    url = ui.engine.url.render_as_string(hide_password=False)
    resources = {"database": MediaUsageDatabase.for_url(url), "automation": MediaUsageAutomation()}
    with dg.build_sensor_context(
        instance=ui.instance, resources=resources, definitions=defs
    ) as context:
        data = media_usage_queue_sensor.evaluate_tick(context)
    assert data.asset_events, data.skip_message
    for event in data.asset_events:
        ui.instance.report_runless_asset_event(event)


def test_an_item_failed_for_good_is_in_its_queue_assets_table_and_fails_its_check(ui):
    # Test (b) left `pages` with its oversized entry failed for good.
    _observe_the_queues(ui)
    observed = ui.instance.fetch_observations(queue_key("pages"), limit=1).records
    assert observed[0].asset_observation.metadata["failed"].value == 1

    with ui.page("queue_failed_item") as page:
        page.goto(ui.url("/assets/media_usage_queue/pages"))
        expect(page.get_by_text("failed_items", exact=True).first).to_be_visible()
        show = page.get_by_text("[Show Markdown]")
        if show.count():
            show.first.click()
        expect(page.get_by_text("oversized").first).to_be_visible()
        expect(page.get_by_text(RESOURCE_LIMIT).first).to_be_visible()
        page.keyboard.press("Escape")
        page.goto(ui.url("/assets/media_usage_queue/pages?view=checks"))
        expect(page.get_by_text("queue_healthy").first).to_be_visible()
        expect(_field(page, "Evaluation result")).to_contain_text("Failed")

    # The content fixed: the edit re-queues the entry, a work run projects it, the next tick
    # evaluates both checks passed, and every view of the UI says so.
    CmsWriter(ui.engine).update_entry("pages", "oversized", {"body": []})
    work = ui.wait_for_run(ui.webserver.submit_job_execution(WORK_JOB))
    assert work.status is dg.DagsterRunStatus.SUCCESS, ui.webserver.stderr_tail()
    _observe_the_queues(ui)
    assert ui.instance.get_latest_asset_check_evaluation_record(COVERAGE_KEY).evaluation.passed
    with ui.page("queue_recovered") as page:
        page.goto(ui.url("/assets/media_usage_coverage/pages?view=checks"))
        page.get_by_text(COVERAGE_CHECK, exact=True).first.click()
        expect(_field(page, "Evaluation result")).to_contain_text("Passed")
        _expect_history_starts_with(page, "Passed")
        page.goto(ui.url("/assets/media_usage_queue/pages?view=checks"))
        expect(_field(page, "Evaluation result")).to_contain_text("Passed")
        # The catalog presents the per-collection assets as observed, with the time.
        # (Two collections: a queue and a coverage asset each; no other asset is observed.)
        page.goto(ui.url("/assets"))
        expect(page.get_by_text("media_usage_queue / pages").first).to_be_visible()
        expect(page.get_by_text("Observed", exact=True)).to_have_count(4)


def _field(page: Page, label: str):
    """A labelled field of the check's latest execution (the label and its value)."""
    return page.locator(f"xpath=//span[normalize-space()='{label}']/..").first


# --- (c) a forced backfill from the dialog ---------------------------------------------------


def _launch_backfill_in_dialog(page: Page, slug: str, tags: dict[str, str]) -> None:
    page.get_by_role("button", name="Launch backfill…").click()
    dialog = page.get_by_role("dialog").filter(
        has_text="Launch media_usage_reconciliation backfill"
    )
    dialog.get_by_text("Select a partition or create one").click()
    page.get_by_role("menuitem").filter(has_text=re.compile(f"^{slug}")).click()
    dialog.get_by_text("Launch media_usage_reconciliation backfill").click()  # close the list
    # A complete collection's partition counts as completed, which the dialog leaves out
    # unless asked: keep every status.
    for status in ("Missing", "Failed", "Queued", "In progress", "Completed"):
        if not dialog.get_by_role("checkbox", name=re.compile(f"^{status} \\(")).is_checked():
            dialog.get_by_text(re.compile(f"^{status} \\(")).click()
    dialog.get_by_role("button", name="Add tags to backfill runs").click()
    for key, value in tags.items():
        page.get_by_placeholder("Tag Key").last.fill(key)
        page.get_by_placeholder("Tag Value").last.fill(value)
    page.get_by_role("button", name="Apply").click()
    for key, value in tags.items():
        expect(dialog.get_by_text(f"{key}: {value}")).to_be_visible()
    dialog.get_by_role("button", name="Submit 1 run").click()
    expect(dialog).to_have_count(0)


def _run_backfill_daemon(ui: DemoUi, backfill_id: str) -> list[dg.DagsterRun]:
    with daemon_workspace(ui.instance) as workspace:
        runs = backfill_runs(ui.instance, workspace, backfill_id)
    return [ui.wait_for_run(run.run_id) for run in runs]


def test_a_forced_backfill_from_the_dialog_re_reconciles_a_complete_collection(ui):
    assert status_row(ui.engine, "articles")["status"] == "complete"
    epoch = status_row(ui.engine, "articles")["change_epoch"]
    lose_one_source(ui.engine, "articles")
    known = {backfill.backfill_id for backfill in ui.instance.get_backfills()}

    with ui.page("c_forced_backfill") as page:
        page.goto(ui.url(f"{JOB_PATH}/partitions"))
        _launch_backfill_in_dialog(page, "articles", {FORCE_TAG: "true"})
        [backfill] = [b for b in ui.instance.get_backfills() if b.backfill_id not in known]
        assert (backfill.partition_names, backfill.tags.get(FORCE_TAG)) == (["articles"], "true")

        [run] = _run_backfill_daemon(ui, backfill.backfill_id)
        page.goto(ui.url(f"/runs/{run.run_id}"))
        # The run's last op reports its outcome on its `outcome` output (a structured event).
        expect(page.get_by_text('Yielded output "outcome"')).to_be_visible()
        expect(page.get_by_text("Success").first).to_be_visible()

    assert ui.instance.get_backfill(backfill.backfill_id).status in (
        BulkActionStatus.COMPLETED,
        BulkActionStatus.COMPLETED_SUCCESS,
    )
    assert run.status is dg.DagsterRunStatus.SUCCESS, ui.webserver.stderr_tail()
    assert (run.tags[BACKFILL_ID_TAG], run.tags[FORCE_TAG]) == (backfill.backfill_id, "true")
    assert step_outcomes(run_events(ui.instance, run.run_id)) == COMPLETE_RUN
    # Re-reconciled: a new epoch, and the source lost behind the index's back is back.
    status = status_row(ui.engine, "articles")
    assert (status["status"], status["reconciliation_required"]) == ("complete", 0)
    assert status["change_epoch"] > epoch
    assert index_drift(ui.engine, "articles") == []


# --- (d) every run of a collection through the tag filter -------------------------------------


def _force_reconciliation_in_process(ui: DemoUi, slug: str) -> None:
    """One more run of `slug`'s reconciliation, as an operator's forced Launchpad run, so the
    list holds more than the demo's run whichever tests ran before on this fixture."""
    url = ui.engine.url.render_as_string(hide_password=False)
    resources = {"database": MediaUsageDatabase.for_url(url), "automation": MediaUsageAutomation()}
    run = execute_job(
        ui.instance,
        resources,
        RECONCILIATION_JOB.name,
        partition_key=slug,
        tags={FORCE_TAG: "true"},
    )
    assert run.success, run


def _work_runs_of(ui: DemoUi, slug: str) -> list[dg.DagsterRun]:
    """The work runs the sensor asked for `slug` (their config names its collection)."""
    collection_id = read_collection_id(ui.engine, slug)
    return ui.instance.get_runs(
        filters=dg.RunsFilter(job_name=WORK_JOB, tags={COLLECTION_ID_TAG: collection_id})
    )


def test_the_runs_list_filtered_by_the_collection_tag_finds_every_run_of_it(ui):
    _force_reconciliation_in_process(ui, "articles")
    # Every run of `articles`, found without its tag: the runs of its partition (with the
    # backfill's when the backfill test ran before on this fixture) and the work runs the
    # sensor asked for during the demo's edit wave.
    reconciliations = {run.run_id for run in _reconciliation_runs(ui, "articles")}
    work_runs = _work_runs_of(ui, "articles")
    assert len(reconciliations) >= 2 and work_runs
    expected = reconciliations | {run.run_id for run in work_runs}
    tagged = ui.instance.get_runs(filters=dg.RunsFilter(tags={COLLECTION_TAG: "articles"}))
    assert {run.run_id for run in tagged} == expected
    projected = next(run for run in work_runs if run.tags[OUTCOME_TAG] == "projected")
    completed = projected.tags[COMPLETED_TAG]
    assert int(completed) > 0

    with ui.page("d_runs_by_collection_tag") as page:
        page.goto(ui.url("/runs"))
        # Runs launched by a backfill are hidden from the list unless asked for.
        page.get_by_text("Show runs within backfills").click()
        page.get_by_role("button", name="Filter").click()
        page.get_by_text("Tag", exact=True).click()
        page.get_by_text(COLLECTION_TAG, exact=True).click()
        page.get_by_role("menuitem", name="tag articles").click()
        page.keyboard.press("Escape")  # close the filter menu
        expect(page.get_by_text(f"{COLLECTION_TAG}=articles").first).to_be_visible()
        for run_id in expected:
            expect(run_link(page, run_id)).to_be_visible()
        listed = listed_run_ids(page)
        # The work run's tags read what it did: projected, with its count.
        expect(page.get_by_text(f"{OUTCOME_TAG}: projected").first).to_be_visible()
        expect(page.get_by_text(f"{COMPLETED_TAG}: {completed}").first).to_be_visible()

    assert listed == expected


# ==================================================================================================
# (e) a collection's coverage over time, and a deleted collection leaving the catalog
# ==================================================================================================


PLOTTED = SHOWN
CATALOG = "/assets?groups=media_usage_coverage"


def test_a_collections_plots_show_its_numbers_over_time(ui):
    writer = CmsWriter(ui.engine)
    for index in range(3):
        writer.insert_entry("articles", sample_entry("art", 900 + index))
        run = ui.wait_for_run(ui.webserver.submit_job_execution(WORK_JOB))
        assert run.status is dg.DagsterRunStatus.SUCCESS, ui.webserver.stderr_tail()
        _observe_the_queues(ui)
    records = ui.instance.fetch_observations(
        coverage_history_key("articles"), limit=100, ascending=True
    ).records
    entries = [record.asset_observation.metadata["entries"].value for record in records]
    assert len(entries) >= 3 and entries[-2:] == [entries[-3] + 1, entries[-3] + 2]

    with ui.page("coverage_history_plots") as page:
        page.goto(ui.url("/assets/media_usage_coverage/articles"))
        page.get_by_role("button", name=re.compile("Plots")).first.click()
        for name in PLOTTED:
            expect(page.get_by_text(name, exact=True).first).to_be_visible()


def test_a_deleted_collection_leaves_the_catalog_on_reload(ui):
    client = DagsterGraphQLClient("127.0.0.1", port_number=ui.webserver.port, timeout=60)
    request = {"ops": {"request_deletion": {"config": {"collection": "pages", "force": True}}}}
    with ui.webserver.answering("requesting the deletion of pages"):
        run_id = client.submit_job_execution("request_collection_deletion", run_config=request)
    assert ui.wait_for_run(run_id).status is dg.DagsterRunStatus.SUCCESS

    with ui.page("coverage_history_after_reload") as page:
        page.goto(ui.url(CATALOG))
        # Still defined: the location loaded while the collection existed.
        expect(page.get_by_text("media_usage_coverage / pages").first).to_be_visible()
        page.get_by_role("button", name=re.compile("Reload definitions")).first.click()
        expect(page.get_by_text("media_usage_coverage / pages")).to_have_count(0)
        page.reload()
        expect(page.get_by_text("media_usage_coverage / articles").first).to_be_visible()
        expect(page.get_by_text("media_usage_coverage / pages")).to_have_count(0)
        # The demo deleted its collection before this location ever loaded.
        expect(page.get_by_text(f"media_usage_coverage / {DELETED_COLLECTION}")).to_have_count(0)
