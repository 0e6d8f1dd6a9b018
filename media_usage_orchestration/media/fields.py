"""Which fields of a collection can hold media references (EmDash `content-fields.ts`), from
its `_emdash_fields` rows (read by `store.content.field_rows`).

Field discovery decides which columns are read and extracted, and its result is hashed into
both fingerprints, so its order and filtering follow `loadContentMediaUsageFields` exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from media_usage_orchestration.values.errors import MediaUsageFieldDiscoveryError
from media_usage_orchestration.values.identifiers import validate_identifier
from media_usage_orchestration.values.json_text import parse_json

SUPPORTED_TOP_LEVEL_TYPES = frozenset({"file", "image", "portableText"})
DISPLAY_FIELD_SLUGS = ("title", "name")
INVALID_REPEATER_VALIDATION = MediaUsageFieldDiscoveryError.code

# Node's `localeCompare` (ICU root collation) on identifier characters: punctuation before
# digits before letters, so `a_b` < `a1` < `ab` (code-unit order would put `a1` first).
_COLLATION_RANK = {char: rank for rank, char in enumerate("_0123456789abcdefghijklmnopqrstuvwxyz")}


@dataclass(frozen=True)
class SubFieldSpec:
    slug: str
    type: str


@dataclass(frozen=True)
class ExtractionField:
    slug: str
    type: str
    sub_fields: tuple[SubFieldSpec, ...] = ()


@dataclass(frozen=True)
class FieldDiscovery:
    extraction_fields: tuple[ExtractionField, ...]
    display_field_slugs: tuple[str, ...]

    @property
    def column_slugs(self) -> tuple[str, ...]:
        """Content columns to read besides the system ones: extraction, then display fields."""
        slugs = [field.slug for field in self.extraction_fields]
        return tuple(dict.fromkeys([*slugs, *self.display_field_slugs]))


def identifier_collation_key(slug: str) -> tuple[int, ...]:
    """Sort key equal to `a.localeCompare(b)` for slugs matching `^[a-z][a-z0-9_]*$`."""
    return tuple(_COLLATION_RANK[char] for char in slug)


def discover_fields(rows: Iterable[Mapping[str, Any]]) -> FieldDiscovery:
    """Extraction and display fields from `_emdash_fields` rows (`slug`, `type`, `validation`)."""
    extraction: list[ExtractionField] = []
    present: set[str] = set()
    for row in rows:
        present.add(row["slug"])
        field = _extraction_field(row)
        if field is not None:
            extraction.append(field)
    extraction.sort(key=lambda field: identifier_collation_key(field.slug))
    display = tuple(slug for slug in DISPLAY_FIELD_SLUGS if slug in present)
    return FieldDiscovery(tuple(extraction), display)


def _extraction_field(row: Mapping[str, Any]) -> ExtractionField | None:
    slug, field_type = row["slug"], row["type"]
    if field_type in SUPPORTED_TOP_LEVEL_TYPES:
        validate_identifier(slug, "media usage field slug")
        return ExtractionField(slug, field_type)
    if field_type != "repeater":
        return None
    validate_identifier(slug, "media usage field slug")
    sub_fields = _repeater_image_sub_fields(row.get("validation"))
    # A repeater without image sub-fields holds no media usage (file sub-fields are ignored).
    return ExtractionField(slug, "repeater", sub_fields) if sub_fields else None


def _repeater_image_sub_fields(raw_validation: Any) -> tuple[SubFieldSpec, ...]:
    validation = _parse_validation(raw_validation)
    if not isinstance(validation, Mapping):
        return ()
    items = validation.get("subFields")
    if not isinstance(items, list):
        return ()
    sub_fields = []
    for item in items:
        if not isinstance(item, Mapping) or item.get("type") != "image":
            continue
        slug = item.get("slug")
        if not isinstance(slug, str):
            continue
        validate_identifier(slug, "media usage repeater sub-field slug")
        sub_fields.append(SubFieldSpec(slug, "image"))
    return tuple(sorted(sub_fields, key=lambda sub: identifier_collation_key(sub.slug)))


def _parse_validation(raw_validation: Any) -> Any:
    if not raw_validation:
        return None
    if not isinstance(raw_validation, str):
        return raw_validation  # already decoded by the driver
    try:
        return parse_json(raw_validation)
    except ValueError as error:
        raise MediaUsageFieldDiscoveryError(
            "Repeater field validation must be valid JSON before media usage can be discovered"
        ) from error
