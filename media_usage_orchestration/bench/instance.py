"""The Dagster instance a benchmark's runs go through: the one a deployment on the measured
database would use. On PostgreSQL that is instance storage in PostgreSQL, as
deploy/dagster.yaml configures it (here in a scratch database on the same server, dropped
afterwards); on SQLite it is Dagster's local default, SQLite files under a temporary
DAGSTER_HOME, as `make dev` runs.

`bench_instance` is an in-process test instance (the lanes execute runs in this process);
`deployed_settings` is the whole `dagster.yaml` of a temporary DAGSTER_HOME that a real daemon
reads: deploy/dagster.yaml with that storage in place of the deployment's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import yaml

from media_usage_orchestration.bench.database import is_postgres_url
from media_usage_orchestration.emdash_double.scratch import scratch_database

DEPLOY_INSTANCE_YAML = Path(__file__).resolve().parents[2] / "deploy" / "dagster.yaml"


@contextlib.contextmanager
def instance_storage(database_url: str) -> Iterator[dict]:
    """The `storage` settings of the bench's instance: none on SQLite (the local default), a
    scratch PostgreSQL database beside the measured one otherwise, dropped on exit."""
    if not is_postgres_url(database_url):
        yield {}
        return
    with scratch_database(database_url, "media_usage_bench_dagster") as storage:
        # dagster-postgres speaks psycopg2 (deploy/dagster.yaml names the scheme for the same
        # reason); the schema search path of the measured database is not carried over.
        url = storage.set(drivername="postgresql+psycopg2", query={})
        yield {"storage": {"postgres": {"postgres_url": url.render_as_string(False)}}}


@contextlib.contextmanager
def bench_instance(database_url: str) -> Iterator[dg.DagsterInstance]:
    with (
        instance_storage(database_url) as overrides,
        dg.instance_for_test(overrides=overrides or None) as instance,
    ):
        yield instance


@contextlib.contextmanager
def deployed_settings(database_url: str) -> Iterator[dict]:
    """deploy/dagster.yaml as a deployment runs it (queue, limits, monitoring, retries, sensor
    threads), its storage replaced by the bench's."""
    settings = yaml.safe_load(DEPLOY_INSTANCE_YAML.read_text("utf-8"))
    settings.pop("storage", None)
    with instance_storage(database_url) as storage:
        yield {**settings, **storage}


__all__ = ["DEPLOY_INSTANCE_YAML", "bench_instance", "deployed_settings", "instance_storage"]
