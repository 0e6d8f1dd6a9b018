"""The Dagster UI in a real browser: headless Chromium (Debian's, never a downloaded build)
driven by Playwright, against a `dagster-webserver` subprocess on a demo instance.

`.ci/run` installs Chromium when it is missing and sets MEDIA_USAGE_REQUIRE_BROWSER=1, which
turns a missing browser into a failure; elsewhere the browser tests are skipped without one.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from playwright.sync_api import Browser, Page
from sqlalchemy import Engine

from tests.dagster.test_webserver_smoke import Webserver
from tests.support.reconciliation_runs import PROJECT_ROOT

CHROMIUM = Path(os.environ.get("MEDIA_USAGE_CHROMIUM", "/usr/bin/chromium"))
# Git-ignored: what each browser test saw last, pass or fail.
SCREENSHOTS = PROJECT_ROOT / "ui-screenshots"
# The UI on a 2-core runner shared with other work can take long to render a page.
UI_TIMEOUT_MS = 120_000
RUN_SECONDS = 240
# The UI asks once whether to join its community; this is what its "Skip" remembers.
NUX_SEEN = "window.localStorage.setItem('communityNux', JSON.stringify('1'))"
LOCATION_PATH = "/locations/__repository__@media_usage_orchestration"


def require_chromium() -> None:
    if CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK):
        return
    problem = f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    if os.environ.get("MEDIA_USAGE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{problem} and MEDIA_USAGE_REQUIRE_BROWSER=1")
    pytest.skip(problem)


def launch_chromium(playwright) -> Browser:
    # As root (CI) Chromium refuses its sandbox; /dev/shm may be small in containers.
    return playwright.chromium.launch(
        executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"]
    )


@dataclass
class DemoUi:
    """One webserver on one demo instance and database, and the browser that looks at it."""

    webserver: Webserver
    instance: dg.DagsterInstance
    engine: Engine
    browser: Browser

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.webserver.port}{path}"

    @contextlib.contextmanager
    def page(self, name: str) -> Iterator[Page]:
        """A fresh browser context and page; its screenshot is saved as `name` however the
        test ends."""
        context = self.browser.new_context(viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(UI_TIMEOUT_MS)
        context.add_init_script(NUX_SEEN)
        page = context.new_page()
        try:
            yield page
        finally:
            SCREENSHOTS.mkdir(exist_ok=True)
            with contextlib.suppress(Exception):  # a screenshot never hides the real failure
                page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
            context.close()

    def wait_for_run(self, run_id: str) -> dg.DagsterRun:
        """The run once it has finished (its run worker is another process)."""
        deadline = time.monotonic() + RUN_SECONDS
        while not (run := self.instance.get_run_by_id(run_id)).is_finished:
            assert self.webserver.process.poll() is None, self.webserver.stderr_tail()
            assert time.monotonic() < deadline, (
                f"run {run_id} still {run.status.value} after {RUN_SECONDS} s"
                f"{self.webserver.stderr_tail()}"
            )
            time.sleep(0.5)
        return run


def run_link(page: Page, run_id: str):
    """The link to a run in a runs table (the UI shows the id's first 8 characters)."""
    return page.locator(f'a[href="/runs/{run_id}"]').first


def listed_run_ids(page: Page) -> set[str]:
    """The full ids of the runs a runs table links to."""
    hrefs = page.locator('a[href^="/runs/"]').evaluate_all(
        "links => links.map(link => link.getAttribute('href'))"
    )
    return {href.removeprefix("/runs/") for href in hrefs if href.count("/") == 2}
