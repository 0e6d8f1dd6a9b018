from sqlalchemy import inspect, select

from media_usage_orchestration.store.core import schema


def test_install_creates_every_table_and_index_and_is_idempotent(empty_db):
    with empty_db.engine.begin() as connection:
        added = schema.install_schema(connection)
    assert "table _emdash_media_usage_work" in added
    with empty_db.engine.begin() as connection:
        assert schema.install_schema(connection) == []
    inspector = inspect(empty_db.engine)
    for table in schema.EMDASH_TABLES:
        assert table.name in inspector.get_table_names()
        names = {index["name"] for index in inspector.get_indexes(table.name)}
        assert {index.name for index in table.indexes} <= names


def test_seed_rows_are_dormant(db):
    with db.engine.connect() as connection:
        row = connection.execute(select(schema.activation)).mappings().one()
    assert row["state"] == "expanded"
    assert row["media_usage_maintenance_turn"] == 2
    assert row["created_at"].endswith("Z") and "T" in row["created_at"]
