"""`media-usage` against hostile input: secrets in URL query parameters, markup and control
characters in stored values, database errors in every verb (bench included), and read-only
verbs pointed at files they must not change. Every refusal is one line, no traceback, no
password, no token, and leaves every table (and a SQLite file's bytes) as it was."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import inspect, select, table, text

from media_usage_orchestration.cli import main
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter
from media_usage_orchestration.local.in_process_lane import LANE_SENSORS
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import redacted_url, scrubbed, url_secrets
from tests.support.cli import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, invoke, trusted_collection
from tests.support.operator_states import failed_work, leased_work
from tests.support.sensor_loop import evaluate, resources_for

PASSWORD = "S3cret-pw"
SECRET_QUERY = f"password={PASSWORD}&sslpassword={PASSWORD}2&passfile=/home/u/{PASSWORD}3"


def run(*arguments: str) -> Result:
    return CliRunner().invoke(main, list(arguments))


def every_table(engine) -> dict[str, list[tuple]]:
    """Every row of every table in the database (content tables included), sorted."""
    with engine.connect() as connection:
        names = sorted(inspect(connection).get_table_names())
        return {
            name: sorted(
                (
                    tuple(row)
                    for row in connection.execute(select(text("*")).select_from(table(name)))
                ),
                key=repr,
            )
            for name in names
        }


def live_tokens(engine) -> set[str]:
    """Every lease and run token stored in any of the project's tables."""
    tokens: set[str] = set()
    with engine.connect() as connection:
        for each in schema.EMDASH_TABLES:
            for column in each.columns:
                if column.name.endswith("token"):
                    found = connection.execute(select(column).where(column.is_not(None)))
                    tokens.update(str(value) for value in found.scalars())
    return tokens


def assert_one_line_refusal(
    result: Result, exit_code: int, *, secrets: set[str] = frozenset(), stdout: str = ""
):
    """The exact exit code, a single `Error:` line on stderr (after click's usage lines for
    exit 2), `stdout` (nothing unless told), no traceback, no secret anywhere."""
    assert result.exit_code == exit_code, result.output
    assert result.stdout.startswith(stdout) and (stdout or result.stdout == "")
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    if exit_code == EXIT_PROBLEM:
        assert result.stderr.strip() == errors[0]
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit), result.exception
    for secret in secrets:
        assert secret not in result.output


# --- 1. secrets in URL query parameters -------------------------------------------------------


def test_redaction_hides_every_password_bearing_part_of_a_url():
    url = f"postgresql+psycopg://u:{PASSWORD}x@db/cms?{SECRET_QUERY}&options=-c%20x%3D1&sslmode=require"
    shown = redacted_url(url)
    assert PASSWORD not in shown and "-c x=1" not in shown and "x%3D1" not in shown
    assert shown == (
        "postgresql+psycopg://u:***@db/cms?options=***&passfile=***&password=***"
        "&sslmode=require&sslpassword=***"
    )
    assert PASSWORD in "".join(url_secrets(url))
    message = f"failed: password={PASSWORD} in {url} (passfile={PASSWORD}3)"
    assert PASSWORD not in scrubbed(message, url)


def _with_secret_query(url: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{SECRET_QUERY}"


@pytest.mark.postgres_only("SQLite URLs take no password parameters")
def test_init_prints_the_url_without_its_query_password(empty_db):
    result = run("init", "--database-url", _with_secret_query(empty_db.url))
    assert result.exit_code == EXIT_OK, result.output
    assert "password=***" in result.stdout and "objects added" in result.stdout
    assert PASSWORD not in result.output


def test_an_unreachable_url_with_a_query_password_is_one_line_without_it():
    url = f"postgresql+psycopg://u@127.0.0.1:1/db?{SECRET_QUERY}"
    for verb in (("init",), ("status",), ("work", "retry", "--collection", "p", "--all-failed")):
        result = run(*verb, "--database-url", url)
        assert_one_line_refusal(result, EXIT_PROBLEM, secrets={PASSWORD})
        assert "Database error (OperationalError)" in result.stderr


@pytest.mark.postgres_only("SQLite URLs take no password parameters")
def test_the_demo_refuses_a_database_with_collections_without_its_query_password(db):
    trusted_collection(db)
    before = every_table(db.engine)
    result = run("demo", "--database-url", _with_secret_query(db.url))
    assert_one_line_refusal(result, EXIT_PROBLEM, secrets={PASSWORD})
    assert "already holds collections" in result.stderr and "password=***" in result.stderr
    assert every_table(db.engine) == before


@pytest.mark.parametrize("sensor", LANE_SENSORS, ids=lambda sensor: sensor.name)
def test_a_sensor_skip_message_hides_the_query_password(empty_db, sensor):
    url = _with_secret_query(empty_db.url) if empty_db.is_postgres else empty_db.url
    with dg.DagsterInstance.ephemeral() as instance:
        data = evaluate(sensor, instance, resources_for(url))
    assert "lacks the media usage schema" in data.skip_message
    assert PASSWORD not in data.skip_message
    if empty_db.is_postgres:
        assert "password=***" in data.skip_message


# --- 2. stored values are printed literally ---------------------------------------------------

HOSTILE_IDS = [
    "x[/]y",
    "[bold red]EVIL[/bold red]",
    "[link=https://evil.example]click[/link]",
]
ESCAPE_ID = "esc\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"


def test_work_list_prints_markup_and_control_characters_literally(db):
    posts = trusted_collection(db)
    for content_id in HOSTILE_IDS:
        result = invoke(db, "work", "retry", "--collection", "posts", "--content-id", content_id)
        assert result.exit_code == EXIT_OK, result.output
        assert content_id in result.stdout
    failed_work(db.engine, posts, ESCAPE_ID)
    claimed = leased_work(db.engine, posts, "entry-leased")

    result = invoke(db, "work", "list", "--collection", "posts")

    assert result.exit_code == EXIT_OK, result.output
    assert result.exception is None
    for content_id in HOSTILE_IDS:
        assert content_id in result.stdout
    assert "\x1b" not in result.output
    assert "esc\\x1b]8;;https://evil.example\\x1b\\click" in result.stdout
    assert claimed.lease_token not in result.output


def test_verify_prints_hostile_content_ids_literally(db):
    trusted_collection(db)
    # Entries written without capture: verify finds their index rows missing.
    CmsWriter(db.engine).insert_entries(
        "posts", [{"id": content_id, "hero": "media-1"} for content_id in HOSTILE_IDS]
    )

    result = invoke(db, "verify")

    assert result.exit_code == EXIT_PROBLEM, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert "differences" in result.stdout
    for content_id in HOSTILE_IDS:
        assert content_id in result.stdout


# --- 3. bench goes through the one error handler ----------------------------------------------


def test_bench_reports_an_unreachable_database_in_one_line():
    url = f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:1/test?{SECRET_QUERY}"
    result = run("bench", "--entries", "1", "--database-url", url)
    assert_one_line_refusal(result, EXIT_PROBLEM, secrets={PASSWORD})
    assert "Database error (OperationalError)" in result.stderr


def test_bench_refuses_a_sqlite_location_it_cannot_create_as_bad_usage(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = run("bench", "--entries", "1", "--database-url", f"sqlite:///{blocker}/bench.db")
    assert_one_line_refusal(result, EXIT_USAGE, stdout="bench database: ")
    assert "cannot create the directory" in result.stderr
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize("verb", [("demo",), ("bench", "--entries", "1"), ("init",), ("status",)])
def test_an_unsupported_url_is_one_line_of_bad_usage_in_every_verb(verb):
    result = run(*verb, "--database-url", f"mysql://u:{PASSWORD}@db/cms")
    assert_one_line_refusal(result, EXIT_USAGE, secrets={PASSWORD})
    assert "Unsupported database URL scheme 'mysql'" in result.stderr


# --- 4. verbs that only read change nothing ---------------------------------------------------

READ_VERBS = [
    ("status",),
    ("verify",),
    ("work", "list", "--collection", "posts"),
    ("deletions", "list"),
    ("reconciliations", "list"),
]
# With failed work in the database, `status` reports it (exit 1); the others just list.
READ_VERB_EXIT = {"status": EXIT_PROBLEM}
READ_VERB_IDS = ["status", "verify", "work-list", "deletions-list", "reconciliations-list"]


@pytest.mark.parametrize("verb", READ_VERBS, ids=READ_VERB_IDS)
def test_a_read_verb_changes_no_row_and_no_byte(db, verb):
    posts = trusted_collection(db)
    failed_work(db.engine, posts, "entry-1")
    leased_work(db.engine, posts, "entry-2")
    tokens = live_tokens(db.engine)
    before = every_table(db.engine)
    db.engine.dispose()  # the last connection checkpoints a SQLite WAL into the file
    sqlite_file = Path(db.engine.url.database) if not db.is_postgres else None
    file_before = sqlite_file.read_bytes() if sqlite_file else None

    result = invoke(db, *verb)

    assert result.exit_code == READ_VERB_EXIT.get(verb[0], EXIT_OK), result.output
    assert "Traceback" not in result.output
    assert every_table(db.engine) == before
    if sqlite_file:
        db.engine.dispose()
        assert sqlite_file.read_bytes() == file_before
    for token in tokens:
        assert token not in result.output


@pytest.mark.parametrize("verb", READ_VERBS, ids=READ_VERB_IDS)
def test_a_read_verb_on_a_missing_sqlite_file_creates_nothing(tmp_path, verb):
    missing = tmp_path / "typo" / "media_usage.db"
    result = run(*verb, "--database-url", f"sqlite:///{missing}")
    assert_one_line_refusal(result, EXIT_USAGE)
    assert f"no SQLite database file at {missing}" in result.stderr
    assert list(tmp_path.iterdir()) == []


def _other_application_file(path: Path) -> bytes:
    """A SQLite file in rollback-journal mode that is not an EmDash database."""
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    connection.execute("INSERT INTO notes (body) VALUES ('keep me')")
    connection.commit()
    connection.close()
    return path.read_bytes()


@pytest.mark.parametrize("verb", READ_VERBS, ids=READ_VERB_IDS)
@pytest.mark.parametrize("kind", ["empty", "other-application"])
def test_a_read_verb_leaves_a_foreign_sqlite_file_as_it_was(tmp_path, verb, kind):
    path = tmp_path / "other.db"
    if kind == "empty":
        path.write_bytes(b"")
        original = b""
    else:
        original = _other_application_file(path)

    result = run(*verb, "--database-url", f"sqlite:///{path}")

    assert_one_line_refusal(result, EXIT_PROBLEM)
    assert "is the schema installed? Run `media-usage init`" in result.stderr
    assert path.read_bytes() == original
    assert sorted(each.name for each in tmp_path.iterdir()) == ["other.db"]  # no -wal, no -shm
    if kind != "empty":
        connection = sqlite3.connect(path)
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        connection.close()


def test_a_read_verb_cannot_write_through_its_engine(db):
    """Defence in depth: the read-only engine refuses a write on either dialect."""
    from media_usage_orchestration.store.core.engine import create_database_engine

    engine = create_database_engine(db.url, read_only=True)
    try:
        with (
            pytest.raises(Exception, match=r"(?i)read.?only"),
            engine.begin() as connection,
        ):
            connection.execute(schema.activation.delete())
    finally:
        engine.dispose()
    assert _count_rows(db.engine, schema.activation.name) > 0


def _count_rows(engine, name: str) -> Any:
    with engine.connect() as connection:
        return connection.execute(text(f'SELECT count(*) FROM "{name}"')).scalar_one()
