"""Without Chromium the browser tests are skipped, unless CI requires them; CI's script
keeps an installed Chromium and fails in one line where it can neither find nor install one."""

import os
import shutil
import subprocess

import pytest

from tests.support import browser as browser_support
from tests.support.reconciliation_runs import PROJECT_ROOT


def test_a_missing_chromium_skips_unless_the_browser_is_required(tmp_path, monkeypatch):
    monkeypatch.setattr(browser_support, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.delenv("MEDIA_USAGE_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no Chromium at"):
        browser_support.require_chromium()

    monkeypatch.setenv("MEDIA_USAGE_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="MEDIA_USAGE_REQUIRE_BROWSER=1"):
        browser_support.require_chromium()


def test_an_installed_chromium_is_used(tmp_path, monkeypatch):
    chromium = tmp_path / "chromium"
    chromium.write_text("#!/bin/sh\n")
    chromium.chmod(0o755)
    monkeypatch.setattr(browser_support, "CHROMIUM", chromium)
    monkeypatch.setenv("MEDIA_USAGE_REQUIRE_BROWSER", "1")
    browser_support.require_chromium()  # neither skips nor fails


def _ci_chromium(chromium, *prefix: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prefix, "bash", str(PROJECT_ROOT / ".ci" / "chromium")],
        env={**os.environ, "MEDIA_USAGE_CHROMIUM": str(chromium)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_ci_keeps_an_installed_chromium(tmp_path):
    chromium = tmp_path / "chromium"
    chromium.write_text("#!/bin/sh\n")
    chromium.chmod(0o755)

    done = _ci_chromium(chromium)

    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_ci_without_chromium_and_without_root_fails_with_one_line(tmp_path):
    # As root, drop to an unprivileged user: root would install Chromium with apt-get.
    prefix = ()
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is needed to run the script unprivileged")
        prefix = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")

    done = _ci_chromium(tmp_path / "no-chromium", *prefix)

    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"ci: no Chromium at {tmp_path / 'no-chromium'} and it could not be installed "
        "(as root: apt-get install -y chromium)"
    ]
