"""A run's or step's outcome as one word: what a `dg.Failure` says, or an error's stable code."""

import dagster as dg


def failure_outcome(failure: dg.Failure) -> str:
    outcome = failure.metadata.get("outcome")
    return str(getattr(outcome, "value", outcome)) if outcome is not None else "failed"


def error_outcome(error: BaseException) -> str:
    """An error's stable code as an outcome word (`COLLECTION_NOT_FOUND` → `collection_not_found`,
    `MEDIA_USAGE_INVALID_IDENTIFIER` → `invalid_identifier`); `failed` without one."""
    code = getattr(error, "code", None)
    if not isinstance(code, str) or not code:
        return "failed"
    return code.lower().removeprefix("media_usage_")
