"""Dagster features the project relies on that Dagster 1.13.27 still marks preview or beta.

Each warns every time its construction runs: at import in every code server and run process,
with absolute site-packages paths, telling operators nothing they can act on. The warning is
silenced only around that construction, by its message; any other warning, from Dagster or
elsewhere, still shows.
"""

import contextlib
import warnings
from collections.abc import Iterator

# The per-collection queue and coverage assets are observable sources (assets/queue.py,
# assets/coverage_history.py).
OBSERVABLE_SOURCES = "Function `multi_observable_source_asset` is currently in beta"
# Dagster itself passes `owners` when it binds the sensors to their jobs' resources.
SENSOR_OWNERS = "Parameter `owners` of initializer `SensorDefinition.__init__` is currently in beta"


@contextlib.contextmanager
def accepting(*messages: str) -> Iterator[None]:
    """Run a construction that uses the named preview or beta features, without their warnings."""
    with warnings.catch_warnings():
        for message in messages:
            warnings.filterwarnings("ignore", message=f"^{message}")
        yield
