"""Operator-tunable knobs of the automatic lane (sensors and schedules)."""

import dagster as dg
from pydantic import Field

from media_usage_orchestration.processing.scrub import SLICE_ENTRIES, SLICE_SECONDS


class MediaUsageAutomation(dg.ConfigurableResource):
    """How much work one automatically launched run takes on, and how many may overlap.

    These shape load only: correctness never depends on them (every step is lease-guarded).
    """

    max_work_runs: int = Field(
        default=2, ge=1, le=64, description="Work runs that may be queued or running at once."
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
        default=120.0, gt=0, le=3600, description="Time budget of one work run."
    )
    work_batch_size: int = Field(
        default=25, ge=1, le=100, description="Work items claimed per statement."
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
