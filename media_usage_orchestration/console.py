"""Rich tables shared by the `media-usage` command and the demo."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from .processing import operator
from .store.engine import Engine


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


STATUS_COLUMNS = {
    "collection": "collection_slug",
    "capture": "capture_state",
    "coverage": "status",
    "epoch": "change_epoch",
    "required": "reconciliation_required",
    "entries": "entries",
    "sources": "sources",
    "occurrences": "occurrences",
    "pending": "pending_work",
    "failed": "failed_work",
    "last error": "last_error_code",
}


def items_table(title: str, items: Sequence[Any], columns: Mapping[str, str]) -> Table:
    """One row per item; `columns` maps each header to the item's field."""
    table = Table(title=title)
    for index, header in enumerate(columns):
        table.add_column(header, overflow="fold", no_wrap=index == 0)
    for item in items:
        table.add_row(*(_cell(getattr(item, name)) for name in columns.values()))
    return table


def status_table(engine: Engine) -> Table:
    """Coverage per collection: what `media-usage status` prints."""
    return coverage_table(operator.collection_statuses(engine))


def coverage_table(statuses: Sequence[operator.CollectionStatus]) -> Table:
    return items_table("Media usage coverage", statuses, STATUS_COLUMNS)
