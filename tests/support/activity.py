"""What a PostgreSQL server's `pg_stat_activity` says about a set of sessions, sampled every few
milliseconds from a process of its own while the test's code runs.

The sampler is a separate process with its own connection: a thread of the test's process
would compete for the interpreter lock with the code under test and lengthen the very gaps it
measures. Sessions are recognised by their `application_name`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator
from dataclasses import dataclass, field

from sqlalchemy.engine import make_url

SAMPLE_INTERVAL_SECONDS = 0.003
START_TIMEOUT_SECONDS = 60
IDLE_IN_TRANSACTION = "idle in transaction"
_STOP = "stop"
_READY = "ready"
_STATEMENT = "SELECT state FROM pg_stat_activity WHERE application_name = %s"


@dataclass
class ActivitySamples:
    """`taken` samples of the server's activity; `seen` of them showed at least one session of
    the application, `idle_in_transaction` at least one of those in that state. `states`
    counts each session observation by its state."""

    taken: int = 0
    seen: int = 0
    idle_in_transaction: int = 0
    states: dict[str, int] = field(default_factory=dict)

    def add(self, states: list[str]) -> None:
        self.taken += 1
        if not states:
            return
        self.seen += 1
        self.idle_in_transaction += IDLE_IN_TRANSACTION in states
        for state in states:
            self.states[state] = self.states.get(state, 0) + 1

    def __iadd__(self, other: ActivitySamples) -> ActivitySamples:
        self.taken += other.taken
        self.seen += other.seen
        self.idle_in_transaction += other.idle_in_transaction
        for state, count in other.states.items():
            self.states[state] = self.states.get(state, 0) + count
        return self

    @property
    def idle_in_transaction_ratio(self) -> float:
        """Of the samples where the application had a session, the share with one idle in
        a transaction."""
        return self.idle_in_transaction / self.seen if self.seen else 0.0

    def summary(self) -> str:
        return (
            f"{self.taken} samples taken, {self.seen} with a session of the application, "
            f"{self.idle_in_transaction} of those idle in transaction "
            f"({self.idle_in_transaction_ratio:.1%}); sessions by state: {self.states}"
        )


def libpq_url(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL as a libpq connection URI (its options kept)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextlib.contextmanager
def sampled_activity(url: str, application_name: str) -> Iterator[ActivitySamples]:
    """Sample the sessions named `application_name` on the server at `url` while the block
    runs; the yielded value is filled in when the block ends."""
    samples = ActivitySamples()
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    sampler = context.Process(
        target=_sample, args=(libpq_url(url), application_name, theirs), daemon=True
    )
    sampler.start()
    try:
        if not ours.poll(START_TIMEOUT_SECONDS) or ours.recv() != _READY:
            raise RuntimeError("the activity sampler did not start")
        yield samples
        ours.send(_STOP)
        samples += ours.recv()
    finally:
        sampler.join(START_TIMEOUT_SECONDS)
        if sampler.is_alive():
            sampler.terminate()


def _sample(conninfo: str, application_name: str, pipe) -> None:
    """The sampler process: one query per interval until told to stop, then the samples."""
    import psycopg

    samples = ActivitySamples()
    with psycopg.connect(conninfo, autocommit=True) as connection:
        pipe.send(_READY)
        # The pipe's poll is the sampling interval: it returns at once when told to stop.
        while not pipe.poll(SAMPLE_INTERVAL_SECONDS):
            rows = connection.execute(_STATEMENT, (application_name,)).fetchall()
            samples.add([state for (state,) in rows])
    pipe.send(samples)


__all__ = ["ActivitySamples", "libpq_url", "sampled_activity"]
