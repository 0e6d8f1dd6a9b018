"""Module-level factories for `dg.reconstructable`: re-execution and launched runs import the
job again by name, so it cannot be built inside a test.

Each returns the definitions' own job, whose `database` resource is `MediaUsageDatabase()`
without a URL: set MEDIA_USAGE_DATABASE_URL to the test database before executing it.
"""

import dagster as dg

from media_usage_orchestration.definitions import defs
from media_usage_orchestration.jobs import media_usage_reconciliation as _reconciliation


def media_usage_reconciliation() -> dg.JobDefinition:
    return defs.resolve_job_def(_reconciliation.name)
