"""Progress of a long op in its run log: how much is done (of how much, when that is known)
and the rate, at INFO, at most one line every `PROGRESS_INTERVAL_SECONDS`, and a final line
with the total once any line was written. An op over within the interval writes none: its
output's metadata has its counts and its step event its duration, so a line would only add an
event to every run.

The loops themselves (`processing/loop/run_loop.py`, `processing/reconciliation/walks.py`) only
call a plain callable with each page's or batch's result; this module counts and throttles.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import dagster as dg

R = TypeVar("R")

PROGRESS_INTERVAL_SECONDS = 1.0
# A lingering work run drains a burst per edit: a line a second would be a line per batch, the
# bulk of its events. Its liveness shows every half minute.
WORK_PROGRESS_INTERVAL_SECONDS = 30.0


class ProgressLog:
    """Counts what an op has done and writes a throttled line through `log`."""

    def __init__(
        self,
        log: Callable[[str], None],
        what: str,
        unit: str,
        *,
        total: int | None = None,
        interval: float = PROGRESS_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        detail: Callable[[], str] | None = None,
    ) -> None:
        self.log = log
        self.what = what
        self.unit = unit
        self.total = total
        self.interval = interval
        self.clock = clock
        self.detail = detail
        self.started = self.last_line = clock()
        self.done = 0
        self.lines = 0

    def add(self, amount: int) -> None:
        self.done += amount
        now = self.clock()
        if now - self.last_line >= self.interval:
            self.last_line = now
            self.lines += 1
            self.log(f"{self.what}: {self._so_far(now)}")

    def counting(self, amount: Callable[[R], int]) -> Callable[[R], None]:
        """The callback a loop is given: each result adds `amount(result)`."""
        return lambda result: self.add(amount(result))

    def finish(self) -> None:
        """The total, closing the lines written so far (none: nothing to close)."""
        if self.lines:
            self.log(f"{self.what}: finished, {self._so_far(self.clock())}")

    def _so_far(self, now: float) -> str:
        elapsed = max(now - self.started, 0.0)
        rate = self.done / elapsed if elapsed > 0 else 0.0
        of_total = f" of at most {self.total}" if self.total is not None else ""
        detail = f"; {self.detail()}" if self.detail is not None else ""
        return (
            f"{self.done}{of_total} {self.unit} in {elapsed:.1f} s ({rate:.1f} {self.unit}/s)"
            f"{detail}"
        )


@contextlib.contextmanager
def logged_progress(
    context: dg.OpExecutionContext,
    what: str,
    unit: str,
    *,
    total: int | None = None,
    detail: Callable[[], str] | None = None,
    interval: float | None = None,
) -> Iterator[ProgressLog]:
    """A `ProgressLog` on the op's INFO log whose final line is written however the op ends;
    `detail` adds what the count alone does not say to each line; a line at most every
    `interval` seconds (`PROGRESS_INTERVAL_SECONDS` unless given)."""
    progress = ProgressLog(
        context.log.info,
        what,
        unit,
        total=total,
        interval=PROGRESS_INTERVAL_SECONDS if interval is None else interval,
        detail=detail,
    )
    try:
        yield progress
    finally:
        progress.finish()
