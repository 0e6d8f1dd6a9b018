"""The one backoff policy of the durable workflows, with one instance per workflow (spec 5.1,
6.1, 7.1).

`delay_seconds(attempt_count)` is `min(max, exp + floor(exp * jitter_ratio * rng()))` with
`exp = min(max, base * 2^attempt_count)`, where `attempt_count` is the row's count *before*
this failure; the failure that brings the count to `max_attempts` is terminal. Work and
reconciliation jitter by up to 25 %; collection deletion does not jitter.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    base_seconds: int
    max_seconds: int
    jitter_ratio: float
    max_attempts: int

    def delay_seconds(self, attempt_count: int, rng: Callable[[], float] = random.random) -> int:
        """0 -> 30..37 s, 1 -> 60..74 s, ... up to 900 s with the seeds' constants; `rng`
        (drawing from [0, 1)) is not called when the policy has no jitter."""
        attempt_count = _attempt_count(attempt_count)
        # Past bit_length(max) doublings any base exceeds the cap: bounding the exponent
        # keeps the arithmetic small without changing a single delay.
        doublings = min(attempt_count, self.max_seconds.bit_length())
        exponential = min(self.max_seconds, self.base_seconds * 2**doublings)
        if not self.jitter_ratio:
            return exponential
        jitter = int(exponential * self.jitter_ratio * rng())
        return min(self.max_seconds, exponential + jitter)

    def is_terminal(self, attempt_count: int) -> bool:
        """Whether the failure after `attempt_count` earlier ones is the last attempt."""
        return _attempt_count(attempt_count) + 1 >= self.max_attempts


def _attempt_count(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("Retry attempt count must be a non-negative whole number")
    return value


# `MEDIA_USAGE_WORK_PROCESSING_LIMITS` (spec 5.1).
WORK_RETRY = RetryPolicy(base_seconds=30, max_seconds=15 * 60, jitter_ratio=0.25, max_attempts=5)
# `MEDIA_USAGE_RECONCILIATION_LIMITS` (spec 6.1): the work processor's formula.
RECONCILIATION_RETRY = RetryPolicy(
    base_seconds=30, max_seconds=15 * 60, jitter_ratio=0.25, max_attempts=5
)
# `MEDIA_USAGE_COLLECTION_DELETION_LIMITS` (spec 7.1): no jitter.
DELETION_RETRY = RetryPolicy(base_seconds=30, max_seconds=15 * 60, jitter_ratio=0.0, max_attempts=5)

__all__ = ["DELETION_RETRY", "RECONCILIATION_RETRY", "WORK_RETRY", "RetryPolicy"]
