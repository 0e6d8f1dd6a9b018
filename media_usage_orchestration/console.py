"""Rich tables shared by the `media-usage` command and the demo."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from media_usage_orchestration.processing.operator import actions as operator
from media_usage_orchestration.store.core.engine import Engine


def literal(value: Any) -> Text:
    """A value as printed text: never markup, control characters shown as escapes (an ESC
    from the database could otherwise recolour the terminal or print a live link)."""
    text = str(value)
    if any(unicodedata.category(character) == "Cc" for character in text):
        text = "".join(_visible(character) for character in text)
    return Text(text)


def _visible(character: str) -> str:
    if unicodedata.category(character) != "Cc":
        return character
    return character.encode("unicode_escape").decode("ascii")


def _cell(value: Any) -> Text:
    if value is None:
        return literal("-")
    if isinstance(value, bool):
        return literal("yes" if value else "no")
    return literal(value)


def add_row(table: Table, *values: Any) -> None:
    """Every cell through `_cell`: a value is never read as markup."""
    table.add_row(*map(_cell, values))


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
    "stuck": "stuck_work",
    "last error": "last_error_code",
}


def items_table(title: str, items: Sequence[Any], columns: Mapping[str, str]) -> Table:
    """One row per item; `columns` maps each header to the item's field."""
    table = Table(title=literal(title))
    for index, header in enumerate(columns):
        table.add_column(header, overflow="fold", no_wrap=index == 0)
    for item in items:
        add_row(table, *(getattr(item, name) for name in columns.values()))
    return table


def status_table(engine: Engine) -> Table:
    """Coverage per collection: what `media-usage status` prints."""
    return coverage_table(operator.collection_statuses(engine))


def coverage_table(statuses: Sequence[operator.CollectionStatus]) -> Table:
    return items_table("Media usage coverage", statuses, STATUS_COLUMNS)
