"""Bad input to a collection deletion request (`SchemaRegistry.deleteCollection`) and to the
activated deletion path is refused before any SQL, on an engine of each dialect that never
connects: nothing can have changed."""

from __future__ import annotations

import pytest

from media_usage_orchestration.processing.deletion.processor import (
    delete_activated_collection,
    request_collection_deletion,
)
from media_usage_orchestration.values.errors import InvalidIdentifierError


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (
            lambda engine: request_collection_deletion(engine, "Bad-Slug", force=True),
            InvalidIdentifierError,
        ),
        (lambda engine: request_collection_deletion(engine, "posts", force="yes"), ValueError),
        (
            lambda engine: delete_activated_collection(
                engine, "posts", force_delete=True, front_phase_limit=0
            ),
            ValueError,
        ),
        (
            lambda engine: delete_activated_collection(
                engine, "posts", force_delete=True, front_phase_limit=4
            ),
            ValueError,
        ),
        (lambda engine: delete_activated_collection(engine, "posts", force_delete=1), ValueError),
    ],
    ids=["slug", "force", "limit-0", "limit-4", "force-int"],
)
def test_bad_input_is_refused_before_any_sql(no_sql_engine, call, error):
    with pytest.raises(error):
        call(no_sql_engine)
