"""A code server or run process loading the project's definitions prints no Dagster preview or
beta warning, with every warning shown (`-W always`), on both dialects: the load reads the
registry to build the per-collection assets, and a run process loads, then executes."""

import os
import subprocess
import sys

import pytest

from media_usage_orchestration.store.core.engine import DATABASE_URL_ENV
from tests.support.reconciliation_runs import PROJECT_ROOT, write_collections

LOAD_AND_RUN = """
import dagster as dg
from media_usage_orchestration.definitions import media_usage_definitions

definitions = media_usage_definitions()
repository = definitions.get_repository_def()
assert len(repository.get_all_jobs()) > 5
job = definitions.resolve_job_def("media_usage_activation")
with dg.DagsterInstance.ephemeral() as instance:
    assert job.execute_in_process(instance=instance).success
print("loaded and ran")
"""


def _run_with_every_warning(url: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", LOAD_AND_RUN],
        cwd=PROJECT_ROOT,
        env={**os.environ, DATABASE_URL_ENV: url, "DAGSTER_HOME": ""},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
def test_loading_the_definitions_and_running_a_job_prints_no_preview_or_beta_warning(db):
    write_collections(db.engine, {"articles": 3})
    finished = _run_with_every_warning(db.url)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "loaded and ran" in finished.stdout
    for name in ("PreviewWarning", "BetaWarning", "is currently in preview", "in beta"):
        assert name not in finished.stderr, finished.stderr[-3000:]
