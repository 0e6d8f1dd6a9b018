"""Identifier validation: the only values ever spliced into SQL text.

Slugs and field slugs name tables and columns, so they are checked before any SQL runs.
Everything else is a bound parameter.
"""

from __future__ import annotations

import re

from media_usage_orchestration.values.errors import InvalidIdentifierError

IDENTIFIER_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")
MAX_IDENTIFIER_LENGTH = 128
ERROR_CODE_PATTERN = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
CONTENT_TABLE_PREFIX = "ec_"
# The label under which a content read returns the registry id it joined (never a field slug:
# those match IDENTIFIER_PATTERN, which has no leading underscore).
COLLECTION_ID_RESULT = "__emdash_media_usage_collection_id"


def validate_identifier(value: object, label: str) -> str:
    if (
        not isinstance(value, str)
        or len(value) > MAX_IDENTIFIER_LENGTH
        or not IDENTIFIER_PATTERN.fullmatch(value)
    ):
        raise InvalidIdentifierError(
            f"Invalid {label}: {value!r} must match {IDENTIFIER_PATTERN.pattern} "
            f"and be at most {MAX_IDENTIFIER_LENGTH} characters"
        )
    return value


def content_table_name(collection_slug: str) -> str:
    """`ec_<slug>`, with both the slug and the resulting table name validated."""
    validate_identifier(collection_slug, "collection slug")
    return validate_identifier(f"{CONTENT_TABLE_PREFIX}{collection_slug}", "content table")


def quote_identifier(identifier: str) -> str:
    """Double-quote an already validated identifier (valid on SQLite and PostgreSQL)."""
    validate_identifier(identifier, "identifier")
    return f'"{identifier}"'


def validate_error_code(code: object, label: str = "error code") -> str:
    if not isinstance(code, str) or not ERROR_CODE_PATTERN.fullmatch(code):
        raise ValueError(f"{label} must use a stable SCREAMING_SNAKE_CASE value")
    return code


def require_text(value: object, message: str) -> str:
    """Identities (collection ids, tokens) must be non-empty strings."""
    if not isinstance(value, str) or not value:
        raise ValueError(message)
    return value
