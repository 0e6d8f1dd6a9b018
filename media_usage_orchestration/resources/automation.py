"""Operator-tunable knobs of the automatic lane (sensors and schedules)."""

import os

import dagster as dg
from pydantic import Field

from media_usage_orchestration.processing.integrity.scrub import SLICE_ENTRIES, SLICE_SECONDS
from media_usage_orchestration.values.errors import InvalidSettingError

# How long due work may wait before the queue counts as stalled (assets/health.py).
DEFAULT_QUEUE_STALL_SECONDS = 300.0

# How long a drained work run waits for more work, for a whole deployment (overrides the
# automation resource's `work_linger_seconds`); 0 where runs execute one at a time in one
# process.
WORK_LINGER_ENV = "MEDIA_USAGE_WORK_LINGER_SECONDS"
DEFAULT_WORK_LINGER_SECONDS = 30.0
MAX_WORK_LINGER_SECONDS = 600.0


class MediaUsageAutomation(dg.ConfigurableResource):
    """How much work one automatically launched run takes on, and how many may overlap.

    These shape load only: correctness never depends on them (every step is lease-guarded).
    """

    max_work_runs: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Work runs that may be queued or running at once. A drained run lingers "
        "for more of its collection's work, holding its place: as many as the collections "
        "edited at once keep every edit within a lingering run (beyond that, the oldest run "
        "gives its place to a collection left waiting).",
    )
    work_runs_per_collection: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Work runs of one collection that may be queued or running at once (more "
        "drain a large backlog of one collection in parallel).",
    )
    work_items_per_run: int = Field(default=5000, ge=1, description="Items one work run takes on.")
    work_seconds_per_run: float = Field(
        default=600.0,
        gt=0,
        le=3600,
        description="Time budget of one work run. While its collection's edits keep arriving "
        "a work run lasts this long, then hands over to its successor: fewer, longer runs "
        "mean fewer run starts and events.",
    )
    work_linger_seconds: float = Field(
        default=DEFAULT_WORK_LINGER_SECONDS,
        ge=0,
        le=MAX_WORK_LINGER_SECONDS,
        description="How long a drained work run waits for more of its collection's work "
        "before it ends (0: it ends at once). While it waits, edits are projected within about "
        "half a second, without a new run.",
    )
    work_batch_size: int = Field(
        default=25, ge=1, le=100, description="Work items claimed per statement."
    )
    queue_stall_seconds: float = Field(
        default=DEFAULT_QUEUE_STALL_SECONDS,
        ge=60,
        le=86400,
        description="How long a collection's oldest due work item may wait (and its coverage "
        "stay incomplete without progress) before queue_healthy (and coverage_complete) fail.",
    )
    scrub_slice_entries: int = Field(
        default=SLICE_ENTRIES,
        ge=1,
        le=5000,
        description="Entries the scrubber sensor compares with their content per tick.",
    )
    scrub_slice_seconds: float = Field(
        default=SLICE_SECONDS,
        gt=0,
        le=30,
        description="Time budget of one scrubber tick's comparison.",
    )


def work_linger_from_environment(default: float = DEFAULT_WORK_LINGER_SECONDS) -> float:
    """`MEDIA_USAGE_WORK_LINGER_SECONDS`, or `default` (the resource's value) when it is unset;
    anything but a number of seconds from 0 to 600 is refused, saying why. Read when the
    sensor asks for a run, not baked into the resource: the jobs' snapshots stay the same
    whatever a process sets, so runs of the demo's lanes (which set 0) re-execute in `make
    dev` as they are."""
    text = os.environ.get(WORK_LINGER_ENV, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_WORK_LINGER_SECONDS:
        raise InvalidSettingError(
            f"{WORK_LINGER_ENV} must be a number of seconds from 0 to "
            f"{MAX_WORK_LINGER_SECONDS:g}, not {text!r}"
        )
    return seconds
