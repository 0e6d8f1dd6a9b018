"""A list of text values bound as one parameter: `column = ANY(:values)` on PostgreSQL,
`column IN (SELECT value FROM json_each(:values))` on SQLite.

`column.in_([...])` renders one placeholder per value, so a page of 37 ids and one of 38 are
two statements: psycopg prepares a statement only after it has seen the same text a few times,
and each new length is a new text (a miss in its prepared-statement cache and in SQLAlchemy's
compiled cache). One parameter keeps one text whatever the number of values.
"""

from __future__ import annotations

import json
from typing import ClassVar

from sqlalchemy import Text, bindparam
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import BindParameter, ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal
from sqlalchemy.types import Boolean, TypeDecorator


class TextList(TypeDecorator):
    """A sequence of text values: a `text[]` array on PostgreSQL, a JSON array elsewhere."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect):
        if dialect.name == "postgresql":
            return dialect.type_descriptor(ARRAY(Text()))
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        values = list(value)
        if any(not isinstance(each, str) for each in values):
            raise ValueError("A bound list of text values holds something else")
        if dialect.name == "postgresql":
            return values
        return json.dumps(values, separators=(",", ":"), ensure_ascii=False)


class _OverTextList(ColumnElement):
    """An expression of `operand` over a bound text list, compiled per dialect below."""

    inherit_cache = True

    def __init__(self, operand: ColumnElement, values: BindParameter) -> None:
        self.operand = operand
        self.values = values

    # Both are part of the cache key: the compiled text depends on them.
    _traverse_internals: ClassVar = [
        ("operand", InternalTraversal.dp_clauseelement),
        ("values", InternalTraversal.dp_clauseelement),
    ]

    def compiled_parts(self, compiler, **kw) -> tuple[str, str]:
        return compiler.process(self.operand, **kw), compiler.process(self.values, **kw)


class _InTextList(_OverTextList):
    """`operand` is one of the values."""

    inherit_cache = True
    type = Boolean()
    # A predicate as it is (SQLite would otherwise be asked `... = 1`, which no index serves).
    _is_implicitly_boolean = True


class _TextListItem(_OverTextList):
    """The value at the 1-based position `operand`."""

    inherit_cache = True
    type = Text()


@compiles(_InTextList)
def _compile_in_text_list(element: _InTextList, compiler, **kw) -> str:
    column, values = element.compiled_parts(compiler, **kw)
    return f"{column} IN (SELECT value FROM json_each({values}))"


@compiles(_InTextList, "postgresql")
def _compile_any_text_list(element: _InTextList, compiler, **kw) -> str:
    column, values = element.compiled_parts(compiler, **kw)
    return f"{column} = ANY({values})"


@compiles(_TextListItem)
def _compile_json_array_item(element: _TextListItem, compiler, **kw) -> str:
    position, values = element.compiled_parts(compiler, **kw)
    return f"json_extract({values}, '$[' || (({position}) - 1) || ']')"


@compiles(_TextListItem, "postgresql")
def _compile_array_item(element: _TextListItem, compiler, **kw) -> str:
    position, values = element.compiled_parts(compiler, **kw)
    return f"(CAST({values} AS TEXT[]))[{position}]"


def text_list_item(values: BindParameter | str, position: ColumnElement) -> ColumnElement[str]:
    """The value at 1-based `position` of the list bound to `values`: a lookup per row where a
    join with the list as a relation would read the whole list for every row."""
    return _TextListItem(position, _bound(values))


def text_list_parameter(name: str) -> BindParameter:
    return bindparam(name, type_=TextList())


def _bound(values: BindParameter | str) -> BindParameter:
    """A parameter name as a text-list parameter; a `bindparam` as it is."""
    return text_list_parameter(values) if isinstance(values, str) else values


def in_text_list(column: ColumnElement, values: BindParameter | str) -> ColumnElement[bool]:
    """`column` is one of the values bound to `values` (a parameter name or `bindparam`)."""
    return _InTextList(column, _bound(values))


__all__ = ["TextList", "in_text_list", "text_list_item", "text_list_parameter"]
