"""A run's heartbeat: the run lease (`store/runs/run_leases.py`) kept alive from a thread of the run
worker for as long as its process lives.

The lease lasts `RUN_LEASE_SECONDS` and is renewed every `HEARTBEAT_SECONDS` (a sixth of it,
so five renewals in a row can fail, on a busy database, before a live run looks dead). A
worker whose process dies stops renewing; the run-health sensor finds the lease expired on the
database clock within `RUN_LEASE_SECONDS` plus one of its ticks and fails the run.

The thread never touches another lease: the items, coordinator rows and tombstones a run holds
keep their own leases, renewed (or not) by the steps themselves, so a run interrupted between
two renewals leaves them to expire as before.

A database that cannot be reached when the run starts delays the lease, it does not lose it:
the thread keeps trying to take it at every beat, so the run's lease appears within a beat
of the database coming back. A renewal that finds the lease expired stops the thread (the run
was judged dead: it must not look alive again).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from media_usage_orchestration.store.core.engine import (
    DBAPIError,
    Engine,
    SQLAlchemyError,
    is_missing_table,
)
from media_usage_orchestration.store.runs.run_leases import (
    RunLease,
    begin_run_lease,
    end_run_lease,
    prune_expired_run_leases,
    renew_run_lease,
)

RUN_LEASE_SECONDS = 30
HEARTBEAT_SECONDS = 5

log = logging.getLogger(__name__)


class RunHeartbeat:
    """Takes and renews one run's lease from a daemon thread; `stop` gives it up."""

    def __init__(
        self,
        engine: Engine,
        run_id: str,
        job_name: str,
        *,
        lease_seconds: int = RUN_LEASE_SECONDS,
        interval_seconds: float = HEARTBEAT_SECONDS,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.run_id = run_id
        self.job_name = job_name
        self.lease_seconds = lease_seconds
        self.interval_seconds = interval_seconds
        self.warn = warn or self.warn_default
        self.lease: RunLease | None = None
        self.lost = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"media-usage-run-lease-{run_id[:8]}", daemon=True
        )

    @staticmethod
    def warn_default(message: str) -> None:
        log.warning(message)

    def start(self) -> RunHeartbeat:
        """Take the lease now (so the run is known alive before its first step) and keep it
        from the thread."""
        self._take_or_renew()
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread and give the lease up (it expires by itself if that fails)."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_seconds + 5)
        if self.lease is not None and not self.lost:
            try:
                end_run_lease(self.engine, self.lease)
            except SQLAlchemyError as error:
                self.warn(f"run lease not given up (it expires by itself): {error}")

    def _beat(self) -> None:
        while not self._stopped.wait(self.interval_seconds):
            if self.lost:
                return
            self._take_or_renew()

    def _take_or_renew(self) -> None:
        try:
            if self.lease is None:
                self._take()
            elif not renew_run_lease(self.engine, self.lease, self.lease_seconds):
                self.lost = True
                self.warn(
                    f"run lease of {self.run_id} expired before it was renewed: the run may "
                    "have been judged dead; its steps' own leases still guard every write"
                )
        except SQLAlchemyError as error:
            if isinstance(error, DBAPIError) and is_missing_table(error):
                # A database EmDash created that `media-usage init` has not completed yet.
                self.lost = True
                self.warn(
                    "this database has no run leases (_muo_run_leases): run `media-usage "
                    "init`, or the run-health sensor cannot tell this run from a dead one"
                )
            else:
                self.warn(f"run lease of {self.run_id} not renewed (retried next beat): {error}")

    def _take(self) -> None:
        self.lease = begin_run_lease(self.engine, self.run_id, self.job_name, self.lease_seconds)
        if self.lease is None:
            self.lost = True
            self.warn(f"run {self.run_id} already has a run lease held by another worker")
            return
        prune_expired_run_leases(self.engine)


__all__ = ["HEARTBEAT_SECONDS", "RUN_LEASE_SECONDS", "RunHeartbeat"]
