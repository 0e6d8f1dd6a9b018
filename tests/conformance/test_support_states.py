from media_usage_orchestration.store.core import schema
from tests.support.states import (
    backdate,
    count,
    db_now,
    make_collection,
    set_activation,
    status_row,
)


def test_support_builds_an_active_collection_and_backdates(db):
    set_activation(db.engine)
    collection = make_collection(db.engine, "posts")
    row = status_row(db.engine, "posts")
    assert row["collection_id"] == collection.id
    assert row["capture_state"] == "active" and row["reconciliation_required"] == 1
    assert count(db.engine, schema.collections, slug="posts") == 1
    assert backdate(db.engine, schema.index_status, "updated_at", 60, scope_key="posts") == 1
    assert status_row(db.engine, "posts")["updated_at"] < db_now(db.engine, -59)
