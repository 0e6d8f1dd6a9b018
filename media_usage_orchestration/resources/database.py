"""The Dagster resource that turns a database URL into a SQLAlchemy Engine."""

import dagster as dg
from pydantic import Field, PrivateAttr
from sqlalchemy import Engine

from ..store.engine import (
    DATABASE_URL_ENV,
    create_database_engine,
    default_database_url,
    redacted_url,
)


class MediaUsageDatabase(dg.ConfigurableResource):
    """The CMS database: SQLite (embedded default) or PostgreSQL.

    Leave `url` unset to read `MEDIA_USAGE_DATABASE_URL` at execution time (falling back to
    `.media_usage/media_usage.db` under the working directory), so the URL and its password
    never enter run config or run metadata. The engine is created in `setup_for_execution`,
    never at import.
    """

    url: str | None = Field(
        default=None,
        description=(
            f"SQLAlchemy URL of the CMS database. Unset: ${DATABASE_URL_ENV}, else the SQLite "
            "file .media_usage/media_usage.db."
        ),
    )

    _engine: Engine | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._engine = create_database_engine(self.resolved_url())

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def resolved_url(self) -> str:
        return self.url or default_database_url()

    @property
    def display_url(self) -> str:
        return redacted_url(self.resolved_url())

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            # Direct use outside a run (sensors, tests): create lazily, still never at import.
            self._engine = create_database_engine(self.resolved_url())
        return self._engine

    def __repr__(self) -> str:
        return f"MediaUsageDatabase(url={self.display_url!r})"
