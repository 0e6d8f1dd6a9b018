"""`media-usage demo` from the command line: what it refuses, before touching anything. The
demo itself runs end to end in tests/test_demo.py."""

from media_usage_orchestration.store import schema
from media_usage_orchestration.store.cms import CmsWriter
from media_usage_orchestration.store.schema import missing_tables
from tests.cli.cli_support import EXIT_PROBLEM, invoke
from tests.support import IMAGE_ONLY, snapshot


def test_demo_refuses_a_dagster_home_it_did_not_create(empty_db, tmp_path):
    home = tmp_path / "instance"
    (home / "storage").mkdir(parents=True)

    result = invoke(empty_db, "demo", "--dagster-home", str(home))

    assert result.exit_code == EXIT_PROBLEM, result.output
    assert "did not create" in result.output
    assert (home / "storage").is_dir() and not (home / ".media_usage_local_instance").exists()
    assert missing_tables(empty_db.engine) == [table.name for table in schema.EMDASH_TABLES]


def test_demo_refuses_a_database_that_already_holds_collections(db, tmp_path):
    """On SQLite too: only a file an earlier demo created is ever removed."""
    CmsWriter(db.engine).create_collection("posts", IMAGE_ONLY)
    before = snapshot(db.engine)

    result = invoke(db, "demo", "--dagster-home", str(tmp_path / ".dagster_home"))

    assert result.exit_code == EXIT_PROBLEM, result.output
    assert "needs an empty database" in result.output
    assert snapshot(db.engine) == before
