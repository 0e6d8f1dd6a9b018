"""A collection's coverage over time in the Dagster UI, in headless Chromium, on a demo
instance: the Plots of `media_usage_coverage/articles` after several work runs, and a deleted
collection's key leaving the catalog on "Reload definitions"."""

from __future__ import annotations

import re

import dagster as dg
from dagster_graphql import DagsterGraphQLClient
from playwright.sync_api import expect

from media_usage_orchestration.assets.coverage_history import coverage_history_key
from media_usage_orchestration.demo import DELETED_COLLECTION
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.emdash_double.sample_content import sample_entry
from tests.acceptance.browser.test_ui_browser import WORK_JOB, ui  # noqa: F401  (the module's own demo)
from tests.acceptance.browser.test_ui_browser import pytestmark as ui_browser_marks
from tests.dagster.test_coverage_check import SHOWN

# One webserver at a time, the browser marks of the module whose demo fixture this reuses.
pytestmark = ui_browser_marks
PLOTTED = (*SHOWN, "duration_seconds")
CATALOG = "/assets?groups=media_usage_coverage"


def test_a_collections_plots_show_its_numbers_over_time(ui):  # noqa: F811
    writer = CmsWriter(ui.engine)
    for index in range(3):
        writer.insert_entry("articles", sample_entry("art", 900 + index))
        run = ui.wait_for_run(ui.webserver.submit_job_execution(WORK_JOB))
        assert run.status is dg.DagsterRunStatus.SUCCESS, ui.webserver.stderr_tail()
    records = ui.instance.fetch_materializations(
        coverage_history_key("articles"), limit=100, ascending=True
    ).records
    entries = [record.asset_materialization.metadata["entries"].value for record in records]
    assert len(entries) >= 4 and entries[-3:] == [entries[-4] + 1, entries[-4] + 2, entries[-4] + 3]

    with ui.page("coverage_history_plots") as page:
        page.goto(ui.url("/assets/media_usage_coverage/articles"))
        page.get_by_role("button", name=re.compile("Plots")).first.click()
        for name in PLOTTED:
            expect(page.get_by_text(name, exact=True).first).to_be_visible()


def test_a_deleted_collection_leaves_the_catalog_on_reload(ui):  # noqa: F811
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
