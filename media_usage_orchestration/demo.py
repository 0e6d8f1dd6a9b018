"""The demo: an EmDash-shaped database driven by the real Dagster definitions.

It builds three collections of content with media references of every kind and EmDash's media
library (an upload for every media item the content references, and some nothing references),
activates capture with the activation job, and then lets the sensors ask for runs - ticked by
the sensor daemon's own iteration over the workspace `make dev` loads, launched through a
persistent instance in `.dagster_home` - until every collection's coverage is complete. A
forced deletion of one collection follows (the request job, then the deletion job its sensor
asks for), then an edit wave on the others (captured by the triggers, projected by the work
job) and one projection-GC run over the generations it replaced, backdated past the GC's
safety window (its passes, back to back, reap them all); that run also records the media
library. `make dev` opens the same database and
instance in the UI, where every run is on its job's Runs tab and re-executes.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from media_usage_orchestration.console import status_table
from media_usage_orchestration.emdash_double import cms_writer as cms
from media_usage_orchestration.emdash_double import media_library, sample_content
from media_usage_orchestration.emdash_double.aging import age_replaced_generations
from media_usage_orchestration.emdash_double.media_library import MediaFile
from media_usage_orchestration.local.instance_home import (
    KEPT_ON_RESET,
    LOCAL_INSTANCE_MARKER,
    instance_in_use,
    is_foreign_instance,
)
from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.operator.usage import media_library_summary
from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.core.engine import (
    Engine,
    create_database_engine,
    read_transaction,
    redacted_url,
    sqlite_database_file,
)
from media_usage_orchestration.store.host.registry import holds_collections, list_collection_slugs
from media_usage_orchestration.store.reads import audit


@dataclass(frozen=True)
class DemoCollection:
    slug: str
    prefix: str
    entries: int


DEMO_COLLECTIONS = (
    DemoCollection("articles", "art", 900),
    DemoCollection("pages", "pag", 650),
    DemoCollection("products", "pro", 450),
)
DELETED_COLLECTION = "products"
# Beside a SQLite file the demo created: only such a file is ever removed by a later demo.
DEMO_DATABASE_MARKER_SUFFIX = ".demo"
UI_URL = "http://127.0.0.1:3000"


def run_demo(
    url: str,
    console: Console,
    dagster_home: Path = Path(".dagster_home"),
    collections: Sequence[DemoCollection] = DEMO_COLLECTIONS,
) -> int:
    """Run the whole demo; 0 when every remaining collection is complete, the index has no
    drift and the deleted collection is gone, else 1. An instance in use (a running
    `make dev`) or not the project's own is refused before anything is touched."""
    phases = DemoPhases()
    _refuse_an_instance_in_use(dagster_home)
    _refuse_a_foreign_instance(dagster_home)
    with phases.measure("database"):
        engine = _prepare_database(url, console, collections)
    from media_usage_orchestration.local.daemon_lane import open_daemon_lane_in_background

    with (
        _demo_instance(dagster_home, console) as instance,
        open_daemon_lane_in_background(instance, url) as started_runner,
    ):
        with phases.measure("content (the code server starting meanwhile)"):
            _write_content(engine, collections)
        console.print(f"Demo database: [bold]{escape(redacted_url(engine.url))}[/]")
        console.print(content_table(engine))
        with phases.measure("code server (rest of its start)"):
            runner = started_runner()
        runs = _run_jobs(engine, runner, console, collections, phases)
    console.print(runs_table(runs))
    console.print(status_table(engine))
    with phases.measure("verify"):
        code = _report(engine, console)
    console.print(phases.table())
    console.print(f"Demo finished in {phases.total():.1f} s.")
    console.print(f"Open the UI with [bold]make dev[/], then {UI_URL}")
    return code


@dataclass
class DemoPhases:
    """Wall-clock seconds and runs per phase of the demo, in order."""

    started: float = field(default_factory=time.monotonic)
    rows: list[tuple[str, float, int]] = field(default_factory=list)

    @contextmanager
    def measure(self, name: str, runs: list[Any] | None = None) -> Iterator[None]:
        """Time the block; `runs` is the list the block appends its runs to."""
        before = len(runs) if runs is not None else 0
        phase_started = time.monotonic()
        yield
        launched = len(runs) - before if runs is not None else 0
        self.add(name, time.monotonic() - phase_started, launched)

    def add(self, name: str, seconds: float, runs: int = 0) -> None:
        self.rows.append((name, seconds, runs))

    def total(self) -> float:
        return time.monotonic() - self.started

    def table(self) -> Table:
        table = Table(title="Demo phases")
        for header in ("phase", "seconds", "runs"):
            table.add_column(header)
        for name, seconds, runs in self.rows:
            table.add_row(name, f"{seconds:.1f}", str(runs))
        table.add_row("total", f"{self.total():.1f}", str(sum(row[2] for row in self.rows)))
        return table


# --- database ---------------------------------------------------------------------------------


def _prepare_database(url: str, console: Console, collections: Sequence[DemoCollection]) -> Engine:
    """A SQLite file an earlier demo made (it left a marker beside it) starts over; any other
    database must hold no collections, since the demo never removes content it did not write.
    A refused database is left exactly as it was. Then EmDash's schema, with the media library
    the demo's content will use."""
    demo_file = sqlite_database_file(url)
    marker = Path(f"{demo_file}{DEMO_DATABASE_MARKER_SUFFIX}") if demo_file else None
    if marker is not None and marker.exists():
        console.print(f"Starting over: removing the previous demo database {demo_file}")
        for suffix in ("", "-wal", "-shm", DEMO_DATABASE_MARKER_SUFFIX):
            Path(f"{demo_file}{suffix}").unlink(missing_ok=True)
    engine = create_database_engine(url)
    if _holds_collections(engine):
        engine.dispose()
        raise click.ClickException(
            f"The demo needs an empty database; {redacted_url(url)} already holds collections "
            "(nothing was changed)."
        )
    with engine.begin() as connection:
        schema.install_schema(connection)
        media_library.create_media_table(connection)
        media_library.add_media(connection, demo_media_library(collections))
    if marker is not None:
        marker.touch()
    return engine


def _holds_collections(engine: Engine) -> bool:
    with read_transaction(engine) as connection:
        return holds_collections(connection)


def _write_content(engine: Engine, collections: Sequence[DemoCollection]) -> None:
    """Content written before capture is active: coverage starts untrusted everywhere."""
    writer = cms.CmsWriter(engine)
    for collection in collections:
        writer.create_collection(collection.slug, sample_content.MEDIA_FIELDS)
        initial_content(collection).apply(writer, collection.slug)


@dataclass(frozen=True)
class ContentWrites:
    """What the CMS writes to one collection, in this order: entries inserted, edits (entry id,
    new values), drafts saved (entry id, revision data), entries trashed, entries deleted."""

    inserted: list[dict[str, Any]] = field(default_factory=list)
    edits: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    drafts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    trashed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def apply(self, writer: cms.CmsWriter, slug: str) -> int:
        """Write it all through the CMS; returns the writes made."""
        writes = len(writer.insert_entries(slug, self.inserted))
        for entry_id, values in self.edits:
            writer.update_entry(slug, entry_id, values)
        for entry_id, data in self.drafts:
            writer.save_draft(slug, entry_id, data)
        for entry_id in self.trashed:
            writer.trash_entry(slug, entry_id)
        for entry_id in self.deleted:
            writer.delete_entry(slug, entry_id)
        return writes + sum(map(len, (self.edits, self.drafts, self.trashed, self.deleted)))

    def contents(self) -> list[dict[str, Any]]:
        """Every piece of content it writes: the media library holds what they reference."""
        return [*self.inserted, *(values for _, values in (*self.edits, *self.drafts))]


def initial_content(collection: DemoCollection) -> ContentWrites:
    """The entries, every 9th with a draft and every 25th (from the 5th) in the trash."""
    prefix, size = collection.prefix, collection.entries
    return ContentWrites(
        inserted=sample_content.sample_entries(prefix, size),
        drafts=_drafts(prefix, range(0, size, 9)),
        trashed=_entry_ids(prefix, range(4, size, 25)),
    )


def edit_wave_content(collection: DemoCollection) -> ContentWrites:
    """Edits of every kind: new hero images, new entries, drafts, trashed and deleted entries."""
    prefix, size = collection.prefix, collection.entries
    return ContentWrites(
        inserted=sample_content.sample_entries(prefix, max(size // 20, 1), start=size),
        edits=[
            (entry_id, {"hero": sample_content.edited_hero(entry_id), "title": "edited"})
            for entry_id in _entry_ids(prefix, range(1, size, 10))
        ],
        drafts=_drafts(prefix, range(2, size, 30)),
        trashed=_entry_ids(prefix, range(3, size, 40)),
        deleted=_entry_ids(prefix, range(7, size, 50)),
    )


def _entry_ids(prefix: str, indexes: range) -> list[str]:
    return [sample_content.sample_entry(prefix, index)["id"] for index in indexes]


def _drafts(prefix: str, indexes: range) -> list[tuple[str, dict[str, Any]]]:
    entries = (sample_content.sample_entry(prefix, index) for index in indexes)
    return [(entry["id"], sample_content.draft_revision_data(entry)) for entry in entries]


def edit_wave(engine: Engine, collection: DemoCollection) -> int:
    """The edit wave through the CMS, each write captured by the triggers as work. Returns the
    writes made."""
    return edit_wave_content(collection).apply(cms.CmsWriter(engine), collection.slug)


def edited_collections(collections: Sequence[DemoCollection]) -> list[DemoCollection]:
    """The edit wave comes after the deletion, so it edits the collections that remain."""
    return [collection for collection in collections if collection.slug != DELETED_COLLECTION]


def demo_media_library(collections: Sequence[DemoCollection]) -> list[MediaFile]:
    """EmDash's media library as the demo's editors filled it: an upload for every media item
    the demo's content references at any time, and the uploads nothing references."""
    writes = [initial_content(collection) for collection in collections]
    writes += [edit_wave_content(collection) for collection in edited_collections(collections)]
    contents = [content for write in writes for content in write.contents()]
    return [*sample_content.library_files(contents), *sample_content.UNUSED_UPLOADS]


# --- the Dagster instance ---------------------------------------------------------------------


@contextmanager
def _demo_instance(dagster_home: Path, console: Console) -> Iterator[Any]:
    """A persistent instance in the demo's own directory, so `make dev` shows its runs. Only a
    directory the demo created (it carries a marker) is ever emptied. The demo executes the
    runs it launches itself; `dagster.yaml` stays what `make dev` uses."""
    from media_usage_orchestration.local.daemon_lane import synchronous_instance

    marker = dagster_home / LOCAL_INSTANCE_MARKER
    _refuse_a_foreign_instance(dagster_home)
    if marker.exists():
        console.print(f"Starting over: clearing the demo's Dagster history in {dagster_home}")
        for path in dagster_home.iterdir():
            if path.name not in KEPT_ON_RESET:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    dagster_home.mkdir(parents=True, exist_ok=True)
    marker.touch()
    config = dagster_home / "dagster.yaml"
    if not config.exists():
        config.write_text("telemetry:\n  enabled: false\n")
    with synchronous_instance(dagster_home) as instance:
        yield instance


def _refuse_an_instance_in_use(dagster_home: Path) -> None:
    reason = instance_in_use(dagster_home)
    if reason is not None:
        raise click.ClickException(f"{reason}; stop it before `make demo` (nothing was changed).")


def _refuse_a_foreign_instance(dagster_home: Path) -> None:
    if is_foreign_instance(dagster_home):
        raise click.ClickException(
            f"{dagster_home} holds a Dagster instance this project did not create; "
            "pass another --dagster-home."
        )


def _run_jobs(
    engine: Engine,
    runner: Any,
    console: Console,
    collections: Sequence[DemoCollection],
    phases: DemoPhases,
) -> list[Any]:
    import dagster as dg

    from media_usage_orchestration.local.daemon_lane import quiet_run_logs, run_outcome
    from media_usage_orchestration.local.in_process_lane import LaneRun

    runs: list[LaneRun] = []

    def record(run: Any) -> None:
        partition = run.tags.get("dagster/partition")
        success = run.status == dg.DagsterRunStatus.SUCCESS
        runs.append(LaneRun(run.job_name, partition, success, run_outcome(runner.instance, run)))
        _print_run(console, runs[-1])

    with _progress(console) as progress, quiet_run_logs():
        _drive_the_lanes(engine, runner, record, progress, phases, runs, collections)
    return runs


def _drive_the_lanes(
    engine: Engine,
    runner: Any,
    record: Callable[[Any], None],
    progress: Progress,
    phases: DemoPhases,
    runs: list[Any],
    collections: Sequence[DemoCollection],
) -> None:
    """Activation and coverage, the deletion, the edit wave of the collections that remain and
    a projection-GC run; `record` hears of every run as it ends and appends it to `runs`.
    The edit wave comes after the deletion, so the index asset's latest materialization (its
    overview in the UI) is a live collection's: Dagster keeps a deleted partition's events."""
    coverage = progress.add_task("coverage complete", total=len(collections))

    def show_coverage() -> None:
        complete = len(collections) - len(_incomplete_collections(engine))
        progress.update(coverage, completed=complete)

    def show_coverage_run(run: Any) -> None:
        record(run)
        show_coverage()

    with phases.measure("activation", runs):
        record(runner.launch("media_usage_activation"))
    with phases.measure("coverage (sensor ticks)", runs):
        runner.run_lane(show_coverage_run)
    show_coverage()
    with phases.measure(f"delete {DELETED_COLLECTION}", runs):
        _delete_a_collection(engine, runner, record, progress)
    with phases.measure("edit wave", runs):
        _edit_and_project(engine, runner, record, progress, edited_collections(collections))
    with phases.measure("projection GC", runs):
        _collect_projection_garbage(engine, runner, record, progress)


def _delete_a_collection(
    engine: Engine, runner: Any, record: Callable[[Any], None], progress: Progress
) -> None:
    deletion = progress.add_task(f"delete {DELETED_COLLECTION}", total=1)
    # Forced: the collection still has entries, which a plain request refuses.
    request = {"collection": DELETED_COLLECTION, "force": True}
    config = {"ops": {"request_deletion": {"config": request}}}
    record(runner.launch("request_collection_deletion", config))
    runner.run_lane(record)
    record(runner.launch("media_usage_maintenance"))
    progress.update(deletion, completed=int(_collection_gone(engine, DELETED_COLLECTION)))


def _edit_and_project(
    engine: Engine,
    runner: Any,
    record: Callable[[Any], None],
    progress: Progress,
    collections: Sequence[DemoCollection],
) -> None:
    writes = sum(edit_wave(engine, collection) for collection in collections)
    progress.console.print(f"Edit wave: {writes} content writes captured as work")
    work = progress.add_task("edit wave projected", total=writes)

    def show_work(run: Any) -> None:
        record(run)
        progress.update(work, completed=writes - _open_work(engine))

    runner.run_lane(show_work)
    progress.update(work, completed=writes - _open_work(engine))


def _collect_projection_garbage(
    engine: Engine, runner: Any, record: Callable[[Any], None], progress: Progress
) -> None:
    """The generations the edit wave replaced, backdated past the GC's safety window (else the
    demo would wait an hour for them), then the sensors' rounds: the projection-GC sensor asks
    for one run, whose passes reap them all and which also records the media library."""
    aged = age_replaced_generations(engine)
    progress.console.print(
        f"Projection GC: {aged} occurrence rows of replaced generations backdated past the "
        "safety window"
    )
    runner.run_lane(record)


def _print_run(console: Console, run: Any) -> None:
    partition = f"[{run.partition_key}]" if run.partition_key else ""
    state = "[green]success[/]" if run.success else "[red]failure[/]"
    outcome = f": {run.outcome}" if run.outcome else ""
    console.print(f"  run {run.job_name}{escape(partition)} {state}{outcome}")


@contextmanager
def _progress(console: Console) -> Iterator[Progress]:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        yield progress


# --- reading the outcome ----------------------------------------------------------------------


def _open_work(engine: Engine) -> int:
    with read_transaction(engine) as connection:
        return audit.work_count(connection)


def _collection_gone(engine: Engine, slug: str) -> bool:
    with read_transaction(engine) as connection:
        return audit.collection_is_gone(connection, slug)


def _report(engine: Engine, console: Console) -> int:
    report = verify_index(engine)
    gone = _collection_gone(engine, DELETED_COLLECTION)
    incomplete = _incomplete_collections(engine)
    console.print(
        f"verify: {len(report.differences)} differences "
        f"({'drift found' if report.has_drift else 'no drift'})"
    )
    console.print(
        f"{DELETED_COLLECTION}: "
        + ("deleted (registry, table, status, sources and work removed)" if gone else "NOT gone")
    )
    if incomplete:
        console.print(f"[red]coverage not complete:[/] {', '.join(incomplete)}")
    _report_media_library(engine, console)
    return 1 if report.has_drift or not gone or incomplete else 0


def _report_media_library(engine: Engine, console: Console) -> None:
    found = media_library_summary(engine)
    if found is None:
        return
    summary, _ = found
    console.print(
        f"media library: {summary.media} media, {summary.used} used, {summary.unused} unused "
        f"({summary.reclaimable_bytes:,} bytes reclaimable): `media-usage unused` lists them"
    )


def _incomplete_collections(engine: Engine) -> list[str]:
    """Registry collections whose coverage is not complete and trusted."""
    with read_transaction(engine) as connection:
        slugs = list_collection_slugs(connection)
        return sorted(set(slugs) - audit.complete_collection_slugs(connection))


def runs_table(runs: Sequence[Any]) -> Table:
    table = Table(title="Runs of the demo")
    for header in ("job", "runs", "succeeded", "outcomes"):
        table.add_column(header)
    by_job: dict[str, list[Any]] = {}
    for run in runs:
        by_job.setdefault(run.job_name, []).append(run)
    for job_name, job_runs in by_job.items():
        outcomes = Counter(run.outcome for run in job_runs if run.outcome)
        table.add_row(
            job_name,
            str(len(job_runs)),
            str(sum(run.success for run in job_runs)),
            ", ".join(f"{name} x{n}" for name, n in sorted(outcomes.items())) or "-",
        )
    return table


def content_table(engine: Engine) -> Table:
    """The demo content per collection, as written (before capture is activated)."""
    table = Table(title="Demo content")
    for header in ("collection", "entries", "with a draft", "trashed"):
        table.add_column(header)
    with read_transaction(engine) as connection:
        for slug in list_collection_slugs(connection):
            table.add_row(slug, *map(str, audit.entry_counts(connection, slug)))
    return table
