"""The bench's fresh database and its content: one collection of N sample entries.

Every measurement starts from a fresh database: a new SQLite file in a temporary directory, or
a new schema `bench_<random>` on a PostgreSQL server (selected through the URL's `search_path`
option and dropped afterwards).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import click
from rich.console import Console

from media_usage_orchestration.emdash_double import sample_content
from media_usage_orchestration.emdash_double.cms_writer import CmsWriter, Collection
from media_usage_orchestration.emdash_double.scratch import scratch_schema
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.store.core.engine import (
    URL,
    ArgumentError,
    Engine,
    normalize_url,
    scrubbed,
)
from media_usage_orchestration.store.core.schema import install_schema
from media_usage_orchestration.store.reads.coverage import read_collection_coverage

COLLECTION_SLUG = "articles"
ENTRY_PREFIX = "art"
INSERT_CHUNK = 1000

console = Console(soft_wrap=True)


@contextlib.contextmanager
def fresh_database(database_url: str | None, keep: bool) -> Iterator[str]:
    """A URL of an empty database that exists only for this measurement (unless `keep`)."""
    if database_url is None:
        with _temporary_sqlite(keep) as url:
            yield url
        return
    parsed = usable_url(database_url)
    if parsed.get_backend_name() == "sqlite":
        if Path(parsed.database).exists():
            raise click.ClickException(f"{parsed.database} exists; the bench needs a new file")
        yield parsed.render_as_string(hide_password=False)
        return
    with _temporary_schema(parsed, keep) as url:
        yield url


def usable_url(database_url: str) -> URL:
    """The URL, or bad usage (exit 2) without its password; a database error later goes
    through the command line's one error handler (exit 1, one line)."""
    try:
        return normalize_url(database_url)
    except (ArgumentError, ValueError) as error:
        message = scrubbed(str(error), database_url)
        raise click.BadParameter(message, param_hint="'--database-url'") from None


def is_postgres_url(database_url: str | None) -> bool:
    return database_url is not None and usable_url(database_url).get_backend_name() == "postgresql"


@contextlib.contextmanager
def _temporary_sqlite(keep: bool) -> Iterator[str]:
    directory = Path(tempfile.mkdtemp(prefix="media_usage_bench_"))
    try:
        yield f"sqlite:///{directory / 'bench.db'}"
    finally:
        if keep:
            console.print(f"kept {directory / 'bench.db'}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _temporary_schema(server: URL, keep: bool) -> Iterator[str]:
    with scratch_schema(server, "bench", keep=keep) as (schema, url):
        try:
            yield url
        finally:
            if keep:
                console.print(f"kept schema {schema}")


def create_collection(
    engine: Engine, slug: str = COLLECTION_SLUG, collection_id: str | None = None
) -> Collection:
    with engine.begin() as connection:
        install_schema(connection)
    return CmsWriter(engine).create_collection(
        slug, sample_content.MEDIA_FIELDS, collection_id=collection_id
    )


def insert_entries(
    engine: Engine, count: int, slug: str = COLLECTION_SLUG, prefix: str = ENTRY_PREFIX
) -> None:
    """`count` sample entries in collection `slug`, their ids `<prefix>-e<index>`."""
    writer = CmsWriter(engine)
    for start in range(0, count, INSERT_CHUNK):
        size = min(INSERT_CHUNK, count - start)
        writer.insert_entries(slug, sample_content.sample_entries(prefix, size, start))


def coverage_is_complete(engine: Engine, collection: Collection) -> bool:
    coverage = read_collection_coverage(engine, collection.id)
    return (
        coverage is not None
        and coverage.status == "complete"
        and coverage.reconciliation_required is False
    )


def index_is_verified(engine: Engine) -> bool:
    report = verify_index(engine)
    for difference in report.differences[:5]:
        console.print(
            f"  drift: {difference.kind.value} {difference.content_id} {difference.detail}"
        )
    return not report.has_drift and report.pending_work_count == 0
