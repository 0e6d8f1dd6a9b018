"""Refusals that carry EmDash's stable error codes, shared by the CMS writer and the deletion
request path. Dependency-free, so every layer may raise them."""

from __future__ import annotations


class CmsError(ValueError):
    """A refused CMS write; `code` is EmDash's (COLLECTION_EXISTS, COLLECTION_NOT_FOUND, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ActivationInProgressError(CmsError):
    """EmDash's write fence: schema and content writes wait while activation runs."""

    def __init__(self) -> None:
        super().__init__(
            "MEDIA_USAGE_ACTIVATION_IN_PROGRESS",
            "Writes are paused while media usage capture is being activated",
        )


class CollectionHasContentError(CmsError):
    def __init__(self, collection_slug: str) -> None:
        super().__init__(
            "COLLECTION_HAS_CONTENT",
            f'Collection "{collection_slug}" has content. Use force: true to delete.',
        )


class CollectionNotFoundError(CmsError):
    def __init__(self, collection_slug: str) -> None:
        super().__init__("COLLECTION_NOT_FOUND", f'Collection "{collection_slug}" not found')


class DeletionConflictError(CmsError):
    def __init__(self, message: str) -> None:
        super().__init__("CONFLICT", message)
