"""Where a reconciliation spends its time: scan, drain, sources, finalize.

The walks and steps both drivers share (`run_to_completion` and the ops) mark the phase they
run with `phase(name)`. Nothing listens unless a `PhaseClock` is installed with `timing`, as the
bench does; then each phase's seconds are exclusive (a nested phase pauses the outer one) and
everything outside a phase (claiming, preparing, Dagster's own work) is `other`, so the phases
sum to the time measured.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping

PHASES = ("scan", "drain", "sources", "finalize")
OTHER = "other"

_installed: PhaseClock | None = None


class PhaseClock:
    """Exclusive seconds per phase since `timing` began, and the phase running now; `on_enter`
    callbacks run when their phase is entered (the bench starts its workers with the drain)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        on_enter: Mapping[str, Callable[[], None]] | None = None,
    ) -> None:
        self.clock = clock
        self.on_enter = dict(on_enter or {})
        self.seconds: dict[str, float] = defaultdict(float)
        self.current = OTHER
        self._mark = clock()
        self._lock = threading.Lock()

    def switch(self, name: str) -> str:
        """Charge the time since the last switch to the running phase and run `name` from now;
        returns the phase that was running."""
        with self._lock:
            moment = self.clock()
            self.seconds[self.current] += moment - self._mark
            self._mark = moment
            previous, self.current = self.current, name
        if name != previous and name in self.on_enter:
            self.on_enter[name]()
        return previous

    def stop(self) -> dict[str, float]:
        """Charge the running phase up to now; every phase and `other`, in that order."""
        self.switch(OTHER)
        return {name: self.seconds.get(name, 0.0) for name in (*PHASES, OTHER)}


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark the block as phase `name` on the installed clock, if any."""
    clock = _installed
    if clock is None:
        yield
        return
    previous = clock.switch(name)
    try:
        yield
    finally:
        clock.switch(previous)


@contextlib.contextmanager
def timing(clock: PhaseClock) -> Iterator[PhaseClock]:
    """Install `clock` for the block (one at a time, for this process)."""
    global _installed
    if _installed is not None:
        raise RuntimeError("A phase clock is already installed")
    _installed = clock
    try:
        yield clock
    finally:
        _installed = None


def current_phase() -> str:
    clock = _installed
    return OTHER if clock is None else clock.current


__all__ = ["OTHER", "PHASES", "PhaseClock", "current_phase", "phase", "timing"]
