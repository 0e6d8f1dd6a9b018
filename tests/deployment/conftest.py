"""The deployment tier: deploy/dagster.yaml unmodified on PostgreSQL, a real `dagster-daemon`,
a gRPC code server and the webserver (`tests/support/deployment.py`), driven as an operator
and an orchestrator would drive them: runs terminated from the UI, re-executed from failure,
run workers and the code server killed at chosen moments. Each module starts its own
deployment over a CMS database of its own and stops every process it started, by pid."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.databases import (
    TestDatabase,
    installed_database,
    postgres_schema,
    require_postgres,
)


@pytest.fixture(scope="module")
def cms() -> Iterator[TestDatabase]:
    """A PostgreSQL CMS database (a schema of its own) with EmDash's schema installed."""
    require_postgres()
    with postgres_schema() as url, installed_database("postgres", url) as database:
        yield database
