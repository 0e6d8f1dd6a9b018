"""Running `media-usage` verbs in-process against a test database."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner, Result

from media_usage_orchestration.cli import main
from media_usage_orchestration.emdash_double.cms_writer import Collection
from tests.support.states import make_collection, set_status, snapshot

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


def invoke(db, *arguments: str) -> Result:
    """The verb with `--database-url` pointing at the test database."""
    return CliRunner().invoke(main, [*arguments, "--database-url", db.url])


def invoke_json(db, *arguments: str, exit_code: int = EXIT_OK) -> Any:
    result = invoke(db, *arguments, "--json")
    assert result.exit_code == exit_code, result.output
    return json.loads(result.stdout)


def assert_refused(db, arguments: tuple[str, ...], message: str) -> Result:
    """Bad usage: exit 2, the message on stderr, and no row of any table changed."""
    before = snapshot(db.engine)
    result = invoke(db, *arguments)
    assert result.exit_code == EXIT_USAGE, (arguments, result.output)
    assert message in result.stderr, (arguments, result.stderr)
    assert result.stdout == "", arguments
    assert snapshot(db.engine) == before, arguments
    return result


def assert_all_refused(db, command: tuple[str, ...], cases: list[tuple[tuple[str, ...], str]]):
    """Every case of bad input on one database (a fresh one per case costs a second each)."""
    for arguments, message in cases:
        assert_refused(db, (*command, *arguments), message)


def assert_unchanged(db, arguments: tuple[str, ...], exit_code: int) -> Result:
    """A verb that must leave every table exactly as it found it."""
    before = snapshot(db.engine)
    result = invoke(db, *arguments)
    assert result.exit_code == exit_code, result.output
    assert snapshot(db.engine) == before
    return result


def trusted_collection(db, slug: str = "posts") -> Collection:
    """A current collection with capture active and complete (trusted) coverage."""
    collection = make_collection(db.engine, slug, status="complete", reconciliation_required=0)
    set_status(db.engine, slug, completed_at="2026-08-01T00:00:00.000Z")
    return collection


__all__ = [
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "assert_all_refused",
    "assert_refused",
    "assert_unchanged",
    "invoke",
    "invoke_json",
    "trusted_collection",
]
