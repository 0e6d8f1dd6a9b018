"""One declaration of a lease-guarded op, for every op of the reconciliation and deletion graphs.

An op takes the claim handed on as its `lease` input, may take a config, and runs one step under
the lease (`dagster_kit/leased.py: run_leased_step`) with transient database errors retried.
What differs from op to op is only the step: the decorated function builds it from the op's
context, the database engine and (when the op takes one) its config.
"""

from collections.abc import Callable
from typing import TypeVar

import dagster as dg

from media_usage_orchestration.dagster_kit.leased import (
    LeasedWorkflow,
    StepReport,
    leased_outs,
    run_leased_step,
)
from media_usage_orchestration.dagster_kit.retries import retries_transient_errors
from media_usage_orchestration.resources.database import MediaUsageDatabase

L = TypeVar("L")
Step = Callable[[L], StepReport[L]]
# (context, engine) → the step, or (context, engine, config) → the step for an op with config.
StepBuilder = Callable[..., Step]


def leased_op(
    workflow: LeasedWorkflow[L],
    lease_type: type[L],
    *,
    description: str,
    config: type[dg.Config] | None = None,
    name: str | None = None,
) -> Callable[[StepBuilder], dg.OpDefinition]:
    """Declare the op whose step the decorated function builds (named after it unless `name`)."""

    def declare(build_step: StepBuilder) -> dg.OpDefinition:
        if config is None:

            def compute(context: dg.OpExecutionContext, lease, database: MediaUsageDatabase):
                step = build_step(context, database.engine)
                yield from run_leased_step(context, workflow, database.engine, lease, step)

        else:

            def compute(
                context: dg.OpExecutionContext, lease, config, database: MediaUsageDatabase
            ):
                step = build_step(context, database.engine, config)
                yield from run_leased_step(context, workflow, database.engine, lease, step)

            # Dagster reads the op's config schema from the annotation of `config`.
            compute.__annotations__["config"] = config
        compute.__name__ = name or build_step.__name__
        compute.__doc__ = build_step.__doc__
        return dg.op(
            name=compute.__name__,
            ins={"lease": dg.In(lease_type)},
            out=leased_outs(lease_type),
            description=description,
        )(retries_transient_errors(compute))

    return declare


__all__ = ["Step", "leased_op"]
