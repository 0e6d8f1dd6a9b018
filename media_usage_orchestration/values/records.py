"""Records built from rows, one way everywhere: a frozen dataclass takes each field from the
row's column of the same name (or another record's field of the same name), through a
converter where the stored value needs one (a bigint read back as text, a state to parse)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields
from typing import Any, TypeVar

Record = TypeVar("Record")
Converter = Callable[[Any], Any]


def record_from_row(
    record_type: type[Record], row: Mapping[str, Any], /, **converters: Converter
) -> Record:
    """A `record_type` whose fields are the row's columns of the same names (other columns
    are ignored; a field with a default may be missing). `converters` turn the named columns
    into field values, in their order, and may refuse a value by raising."""
    required, defaulted = _field_names(record_type)
    unknown = converters.keys() - {*required, *defaulted}
    if unknown:
        raise TypeError(f"{record_type.__name__} has no field {sorted(unknown)[0]!r}")
    values = {name: row[name] for name in required}
    values.update((name, row[name]) for name in defaulted if name in row)
    for name, convert in converters.items():
        if name in values:
            values[name] = convert(values[name])
    return record_type(**values)


def record_from_record(record_type: type[Record], record: object) -> Record:
    """A `record_type` (often a narrower view) of another record's fields of the same names."""
    return record_from_row(record_type, vars(record))


def optional(convert: Converter) -> Converter:
    """`convert`, except that NULL stays None."""
    return lambda value: None if value is None else convert(value)


@functools.cache
def _field_names(record_type: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The record's init fields: those the row must have, and those with a default."""
    init = [field for field in fields(record_type) if field.init]
    required = tuple(
        field.name
        for field in init
        if field.default is MISSING and field.default_factory is MISSING
    )
    defaulted = tuple(field.name for field in init if field.name not in required)
    return required, defaulted


__all__ = ["optional", "record_from_record", "record_from_row"]
