import dagster as dg

from media_usage_orchestration.definitions import defs
from media_usage_orchestration.resources.database import MediaUsageDatabase


def test_definitions_load():
    dg.Definitions.validate_loadable(defs)


def test_database_resource_never_shows_a_password(monkeypatch):
    monkeypatch.setenv("MEDIA_USAGE_DATABASE_URL", "postgresql://app:s3cret@db.example/cms")
    resource = MediaUsageDatabase()
    assert "s3cret" not in resource.display_url
    assert "s3cret" not in repr(resource)
    assert resource.resolved_url().endswith("/cms")
