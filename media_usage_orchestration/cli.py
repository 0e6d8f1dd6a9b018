"""`media-usage`: the operator's command line."""

from __future__ import annotations

import sys
import warnings

import click
from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine, func, select

from .bench import bench
from .processing.verify import VerifyReport, verify_index
from .store import schema
from .store.engine import create_database_engine, default_database_url, redacted_url
from .store.identifiers import content_table_name

console = Console()


def _engine(url: str | None) -> Engine:
    return create_database_engine(url or default_database_url())


@click.group()
def main() -> None:
    """Keep an EmDash database's media usage index true and delete collections safely."""
    warnings.filterwarnings("ignore", category=Warning, module="dagster")


main.add_command(bench)


@main.command()
@click.option("--database-url", envvar="MEDIA_USAGE_DATABASE_URL", default=None)
def init(database_url: str | None) -> None:
    """Install (or complete) EmDash's media usage schema; safe to repeat."""
    engine = _engine(database_url)
    with engine.begin() as connection:
        added = schema.install_schema(connection)
    console.print(f"[bold]{redacted_url(engine.url)}[/]: {len(added)} objects added")
    for item in added:
        console.print(f"  + {item}")


@main.command()
@click.option("--database-url", envvar="MEDIA_USAGE_DATABASE_URL", default=None)
def status(database_url: str | None) -> None:
    """Show every collection with its entries and index coverage."""
    engine = _engine(database_url)
    console.print(collections_table(engine))


@main.command()
@click.option("--database-url", envvar="MEDIA_USAGE_DATABASE_URL", default=None)
def demo(database_url: str | None) -> None:
    """Build the demo database and run the real jobs on it until every collection is covered."""
    from .demo import run_demo

    sys.exit(run_demo(database_url or default_database_url(), console))


@main.command()
@click.option("--database-url", envvar="MEDIA_USAGE_DATABASE_URL", default=None)
@click.option(
    "--collection",
    "collection_slugs",
    multiple=True,
    help="Only this collection (repeatable); default: every captured collection.",
)
@click.option("--limit", default=200, show_default=True, help="Differences to print at most.")
def verify(database_url: str | None, collection_slugs: tuple[str, ...], limit: int) -> None:
    """Recompute the index from the content and compare; exit 1 on any drift."""
    report = verify_index(_engine(database_url), collection_slugs or None)
    console.print(verify_summary_table(report))
    if report.has_drift:
        console.print(verify_differences_table(report, limit))
        console.print(f"[bold red]{len(report.differences)} differences[/]")
        sys.exit(1)
    console.print("[bold green]No drift[/]: the index equals what extraction computes.")


def verify_summary_table(report: VerifyReport) -> Table:
    table = Table(title="Media usage index verification")
    for header in ("collection", "entries", "sources", "abandoned rows", "pending work"):
        table.add_column(header)
    for summary in report.collections:
        table.add_row(
            summary.collection_slug,
            str(summary.entry_count),
            str(summary.source_count),
            str(summary.abandoned_occurrence_count),
            str(summary.pending_work_count),
        )
    return table


def verify_differences_table(report: VerifyReport, limit: int) -> Table:
    shown = report.differences[: max(limit, 0)]
    hidden = len(report.differences) - len(shown)
    caption = f"{hidden} more not shown" if hidden > 0 else None
    table = Table(title="Differences", caption=caption)
    table.add_column("kind", no_wrap=True)
    for header in ("collection", "entry", "source", "detail"):
        table.add_column(header, overflow="fold")
    for difference in shown:
        table.add_row(
            difference.kind.value,
            difference.collection_slug,
            difference.content_id or "-",
            difference.source_key or "-",
            difference.detail,
        )
    return table


def collections_table(engine: Engine) -> Table:
    table = Table(title="Collections")
    for header in ("collection", "id", "entries", "drafts", "trashed", "coverage", "capture"):
        table.add_column(header)
    status = schema.index_status
    with engine.connect() as connection:
        registry = connection.execute(
            select(schema.collections.c.id, schema.collections.c.slug).order_by(
                schema.collections.c.slug
            )
        ).all()
        for collection_id, slug in registry:
            counts = _entry_counts(connection, slug)
            row = connection.execute(
                select(status.c.status, status.c.capture_state).where(
                    status.c.scope_key == slug, status.c.adapter_id == schema.CONTENT_ADAPTER_ID
                )
            ).first()
            coverage, capture = (row.status, row.capture_state) if row else ("-", None)
            table.add_row(slug, collection_id, *map(str, counts), coverage, capture or "legacy")
    return table


def _entry_counts(connection, slug: str) -> tuple[int, int, int]:
    content = schema.content_table(slug)
    name = content_table_name(slug)
    assert content.name == name
    return connection.execute(
        select(
            func.count(),
            func.count(content.c.draft_revision_id),
            func.count(content.c.deleted_at),
        ).select_from(content)
    ).one()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
