"""Work runs in other processes, as a PostgreSQL deployment runs them beside a reconciliation.

Each worker is a process of its own (spawned, so it shares nothing with this one) that connects,
says it is ready and waits; once released it does what a work run does (`drain_due_work`:
batches of due work, each item under its own lease) until nothing is due, then reports what it
claimed and how many statements it sent. Starting the processes happens before the clock
starts; releasing them is part of the measurement.
"""

from __future__ import annotations

import multiprocessing
import queue
from dataclasses import dataclass

from media_usage_orchestration.emdash_double.statement_counter import counting_statements
from media_usage_orchestration.processing.loop.run_loop import Budget, drain_due_work
from media_usage_orchestration.store.core.engine import create_database_engine

READY_TIMEOUT_SECONDS = 120


@dataclass(frozen=True)
class WorkerReport:
    claimed: int
    completed: int
    statements: int


def _work_run(url: str, batch_size: int, ready, release, reports) -> None:
    engine = create_database_engine(url)
    try:
        with engine.connect():
            pass  # the pool holds a connection before the clock starts
        with counting_statements(url) as counts:
            ready.release()
            release.wait()
            drained = drain_due_work(engine, Budget(), batch_size)
        reports.put(WorkerReport(drained.counts.claimed, drained.counts.completed, counts.total))
    finally:
        engine.dispose()


class WorkerPool:
    """`count` work-run processes on the database at `url`, released together."""

    def __init__(self, url: str, count: int, batch_size: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._ready = context.Semaphore(0)
        self._release = context.Event()
        self._reports = context.Queue()
        self._processes = [
            context.Process(
                target=_work_run,
                args=(url, batch_size, self._ready, self._release, self._reports),
                name=f"bench-work-run-{index}",
                daemon=True,
            )
            for index in range(count)
        ]

    def start(self) -> None:
        """Start every process and wait until each is connected and waiting."""
        for process in self._processes:
            process.start()
        for process in self._processes:
            if not self._ready.acquire(timeout=READY_TIMEOUT_SECONDS):
                self.stop()
                raise RuntimeError(f"{process.name} did not get ready")

    def release(self) -> None:
        self._release.set()

    def join(self) -> list[WorkerReport]:
        """Wait for every process to finish its drain; their reports."""
        reports: list[WorkerReport] = []
        while len(reports) < len(self._processes):
            try:
                reports.append(self._reports.get(timeout=1))
            except queue.Empty:
                if not any(process.is_alive() for process in self._processes):
                    codes = [process.exitcode for process in self._processes]
                    raise RuntimeError(
                        f"a work run ended without reporting (exit {codes})"
                    ) from None
        for process in self._processes:
            process.join()
        return reports

    def stop(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.terminate()
            process.join()
