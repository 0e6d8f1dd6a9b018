"""The demo: an EmDash-shaped database driven by the real Dagster definitions."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine, func, select
from sqlalchemy.engine import make_url

from . import cms, sample_content
from .processing.verify import verify_index
from .store import schema
from .store.engine import create_database_engine, redacted_url

DEMO_COLLECTIONS = (("articles", "art", 250), ("pages", "pag", 120), ("products", "pro", 80))


def run_demo(url: str, console: Console) -> int:
    """Build the demo database (3 collections of EmDash-shaped content), then run the jobs:
    activation, and the automatic lane until every collection's coverage is complete."""
    from .cli import collections_table

    engine = _prepare_demo_database(url)
    writer = cms.CmsWriter(engine)
    for slug, prefix, count in DEMO_COLLECTIONS:
        writer.create_collection(slug, sample_content.MEDIA_FIELDS)
        writer.insert_entries(slug, sample_content.sample_entries(prefix, count))
        _add_drafts_and_trash(writer, slug, prefix, count)
    console.print(f"Demo database: [bold]{redacted_url(engine.url)}[/]")
    console.print(collections_table(engine))
    _run_demo_jobs(url, console)
    console.print(collections_table(engine))
    report = verify_index(engine)
    console.print(f"verify: {'drift found' if report.has_drift else 'no drift'}")
    return 1 if report.has_drift else 0


def _run_demo_jobs(url: str, console: Console) -> None:
    import dagster as dg

    from .definitions import defs
    from .local_runner import quiet_run_config, run_lane
    from .resources.automation import MediaUsageAutomation
    from .resources.database import MediaUsageDatabase

    resources = {"database": MediaUsageDatabase(url=url), "automation": MediaUsageAutomation()}
    with dg.instance_for_test() as instance:
        activation = defs.resolve_job_def("media_usage_activation").execute_in_process(
            instance=instance, resources=resources, run_config=quiet_run_config()
        )
        console.print(
            f"job media_usage_activation: {'success' if activation.success else 'failed'}"
        )
        runs = run_lane(instance, resources, log_level="WARNING")
    table = Table(title="Runs requested by the sensors")
    for header in ("job", "partition", "success", "outcome"):
        table.add_column(header)
    for run in runs:
        if run.job_name != "partitions":
            table.add_row(
                run.job_name, run.partition_key or "-", str(run.success), run.outcome or "-"
            )
    console.print(table)


def _prepare_demo_database(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        for suffix in ("", "-wal", "-shm"):
            Path(parsed.database + suffix).unlink(missing_ok=True)
    engine = create_database_engine(url)
    with engine.begin() as connection:
        schema.install_schema(connection)
        existing = connection.execute(select(func.count()).select_from(schema.collections))
        if existing.scalar_one():
            raise click.ClickException(
                "The demo needs an empty database; this one already holds collections."
            )
    return engine


def _add_drafts_and_trash(writer: cms.CmsWriter, slug: str, prefix: str, count: int) -> None:
    for index in range(0, count, 9):
        entry = sample_content.sample_entry(prefix, index)
        writer.save_draft(slug, entry["id"], sample_content.draft_revision_data(entry))
    for index in range(4, count, 25):
        writer.trash_entry(slug, sample_content.sample_entry(prefix, index)["id"])
