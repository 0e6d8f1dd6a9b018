"""`media-usage`: the operator's command line.

Exit codes: 0 done; 1 a problem was found (drift, failed work or coverage, a retry that did
not reopen, a database error); 2 bad usage (click's usage errors, and every input the operator
service refuses: unknown collection, malformed cursor, limit out of range). Every verb takes
`--database-url` (env MEDIA_USAGE_DATABASE_URL); the password is never printed, not even in
a database error. Listings take `--json` and then print only JSON on stdout.

Verbs that only read (status, verify, the listings) open the database read-only: a SQLite
file is never created, converted to WAL or otherwise changed, and a missing one is bad usage.
Every value that comes from the database or the command line is printed literally, never
read as Rich markup or terminal control sequences.

On an EmDash database (one with `_emdash_migrations`), a media usage migration this project
does not implement (a later EmDash) makes `init` and the verbs that write exit 1 with one line
naming it; the verbs that read print that line as a warning on stderr and go on. `init` also
refuses while EmDash has not run a media usage migration the project implements (an older
EmDash: its migrator owns those tables). `status` shows the contract (`values/host_schema.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from media_usage_orchestration.bench import bench
from media_usage_orchestration.console import add_row, coverage_table, items_table, literal
from media_usage_orchestration.processing.integrity.verify import VerifyReport, verify_index
from media_usage_orchestration.processing.operator import actions as operator
from media_usage_orchestration.processing.operator import usage
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import (
    DATABASE_URL_ENV,
    ArgumentError,
    Engine,
    SQLAlchemyError,
    create_database_engine,
    database_error_message,
    default_database_url,
    redacted_url,
    scrubbed,
)
from media_usage_orchestration.store.core.host_schema import (
    read_host_schema,
    refuse_install,
    refuse_unknown_migrations,
)
from media_usage_orchestration.store.core.leases import LeaseState
from media_usage_orchestration.values.errors import (
    CoverageIncomplete,
    DatabaseFileError,
    HostSchemaError,
    OperatorInputError,
)
from media_usage_orchestration.values.host_schema import HostSchema
from media_usage_orchestration.values.outcomes import OperatorRetryOutcome

# Piped or logged output is not cut at rich's default 80 columns: the status table is wider.
_WIDTH = None if sys.stdout.isatty() else 160
# No markup: the verbs print values from the database and the command line, which must never
# style, hide or link anything. The verbs' own emphasis is passed as Text styles instead.
console = Console(width=_WIDTH, markup=False)

EXIT_PROBLEM = 1
_DATABASE_URL_META = "media_usage.database_url"
_URL_HINT = "'--database-url'"
_STATES = [state.value for state in LeaseState]


# --- database URL and errors ------------------------------------------------------------------


def _engine(url: str | None, *, read_only: bool = False) -> Engine:
    """The verb's engine; `read_only` for verbs that only look (nothing is created)."""
    url = url or default_database_url()
    # Kept for the error handler below, which must hide this URL's password.
    context = click.get_current_context()
    context.meta[_DATABASE_URL_META] = url
    try:
        engine = create_database_engine(url, read_only=read_only)
    except (ArgumentError, ValueError) as error:
        raise click.BadParameter(scrubbed(str(error), url), param_hint=_URL_HINT) from None
    context.call_on_close(engine.dispose)
    return engine


@contextlib.contextmanager
def _reading(url: str | None, *, read_only: bool = True) -> Iterator[Engine]:
    """A verb that only reads works whatever EmDash ran, and once it has answered (its exit
    included) says when writers refuse. Not before: bad input is refused before connecting."""
    engine = _engine(url, read_only=read_only)
    try:
        yield engine
    except SystemExit:
        _warn_when_writers_refuse(engine)
        raise
    _warn_when_writers_refuse(engine)


def _warn_when_writers_refuse(engine: Engine) -> HostSchema:
    host = read_host_schema(engine)
    if refusal := host.write_refusal():
        _echo(f"Warning: {refusal}", err=True)
    return host


def _writer(url: str | None) -> Engine:
    """A verb that writes refuses (exit 1) on a later EmDash's media usage migration."""
    engine = _engine(url)
    refuse_unknown_migrations(engine)
    return engine


@contextlib.contextmanager
def _reported_errors(ctx: click.Context) -> Iterator[None]:
    """The one error handler of every verb: refused operator input and an unusable SQLite
    file (missing for a verb that only reads) exit 2 like any usage error; a database error
    exits 1 with one line, scrubbed of the URL's secrets (never a traceback, never the SQL or
    its values), and so does a refusal of the host-schema contract."""
    try:
        yield
    except OperatorInputError as error:
        raise click.UsageError(str(error), ctx) from None
    except DatabaseFileError as error:
        url = ctx.meta.get(_DATABASE_URL_META)
        raise click.BadParameter(scrubbed(str(error), url), ctx, param_hint=_URL_HINT) from None
    except SQLAlchemyError as error:
        message = scrubbed(database_error_message(error), ctx.meta.get(_DATABASE_URL_META))
        raise click.ClickException(message) from None
    except HostSchemaError as error:  # the host-schema contract: exit 1, nothing written
        raise click.ClickException(str(error)) from None


class _OperatorCommand(click.Command):
    def invoke(self, ctx: click.Context) -> Any:
        with _reported_errors(ctx):
            return super().invoke(ctx)


class _OperatorGroup(click.Group):
    """Its own commands report errors in their context; commands defined elsewhere (`bench`)
    go through the same handler here."""

    command_class = _OperatorCommand
    group_class = type  # subgroups are operator groups too

    def invoke(self, ctx: click.Context) -> Any:
        with _reported_errors(ctx):
            return super().invoke(ctx)


def database_url_option(function: Callable) -> Callable:
    return click.option(
        "--database-url",
        envvar=DATABASE_URL_ENV,
        default=None,
        help=f"SQLAlchemy URL (env {DATABASE_URL_ENV}); default: .media_usage/media_usage.db.",
    )(function)


def json_option(function: Callable) -> Callable:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON on stdout instead of a table."
    )(function)


def limit_option(default: int) -> Callable[[Callable], Callable]:
    return click.option(
        "--limit",
        type=int,
        default=default,
        show_default=True,
        help=f"Items at most, 1 to {operator.MAX_LIMIT}.",
    )


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2))


def _echo(line: str, *, err: bool = False) -> None:
    """A plain line that may quote values: their control characters shown as escapes."""
    click.echo(literal(line).plain, err=err)


def _exit_problem() -> None:
    sys.exit(EXIT_PROBLEM)


# --- verbs ------------------------------------------------------------------------------------


@click.group(cls=_OperatorGroup)
def main() -> None:
    """Keep an EmDash database's media usage index true and delete collections safely.

    \b
    Exit codes: 0 done; 1 a problem found (drift, failed work or coverage, a retry that did
    not reopen, a database error); 2 bad usage (including an unknown collection, a malformed
    cursor or a limit outside 1..100)."""
    warnings.filterwarnings("ignore", category=Warning, module="dagster")


main.add_command(bench)


@main.command()
@database_url_option
def init(database_url: str | None) -> None:
    """Install (or complete) EmDash's media usage schema; safe to repeat. On an EmDash
    database, only when EmDash ran exactly the media usage migrations this project implements
    (exit 1 otherwise, nothing changed)."""
    engine = _engine(database_url)
    with engine.begin() as connection:
        refuse_install(connection)
        added = schema.install_schema(connection)
    console.print(
        Text.assemble(
            (literal(redacted_url(engine.url)).plain, "bold"), f": {len(added)} objects added"
        )
    )
    for item in added:
        console.print(literal(f"  + {item}"))


@main.command()
@database_url_option
@json_option
def status(database_url: str | None, as_json: bool) -> None:
    """Show every collection's coverage, index and work. Exit 1 when any collection waits for
    an operator: failed work, or failed coverage."""
    engine = _engine(database_url, read_only=True)
    host = _warn_when_writers_refuse(engine)  # status validates no input: it warns first
    statuses = operator.collection_statuses(engine)
    if as_json:
        _print_json([dataclasses.asdict(each) for each in statuses])
    else:
        console.print(coverage_table(statuses))
        if host.tracked:
            console.print(literal(host.summary()), soft_wrap=True)
    problems = [_status_problem(each) for each in statuses if each.problem_code]
    waiting = [each.collection_slug for each in statuses if each.needs_operator]
    if waiting:
        problems.append(f"Failed work or coverage waits for a retry: {', '.join(waiting)}")
    if problems:
        _echo("; ".join(problems), err=True)
        _exit_problem()


def _status_problem(status: operator.CollectionStatus) -> str:
    return f"Unusable collection {status.collection_slug}: {status.problem_code}: {status.problem}"


@main.command()
@database_url_option
@click.option(
    "--dagster-home",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".dagster_home"),
    show_default=True,
    help="The demo's own Dagster instance directory (what `make dev` opens).",
)
def demo(database_url: str | None, dagster_home: Path) -> None:
    """Build the demo database and drive the real jobs on it: activation, reconciliation until
    every collection is covered, an edit wave, a forced collection deletion."""
    from media_usage_orchestration.demo import run_demo

    url = database_url or default_database_url()
    _engine(url)  # an unusable URL is bad usage here, and the error handler knows the URL
    # The demo styles its own lines with markup; every value it prints is its own.
    demo_console = Console(width=_WIDTH)
    sys.exit(run_demo(url, demo_console, dagster_home))


@main.command()
@database_url_option
@click.option(
    "--collection",
    "collection_slugs",
    multiple=True,
    help="Only this collection (repeatable); default: every captured collection.",
)
@click.option("--limit", default=200, show_default=True, help="Differences to print at most.")
@json_option
def verify(
    database_url: str | None, collection_slugs: tuple[str, ...], limit: int, as_json: bool
) -> None:
    """Recompute the index from the content and compare; exit 1 on any drift."""
    with _reading(database_url) as engine:
        for slug in collection_slugs:
            operator.registered_collection_id(engine, slug)
        report = verify_index(engine, collection_slugs or None)
    if as_json:
        _print_json(_verify_json(report, limit))
    else:
        _print_verify_report(report, limit)
    if report.has_drift:
        _exit_problem()


def _verify_json(report: VerifyReport, limit: int) -> dict[str, Any]:
    return {
        "has_drift": report.has_drift,
        "difference_count": len(report.differences),
        "collections": [dataclasses.asdict(summary) for summary in report.collections],
        "differences": [dataclasses.asdict(each) for each in report.differences[: max(limit, 0)]],
    }


def _print_verify_report(report: VerifyReport, limit: int) -> None:
    console.print(verify_summary_table(report))
    if report.has_drift:
        console.print(verify_differences_table(report, limit))
        console.print(f"{len(report.differences)} differences", style="bold red")
    else:
        console.print(
            Text.assemble(
                ("No drift", "bold green"), ": the index equals what extraction computes."
            )
        )


# --- operator verbs ---------------------------------------------------------------------------


@main.group()
def work() -> None:
    """List and retry per-entry media usage work."""


@work.command("list")
@click.option("--collection", required=True, help="Collection slug.")
@click.option("--state", type=click.Choice(_STATES), default=None, help="Only this state.")
@limit_option(operator.DEFAULT_LIST_LIMIT)
@click.option("--cursor", default=None, help="The next cursor printed by the previous page.")
@database_url_option
@json_option
def work_list(
    collection: str,
    state: str | None,
    limit: int,
    cursor: str | None,
    database_url: str | None,
    as_json: bool,
) -> None:
    """A page of a collection's work, newest first (never versions or lease tokens)."""
    with _reading(database_url) as engine:
        page = operator.list_work(engine, collection, state=state, limit=limit, cursor=cursor)
    _print_page(f"Work of {collection}", page.items, page.next_cursor, as_json, WORK_COLUMNS)


@work.command("retry")
@click.option("--collection", required=True, help="Collection slug.")
@click.option("--content-id", default=None, help="The one entry whose work to retry.")
@click.option("--all-failed", is_flag=True, help="Retry every failed entry (at most --limit).")
@limit_option(operator.MAX_LIMIT)
@database_url_option
@json_option
def work_retry(
    collection: str,
    content_id: str | None,
    all_failed: bool,
    limit: int,
    database_url: str | None,
    as_json: bool,
) -> None:
    """Reopen one entry's work, or every failed entry's, at a new coverage epoch. Exit 1 when
    any item was not reopened (lease_active, conflict, not_found)."""
    if (content_id is None) == (not all_failed):
        raise click.UsageError("Pass exactly one of --content-id or --all-failed")
    engine = _writer(database_url)
    if content_id is not None:
        report = operator.retry_work_item(engine, collection, content_id)
        _finish_retry(f"Work {collection}/{content_id}", report, as_json)
        return
    bulk = operator.retry_failed_work(engine, collection, limit=limit)
    if as_json:
        _print_json(bulk.as_dict())
    else:
        _echo(_bulk_message(bulk))
    if not bulk.succeeded:
        _exit_problem()


@main.group()
def deletions() -> None:
    """List and retry collection deletions."""


@deletions.command("list")
@click.option(
    "--state", type=click.Choice(_STATES), default="failed", show_default=True, help="State."
)
@limit_option(operator.DEFAULT_LIST_LIMIT)
@click.option("--cursor", default=None, help="The next cursor printed by the previous page.")
@database_url_option
@json_option
def deletions_list(
    state: str, limit: int, cursor: str | None, database_url: str | None, as_json: bool
) -> None:
    """A page of deletion tombstones in one state, newest first (never lease tokens)."""
    with _reading(database_url) as engine:
        page = operator.list_deletions(engine, state=state, limit=limit, cursor=cursor)
    title = f"Collection deletions ({state})"
    _print_page(title, page.items, page.next_cursor, as_json, DELETION_COLUMNS)


@deletions.command("retry")
@click.option("--collection-id", default=None, help="Id of the collection being deleted.")
@click.option("--collection", default=None, help="Slug of the collection being deleted.")
@database_url_option
@json_option
def deletions_retry(
    collection_id: str | None, collection: str | None, database_url: str | None, as_json: bool
) -> None:
    """Reopen a failed or stalled deletion in its phase. Exit 1 unless it was reopened."""
    report = operator.retry_deletion(
        _writer(database_url), collection_id=collection_id, collection=collection
    )
    _finish_retry(f"Deletion of {collection or collection_id}", report, as_json)


@main.group()
def reconciliations() -> None:
    """List and retry collection reconciliations."""


@reconciliations.command("list")
@database_url_option
@json_option
def reconciliations_list(database_url: str | None, as_json: bool) -> None:
    """Every collection's reconciliation: state, phase, attempts, next attempt, lease expiry."""
    with _reading(database_url) as engine:
        items = operator.list_reconciliations(engine)
    _print_page("Reconciliations", items, None, as_json, RECONCILIATION_COLUMNS)


@reconciliations.command("retry")
@click.option("--collection", required=True, help="Collection slug.")
@database_url_option
@json_option
def reconciliations_retry(collection: str, database_url: str | None, as_json: bool) -> None:
    """Reopen a failed, retrying or abandoned reconciliation as a fresh scan. Exit 1 unless it
    was reopened."""
    report = operator.retry_reconciliation(_writer(database_url), collection)
    _finish_retry(f"Reconciliation of {collection}", report, as_json)


@main.command("usage")
@click.argument("media_id")
@click.option("--provider", default="local", show_default=True, help="Media provider of MEDIA_ID.")
@limit_option(usage.DEFAULT_USAGE_LIMIT)
@click.option("--cursor", default=None, help="The next cursor printed by the previous page.")
@database_url_option
@json_option
def usage_verb(
    media_id: str,
    provider: str,
    limit: int,
    cursor: str | None,
    database_url: str | None,
    as_json: bool,
) -> None:
    """Where a media item is used: entries (paged by entry), variant and field path, with each
    collection's coverage. "Not used" is said only when coverage proves it."""
    with _reading(database_url, read_only=False) as engine:
        report = usage.media_usage(engine, media_id, provider=provider, limit=limit, cursor=cursor)
    if as_json:
        _print_json(report.as_dict())
        return
    title = f"Usage of {report.media_id} ({report.provider})"
    lines = usage_lines(report)
    if lines:
        console.print(items_table(title, lines, USAGE_COLUMNS))
    if report.next_cursor:
        click.echo(f"More: --cursor {report.next_cursor}")
    click.echo(coverage_line(report.coverage))
    if not lines:
        click.echo(f"{title}: {_absence(report)}")


@main.command("unused")
@limit_option(usage.DEFAULT_USAGE_LIMIT)
@click.option("--cursor", default=None, help="The next cursor printed by the previous page.")
@database_url_option
@json_option
def unused_verb(limit: int, cursor: str | None, database_url: str | None, as_json: bool) -> None:
    """Media of EmDash's library no content field uses, with the bytes that could be
    reclaimed. Deletes nothing; refused (exit 1) unless every collection's coverage is
    complete."""
    with _reading(database_url, read_only=False) as engine:
        try:
            report = usage.unused_media(engine, limit=limit, cursor=cursor)
        except CoverageIncomplete as refusal:
            click.echo(f"Refused: {refusal}", err=True)
            _exit_problem()
    if as_json:
        _print_json(report.as_dict())
        return
    if report.items:
        console.print(items_table("Unused media", report.items, UNUSED_COLUMNS))
    if report.next_cursor:
        click.echo(f"More: --cursor {report.next_cursor}")
    summary = report.summary
    click.echo(
        f"{summary.media} media, {summary.used} used, {summary.unused} unused; "
        f"{summary.reclaimable_bytes} bytes reclaimable (nothing was deleted)"
    )
    click.echo(f"Note: {report.not_indexed}.")


# --- output -----------------------------------------------------------------------------------


def _columns(*field_names: str) -> dict[str, str]:
    """Table headers for dataclass fields: the field name, spaced."""
    return {name.replace("_", " "): name for name in field_names}


# What each listing shows in its table (--json has every field): the identifying column
# first, never wrapped; the page's own collection is in the title, not repeated per row.
WORK_COLUMNS = _columns(
    "content_id",
    "state",
    "attempt_count",
    "next_attempt_at",
    "lease_expires_at",
    "last_error_code",
    "updated_at",
)
DELETION_COLUMNS = _columns(
    "collection_slug",
    "collection_id",
    "state",
    "phase",
    "attempt_count",
    "next_attempt_at",
    "lease_expires_at",
    "last_error_code",
)
RECONCILIATION_COLUMNS = _columns(
    "collection_slug",
    "state",
    "phase",
    "target_epoch",
    "attempt_count",
    "next_attempt_at",
    "lease_expires_at",
    "last_error_code",
)


def _print_page(
    title: str,
    items: Sequence[Any],
    next_cursor: str | None,
    as_json: bool,
    columns: Mapping[str, str],
) -> None:
    if as_json:
        rows = [dataclasses.asdict(item) for item in items]
        _print_json({"items": rows, "next_cursor": next_cursor})
        return
    if not items:
        _echo(f"{title}: none")
        return
    console.print(items_table(title, items, columns))
    if next_cursor:
        _echo(f"More: --cursor {next_cursor}")


def _retry_explanation(report: operator.RetryReport) -> str:
    outcome = OperatorRetryOutcome
    if report.outcome is outcome.PENDING:
        return "reopened, it will run again" if report.changed else "already pending, unchanged"
    if report.outcome is outcome.LEASE_ACTIVE:
        return f"a worker holds it until {report.lease_expires_at}; retry after that"
    if report.outcome is outcome.CONFLICT:
        return "not retryable now (pending, or changed meanwhile); list it and try again"
    return "nothing to retry"


def _finish_retry(what: str, report: operator.RetryReport, as_json: bool) -> None:
    if as_json:
        _print_json(report.as_dict())
    else:
        _echo(f"{what}: {report.outcome.value} ({_retry_explanation(report)})")
    if not report.succeeded:
        _exit_problem()


def _bulk_message(bulk: operator.BulkRetryReport) -> str:
    if bulk.attempted == 0:
        return f"Work of {bulk.collection_slug}: no failed work"
    counts = ", ".join(f"{count} {outcome}" for outcome, count in bulk.counts.items())
    more = "; more failed work remains, run again" if bulk.more_failed else ""
    return f"Work of {bulk.collection_slug}: {counts} ({bulk.changed} reopened){more}"


def verify_summary_table(report: VerifyReport) -> Table:
    table = Table(title="Media usage index verification")
    for header in ("collection", "entries", "sources", "abandoned rows", "pending work"):
        table.add_column(header)
    for summary in report.collections:
        add_row(
            table,
            summary.collection_slug,
            summary.entry_count,
            summary.source_count,
            summary.abandoned_occurrence_count,
            summary.pending_work_count,
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
        add_row(
            table,
            difference.kind.value,
            difference.collection_slug,
            difference.content_id or None,
            difference.source_key or None,
            difference.detail,
        )
    return table


@dataclasses.dataclass(frozen=True)
class UsageLine:
    collection: str
    content_id: str
    slug: str | None
    title: str | None
    status: str | None
    variant: str
    field_path: str


USAGE_COLUMNS = {
    "collection": "collection",
    "entry": "content_id",
    "slug": "slug",
    "title": "title",
    "status": "status",
    "variant": "variant",
    "field path": "field_path",
}
UNUSED_COLUMNS = _columns("id", "filename", "mime_type", "size", "status")


def usage_lines(report: usage.UsageReport) -> list[UsageLine]:
    """One line per occurrence; a trashed entry shows `trashed` as its status."""
    lines = []
    for entry in report.entries:
        status = "trashed" if entry.deleted_at else entry.status
        for source in entry.sources:
            for occurrence in source.occurrences:
                lines.append(
                    UsageLine(
                        entry.collection,
                        entry.content_id,
                        entry.slug,
                        entry.title,
                        status,
                        source.label,
                        occurrence.field_path,
                    )
                )
    return lines


def coverage_line(coverage: usage.Coverage) -> str:
    parts = ", ".join(f"{view.collection} {view.coverage}" for view in coverage.collections)
    return f"Coverage: {coverage.status}" + (f" ({parts})" if parts else "")


def _absence(report: usage.UsageReport) -> str:
    if report.proven_unused:
        return f"not used in any content field ({usage.NOT_INDEXED})"
    incomplete = ", ".join(view.collection for view in report.coverage.incomplete)
    return (
        f"no usage found, but coverage is not complete ({incomplete}): "
        "this does not prove it is unused"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
