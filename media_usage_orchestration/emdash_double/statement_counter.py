"""Count the SQL statements sent to one database, by label (the bench's phases).

A `before_cursor_execute` listener on every engine of the process counts the statements of the
engines whose URL names the measured database, whoever created them (the bench's own engine,
or the `database` resource of Dagster runs); Dagster's instance storage is another database
and is not counted. Each statement is attributed to the label `label()` returns at that moment.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL, make_url


def database_key(url: str | URL) -> tuple:
    """What identifies a database across engines: backend, server, database and options (the
    PostgreSQL bench schema travels in `options`), never the password."""
    parsed = make_url(url) if isinstance(url, str) else url
    return (
        parsed.get_backend_name(),
        parsed.host,
        parsed.port,
        parsed.database,
        tuple(sorted((key, str(value)) for key, value in parsed.query.items())),
    )


class StatementCounts:
    """Statements per label, safe to update from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, label: str) -> None:
        with self._lock:
            self._counts[label] += 1

    def by_label(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


@contextlib.contextmanager
def counting_statements(
    url: str | URL, label: Callable[[], str] = lambda: "all"
) -> Iterator[StatementCounts]:
    """Count every statement any engine of this process sends to the database at `url` while
    the block runs."""
    wanted = database_key(url)
    counts = StatementCounts()
    decided: dict[URL, bool] = {}

    def before_cursor_execute(connection, cursor, statement, parameters, context, executemany):
        engine_url = connection.engine.url
        counted = decided.get(engine_url)
        if counted is None:
            counted = decided[engine_url] = database_key(engine_url) == wanted
        if counted:
            counts.add(label())

    event.listen(Engine, "before_cursor_execute", before_cursor_execute)
    try:
        yield counts
    finally:
        event.remove(Engine, "before_cursor_execute", before_cursor_execute)


__all__ = ["StatementCounts", "counting_statements", "database_key"]
