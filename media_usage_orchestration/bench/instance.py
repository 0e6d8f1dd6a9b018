"""The Dagster instance a benchmark's runs go through: the one a deployment on the measured
database would use. On PostgreSQL that is instance storage in PostgreSQL, as
deploy/dagster.yaml configures it (here in a scratch database on the same server, dropped
afterwards); on SQLite it is Dagster's local default, SQLite files under a temporary
DAGSTER_HOME, as `make dev` runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import dagster as dg

from media_usage_orchestration.bench.database import is_postgres_url
from media_usage_orchestration.emdash_double.scratch import scratch_database


@contextlib.contextmanager
def bench_instance(database_url: str) -> Iterator[dg.DagsterInstance]:
    if not is_postgres_url(database_url):
        with dg.instance_for_test() as instance:
            yield instance
        return
    with scratch_database(database_url, "media_usage_bench_dagster") as storage:
        # dagster-postgres speaks psycopg2 (deploy/dagster.yaml names the scheme for the same
        # reason); the schema search path of the measured database is not carried over.
        url = storage.set(drivername="postgresql+psycopg2", query={})
        overrides = {"storage": {"postgres": {"postgres_url": url.render_as_string(False)}}}
        with dg.instance_for_test(overrides=overrides) as instance:
            yield instance


__all__ = ["bench_instance"]
