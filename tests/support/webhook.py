"""The local webhook receiver (`media_usage_orchestration.bench.webhook`) as the alert sensor's
tests and the deployment tier use it: at a path holding a secret token, to prove the token
appears nowhere the project writes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from media_usage_orchestration.bench.webhook import Receiver
from media_usage_orchestration.bench.webhook import receiving as receiving_at

# A token such as a Slack webhook URL carries: it must appear nowhere the project writes.
SECRET = "T0000/B0000/s3cr3t-t0ken"


@contextlib.contextmanager
def receiving() -> Iterator[Receiver]:
    with receiving_at(f"/services/{SECRET}") as receiver:
        yield receiver


__all__ = ["SECRET", "Receiver", "receiving"]
