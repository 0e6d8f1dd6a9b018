"""The database URL's password never reaches the terminal, not even in an error; a URL that
cannot be used is bad usage (exit 2), an unreachable database a problem (exit 1)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from media_usage_orchestration.cli import main, scrubbed
from tests.support.cli import EXIT_PROBLEM, EXIT_USAGE

PASSWORD = "s3cret"
UNREACHABLE = f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:1/test"


@pytest.mark.parametrize(
    "arguments",
    [
        ("status",),
        ("work", "list", "--collection", "posts"),
        ("reconciliations", "retry", "--collection", "posts"),
    ],
    ids=["status", "work-list", "reconciliation-retry"],
)
def test_an_unreachable_database_exits_1_without_the_password(arguments):
    result = CliRunner().invoke(main, [*arguments, "--database-url", UNREACHABLE])
    assert result.exit_code == EXIT_PROBLEM, result.output
    assert "Database error (OperationalError)" in result.stderr
    assert PASSWORD not in result.output


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (f"mysql://admin:{PASSWORD}@db/cms", "Unsupported database URL scheme 'mysql'"),
        (f"not a url {PASSWORD}", "Could not parse"),
        (f"postgresql+psycopg2://admin:{PASSWORD}@db/cms", "psycopg 3"),
    ],
    ids=["mysql", "unparsable", "psycopg2"],
)
def test_an_unusable_url_is_bad_usage_without_the_password(url, message):
    result = CliRunner().invoke(main, ["status", "--database-url", url])
    assert result.exit_code == EXIT_USAGE, result.output
    assert "Invalid value for '--database-url'" in result.stderr and message in result.stderr
    assert PASSWORD not in result.output


def test_bad_operator_input_is_refused_before_connecting():
    result = CliRunner().invoke(main, ["work", "list", "--collection", "posts", "--limit", "0"])
    assert result.exit_code == EXIT_USAGE and "from 1 to 100" in result.stderr


@pytest.mark.parametrize(
    "message",
    [
        f"failed for {UNREACHABLE}",
        f"password {PASSWORD} rejected",
        "conninfo host=db password=p%40ss",
        "see postgresql://someone:other-secret@elsewhere/db",
    ],
    ids=["whole-url", "alone", "setting", "another-url"],
)
def test_scrubbing_hides_the_password_however_it_is_spelled(message):
    url = f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1/test"
    shown = scrubbed(message, url)
    for secret in (PASSWORD, "p%40ss", "other-secret"):
        assert secret not in shown
    assert "***" in shown
