"""The one Dagster `Definitions` object of the project."""

from __future__ import annotations

import dagster as dg

from .resources.database import MediaUsageDatabase

defs = dg.Definitions(
    resources={"database": MediaUsageDatabase()},
    executor=dg.in_process_executor,
)
