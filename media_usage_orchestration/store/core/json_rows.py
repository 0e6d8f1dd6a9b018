"""Many rows bound to one statement as a single JSON parameter.

A batch statement (an insert, update or delete of many rows, each under its own guards) needs
its rows as a relation it can join. A VALUES list would do, but SQLAlchemy cannot cache a
statement holding one (nor a multi-row INSERT ... VALUES): it compiles it again on every
execution, about 10 ms for 50 rows of 25 columns, more than the statement itself costs. One
JSON text parameter read by `json_each` (SQLite) or `json_to_recordset` (PostgreSQL) keeps a
single statement per shape - built, compiled and cached once whatever the number of rows -
with every value still a bound parameter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, Text, bindparam, cast, column, func, select, type_coerce
from sqlalchemy.sql.selectable import FromClause
from sqlalchemy.types import TypeEngine


@dataclass(frozen=True)
class JsonRows:
    """A relation `name(<columns>)` whose rows are bound at execution time.

    SQLite reads each row as a JSON array (it parses the row text again for every column it
    extracts, so the shorter the better); PostgreSQL as an object, which `json_to_recordset`
    maps to typed columns in one pass."""

    name: str
    columns: tuple[tuple[str, TypeEngine], ...]

    @classmethod
    def of(cls, name: str, columns: Mapping[str, TypeEngine]) -> JsonRows:
        return cls(name, tuple(columns.items()))

    @property
    def parameter(self) -> str:
        return f"{self.name}_rows"

    def relation(self, dialect_name: str) -> FromClause:
        payload = bindparam(self.parameter, type_=Text)
        if dialect_name == "postgresql":
            return (
                func.json_to_recordset(cast(payload, JSON))
                .table_valued(*(column(key, type_) for key, type_ in self.columns))
                .render_derived(name=self.name, with_types=True)
            )
        each = func.json_each(payload).table_valued("value").alias(f"{self.name}_json")
        return (
            select(
                *(
                    type_coerce(func.json_extract(each.c.value, f"$[{index}]"), type_).label(key)
                    for index, (key, type_) in enumerate(self.columns)
                )
            )
            .select_from(each)
            .subquery(self.name)
        )

    def bind(self, dialect_name: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        """The parameter carrying `rows` (mappings keyed by column name; a missing key reads
        as NULL, an extra one is ignored).

        Text is sent as is, so a value the driver cannot send fails the statement as it would
        fail a single-row one; NUL, which JSON could smuggle past that check, is refused."""
        names = [key for key, _ in self.columns]
        if dialect_name == "postgresql":
            shaped: list[Any] = [{key: row.get(key) for key in names} for row in rows]
        else:
            shaped = [[row.get(key) for key in names] for row in rows]
        text = json.dumps(shaped, separators=(",", ":"), ensure_ascii=False)
        if "\\u0000" in text:
            raise ValueError("Batch rows must not contain NUL characters")
        return {self.parameter: text}


__all__ = ["JsonRows"]
