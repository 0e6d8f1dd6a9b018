"""The Dagster resource that turns the database URL into a SQLAlchemy Engine."""

from __future__ import annotations

import threading
from collections import OrderedDict

import dagster as dg
from pydantic import PrivateAttr
from sqlalchemy import Engine

from media_usage_orchestration.dagster_kit.dagster_internals import KeepsBoundStateOnRebuild
from media_usage_orchestration.dagster_kit.outcomes import error_outcome
from media_usage_orchestration.dagster_kit.run_tags import OUTCOME_TAG
from media_usage_orchestration.processing.loop.run_heartbeat import RunHeartbeat
from media_usage_orchestration.store.core.engine import (
    SQLAlchemyError,
    create_database_engine,
    default_database_url,
    redacted_url,
)
from media_usage_orchestration.store.core.host_schema import refuse_unknown_migrations
from media_usage_orchestration.values.errors import UnknownEmdashMigration

# Sensor and schedule ticks run every few seconds in one long-lived process (the code server)
# and initialize the resource afresh each time: they share one engine per URL, so a tick
# reuses a pooled connection and SQLAlchemy's compiled statements instead of connecting and
# compiling its probes again. Runs keep an engine of their own for the run's lifetime.
MAX_SHARED_ENGINES = 4
_shared_engines: OrderedDict[str, Engine] = OrderedDict()
_shared_engines_lock = threading.Lock()


def shared_engine(url: str) -> Engine:
    """The process's engine for `url`; the least recently used beyond `MAX_SHARED_ENGINES`
    is disposed (it stays usable, reconnecting on its next use)."""
    with _shared_engines_lock:
        engine = _shared_engines.pop(url, None) or create_database_engine(url)
        _shared_engines[url] = engine
        while len(_shared_engines) > MAX_SHARED_ENGINES:
            _, evicted = _shared_engines.popitem(last=False)
            evicted.dispose()
        return engine


class MediaUsageDatabase(KeepsBoundStateOnRebuild, dg.ConfigurableResource):
    """The CMS database: SQLite (embedded default) or PostgreSQL.

    The resource has no config fields: the URL comes from `MEDIA_USAGE_DATABASE_URL` at
    execution time (falling back to `.media_usage/media_usage.db` under the working directory),
    so the Launchpad offers no field an operator could type a password into, and the URL never
    enters run config or run metadata. Code that owns its database (the demo, the bench,
    tests) names it with `for_url`, outside any run config. The engine is created in
    `setup_for_execution`, never at import.
    """

    _url: str | None = PrivateAttr(default=None)
    _engine: Engine | None = PrivateAttr(default=None)
    _owns_engine: bool = PrivateAttr(default=False)
    _contract_unchecked: bool = PrivateAttr(default=False)
    _heartbeat: RunHeartbeat | None = PrivateAttr(default=None)

    @classmethod
    def for_url(cls, url: str) -> MediaUsageDatabase:
        """The resource bound to `url` instead of the environment."""
        resource = cls()
        resource._url = url
        return resource

    def _carry_over(self, rebuilt: MediaUsageDatabase) -> None:
        # The bound URL is no config field: the copy a run initializes keeps it.
        rebuilt._url = self._url

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        if context.run is None:  # a sensor or schedule tick (or an op invoked directly)
            self._engine = shared_engine(self.resolved_url())
            return
        self._engine = create_database_engine(self.resolved_url())
        self._owns_engine = True
        self._contract_unchecked = True
        try:
            self._check_contract()
        except UnknownEmdashMigration as refusal:
            # The run fails here, before its first op: nothing was written. Its outcome tag
            # says why, as for a run stopped in its first op.
            context.instance.add_run_tags(context.run.run_id, {OUTCOME_TAG: error_outcome(refusal)})
            raise
        except SQLAlchemyError:
            pass  # checked on the engine's first use, where the op's retry policy applies
        # The run's lease says it is alive for as long as this process lives: a run whose
        # worker died is failed by the run-health sensor once the lease expires.
        self._heartbeat = RunHeartbeat(
            self._engine,
            context.run.run_id,
            context.run.job_name,
            warn=context.log.warning if context.log is not None else None,
        ).start()

    def _check_contract(self) -> None:
        """Every run's writes wait for the host-schema contract: a media usage migration of a
        later EmDash (`values/host_schema.py`) fails the run before anything is written."""
        refuse_unknown_migrations(self._engine)
        self._contract_unchecked = False

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if self._engine is not None and self._owns_engine:
            self._engine.dispose()
        self._engine = None
        self._owns_engine = False
        self._contract_unchecked = False

    def resolved_url(self) -> str:
        return self._url or default_database_url()

    @property
    def display_url(self) -> str:
        return redacted_url(self.resolved_url())

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            # Direct use outside a run (sensors, tests): create lazily, still never at import.
            self._engine = create_database_engine(self.resolved_url())
        if self._contract_unchecked:
            self._check_contract()
        return self._engine

    def __repr__(self) -> str:
        return f"MediaUsageDatabase(url={self.display_url!r})"
