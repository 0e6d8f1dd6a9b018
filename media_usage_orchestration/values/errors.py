"""Every error this project raises, under one base that carries a stable `code`: EmDash's where
EmDash has one (COLLECTION_NOT_FOUND, CONFLICT, MEDIA_USAGE_ACTIVATION_IN_PROGRESS, ...), a
`MEDIA_USAGE_*` code otherwise. It imports nothing beyond the values leaf, so every layer may
raise them.

Errors that callers catch as a builtin kind keep it as a second base (bad input is a
`ValueError`, a refused lifecycle step a `RuntimeError`).
"""

from __future__ import annotations

from media_usage_orchestration.values.source_records import SourceProjection


class MediaUsageError(Exception):
    """The base of every project error; `code` is stable (a class's own, or one given when it
    is raised)."""

    code = "MEDIA_USAGE_ERROR"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


# --- bad input ----------------------------------------------------------------------------------


class InvalidIdentifierError(MediaUsageError, ValueError):
    """A slug or table name that may not reach SQL."""

    code = "MEDIA_USAGE_INVALID_IDENTIFIER"


class InvalidCursorError(MediaUsageError, ValueError):
    """A cursor that this project did not produce."""

    code = "INVALID_CURSOR"


class OperatorInputError(MediaUsageError, ValueError):
    """Operator input that cannot be acted on; nothing was written. `code` is the spec's API
    code: VALIDATION_ERROR, INVALID_CURSOR, NOT_FOUND or COLLECTION_NOT_FOUND."""

    code = "VALIDATION_ERROR"


class InvalidSettingError(MediaUsageError, ValueError):
    """An environment setting of the deployment that cannot be used; the location refuses to
    load rather than run with a value nobody chose."""

    code = "MEDIA_USAGE_INVALID_SETTING"


class DatabaseFileError(MediaUsageError, ValueError):
    """The SQLite file cannot be used as asked: a read-only engine's file does not exist
    (raised on connecting; nothing is created), or a new file's directory cannot be made."""

    code = "MEDIA_USAGE_DATABASE_FILE"


# --- the host-schema contract (EmDash's migrations) ----------------------------------------------


class HostSchemaError(MediaUsageError, RuntimeError):
    """The database's EmDash migrations (`_emdash_migrations`) are not the media usage
    migrations this project implements (`values/host_schema.py`); nothing was written."""

    code = "MEDIA_USAGE_HOST_SCHEMA_MISMATCH"


class UnknownEmdashMigration(HostSchemaError):
    """A later EmDash ran a media usage migration the project does not know: every writer
    refuses until the project is upgraded."""

    code = "MEDIA_USAGE_UNKNOWN_EMDASH_MIGRATION"


class MissingEmdashMigration(HostSchemaError):
    """An older EmDash has not run a media usage migration the project implements: `init`
    refuses to create EmDash's tables in its migrator's place."""

    code = "MEDIA_USAGE_MISSING_EMDASH_MIGRATION"


# --- reading and projecting content ---------------------------------------------------------------


class MediaUsageFieldDiscoveryError(MediaUsageError, ValueError):
    """A field definition that makes media usage undiscoverable; `code` is EmDash's."""

    code = "INVALID_REPEATER_VALIDATION"


class DraftRevisionError(MediaUsageError):
    """The draft revision cannot be overlaid (`code` is a DRAFT_REVISION_* snapshot error).
    `source` is the draft source as attempted (descriptive columns, no fingerprint), for
    recording the failure against it."""

    def __init__(self, code: str, message: str, source: SourceProjection) -> None:
        super().__init__(message, code)
        self.source = source


class RegistryUnreadable(MediaUsageError):
    """The registry could not be read: no database, no schema, a driver missing, a bad URL.
    The message is safe to show (no password)."""

    code = "MEDIA_USAGE_REGISTRY_UNREADABLE"


class AlertNotDelivered(MediaUsageError, RuntimeError):
    """The alert sensor's webhook took none of the tick's messages: the tick fails, so the
    tick history shows it, and the next tick posts them again."""

    code = "MEDIA_USAGE_ALERT_NOT_DELIVERED"


class CoverageIncomplete(MediaUsageError):
    """An answer that needs complete coverage was asked for while it is not (a problem, not bad
    input: exit 1)."""

    code = "MEDIA_USAGE_COVERAGE_INCOMPLETE"


# --- capture lifecycles ---------------------------------------------------------------------------


class ActivationError(MediaUsageError, RuntimeError):
    """An activation step failed; the failure is recorded on the activation row."""

    code = "MEDIA_USAGE_ACTIVATION_FAILED"


class ActivationGenerationError(MediaUsageError, RuntimeError):
    """The database was activated by an incompatible runtime generation."""

    code = "MEDIA_USAGE_ACTIVATION_GENERATION_MISMATCH"


class LifecycleConflictError(MediaUsageError, RuntimeError):
    """The status row belongs to another collection identity or lifecycle."""

    code = "MEDIA_USAGE_LIFECYCLE_CONFLICT"


class CaptureLifecycleError(MediaUsageError, RuntimeError):
    """A trigger change was attempted outside the fenced lifecycle states."""

    code = "MEDIA_USAGE_CAPTURE_LIFECYCLE_CONFLICT"


# --- collection deletion --------------------------------------------------------------------------


class DeletionError(MediaUsageError, RuntimeError):
    """A refused deletion step."""

    code = "MEDIA_USAGE_COLLECTION_DELETION_FAILED"


class StatementTimedOut(MediaUsageError, RuntimeError):
    """A bounded read was cancelled at its time limit; it changed nothing."""

    code = "MEDIA_USAGE_STATEMENT_TIMED_OUT"


class FloorLeaseLost(MediaUsageError, RuntimeError):
    """The bench floor's coordinator row is no longer leased to it: nothing of its page is
    kept."""

    code = "MEDIA_USAGE_FLOOR_LEASE_LOST"


class DeletionIdentityConflict(DeletionError):
    code = "MEDIA_USAGE_COLLECTION_DELETION_IDENTITY_CONFLICT"


class DeletionLeaseLost(DeletionError):
    code = "MEDIA_USAGE_COLLECTION_DELETION_LEASE_LOST"


class DeletionCleanupIncomplete(DeletionError):
    code = "MEDIA_USAGE_COLLECTION_DELETION_INCOMPLETE"


class DeletionNotReady(DeletionError):
    """Capture is not in a state that lets the deletion be fenced; nothing was removed."""

    code = "MEDIA_USAGE_COLLECTION_DELETION_NOT_READY"


# --- refusals of the CMS (EmDash's codes) ---------------------------------------------------------


class CmsError(MediaUsageError, ValueError):
    """A refused CMS write; `code` is EmDash's (COLLECTION_EXISTS, NOT_FOUND, ...)."""

    code = "VALIDATION_ERROR"


class ActivationInProgressError(CmsError):
    """EmDash's write fence: schema and content writes wait while activation runs."""

    code = "MEDIA_USAGE_ACTIVATION_IN_PROGRESS"

    def __init__(self) -> None:
        super().__init__("Writes are paused while media usage capture is being activated")


class CollectionHasContentError(CmsError):
    code = "COLLECTION_HAS_CONTENT"

    def __init__(self, collection_slug: str) -> None:
        super().__init__(f'Collection "{collection_slug}" has content. Use force: true to delete.')


class CollectionNotFoundError(CmsError):
    code = "COLLECTION_NOT_FOUND"

    def __init__(self, collection_slug: str) -> None:
        super().__init__(f'Collection "{collection_slug}" not found')


class DeletionConflictError(CmsError):
    code = "CONFLICT"


__all__ = [
    "ActivationError",
    "ActivationGenerationError",
    "ActivationInProgressError",
    "CaptureLifecycleError",
    "CmsError",
    "CollectionHasContentError",
    "CollectionNotFoundError",
    "CoverageIncomplete",
    "DatabaseFileError",
    "DeletionCleanupIncomplete",
    "DeletionConflictError",
    "DeletionError",
    "DeletionIdentityConflict",
    "DeletionLeaseLost",
    "DeletionNotReady",
    "DraftRevisionError",
    "HostSchemaError",
    "InvalidCursorError",
    "InvalidIdentifierError",
    "LifecycleConflictError",
    "MediaUsageError",
    "MediaUsageFieldDiscoveryError",
    "MissingEmdashMigration",
    "OperatorInputError",
    "RegistryUnreadable",
    "UnknownEmdashMigration",
]
