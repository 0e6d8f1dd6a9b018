"""Every use of Dagster's internals (`dagster._…` modules and private methods), in one place.

The rest of the package uses Dagster's public API only (`tests/unit/test_architecture.py` fails
on any `dagster._` elsewhere). Each use below says why no public API serves and what would
replace it. The pins (dagster 1.13.27) keep them working; an upgrade reads this module first.
"""

import datetime
import unittest.mock
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg

# --- leased steps (dagster_kit/leased.py) ---------------------------------------------------
# Whether a step of this run consumes an op's output decides who writes the run's final
# outcome tag. Dagster's public API has the job's graph but not the execution plan of the run
# (a re-execution of selected steps, a re-execution from failure). Replace with a public
# "steps to execute" view of the plan, if Dagster offers one.
from dagster._core.execution.context.invocation import BaseDirectExecutionContext
from dagster._core.execution.plan.outputs import StepOutputHandle


def is_direct_invocation(context: dg.OpExecutionContext) -> bool:
    """An op invoked directly (`op(context)` in a test), outside any run."""
    return isinstance(context, BaseDirectExecutionContext)


def output_consumed_in_run(context: dg.OpExecutionContext, output_name: str) -> bool:
    """Whether a step this run executes takes `output_name` of the current step."""
    step_context = context.get_step_execution_context()
    handle = StepOutputHandle(step_context.step.key, output_name)
    return any(
        handle in step_input.get_step_output_handle_dependencies()
        for step in step_context.execution_plan.get_steps_to_execute_in_topo_order()
        for step_input in step.step_inputs
    )


# --- code location loads (assets/coverage_history.py) ---------------------------------------
# Which collections get a coverage history asset is stored at load and read back on
# reconstruction (a run worker must declare the same assets the location loaded). Dagster
# exports `dg.defs_loader` and reconstruction metadata, but not the load context's type.
# Replace with `dg.DefinitionsLoadContext` once Dagster exports it.
from dagster._core.definitions.definitions_load_context import (  # noqa: E402
    DefinitionsLoadContext,
    DefinitionsLoadType,
)

# --- instances and the sensor daemon's iteration (local/daemon_lane.py, bench/) ---------------
# The demo's daemon lane runs the sensor daemon's own iteration over the workspace's code
# location in this process, on a clock it moves, with runs executed synchronously; the bench
# reads tick and instigator states. No public API runs one daemon iteration or opens an
# instance from a directory with overrides. Replace with `dagster-daemon` processes where a
# lane may take minutes (the deployment tests already do).
from dagster._core.definitions.repository_definition import (  # noqa: E402
    SINGLETON_REPOSITORY_NAME,
)

# --- check evaluations (sensors/alerts.py) ---------------------------------------------------
# The alert sensor reads each check's latest execution status per partition from the event
# log storage, whose public methods take and return these record types. Replace with their
# public exports, if Dagster adds them.
from dagster._core.event_api import PartitionKeyFilter  # noqa: E402
from dagster._core.instance.ref import InstanceRef  # noqa: E402
from dagster._core.scheduler.instigation import InstigatorType, TickStatus  # noqa: E402
from dagster._core.storage.asset_check_execution_record import (  # noqa: E402
    COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES,
    AssetCheckExecutionRecordStatus,
)
from dagster._core.test_utils import get_freezable_log_manager  # noqa: E402
from dagster._core.workspace.context import WorkspaceProcessContext  # noqa: E402
from dagster._core.workspace.load_target import WorkspaceFileTarget  # noqa: E402
from dagster._daemon.sensor import execute_sensor_iteration  # noqa: E402

# Every launched run executed before `launch` returns, in this process.
SYNCHRONOUS_EXECUTION: dict[str, Any] = {
    "run_coordinator": {
        "module": "dagster._core.run_coordinator",
        "class": "DefaultRunCoordinator",
    },
    "run_launcher": {
        "module": "dagster._core.launcher.sync_in_memory_run_launcher",
        "class": "SyncInMemoryRunLauncher",
    },
}


def instance_from_dir(home: str, overrides: dict[str, Any] | None = None) -> dg.DagsterInstance:
    """The instance of a DAGSTER_HOME directory, with its settings overridden."""
    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(home, overrides=overrides))


@contextmanager
def dagster_clock(now: Callable[[], float]) -> Iterator[None]:
    """Dagster's clock read from `now`: the same three hooks as Dagster's own `freeze_time`,
    with a clock that runs."""
    with (
        unittest.mock.patch(
            "dagster._time._mockable_get_current_datetime",
            side_effect=lambda: datetime.datetime.fromtimestamp(now(), datetime.UTC),
        ),
        unittest.mock.patch("dagster._time._mockable_get_current_timestamp", side_effect=now),
        unittest.mock.patch(
            "dagster._core.log_manager.DagsterLogManager", new=get_freezable_log_manager()
        ),
    ):
        yield


# --- resources (resources/database.py) -------------------------------------------------------
class KeepsBoundStateOnRebuild:
    """For a `dg.ConfigurableResource` bound to state that is no config field (the database
    URL the demo, the bench and the tests bind with `for_url`, kept out of run config so a
    password never shows): Dagster rebuilds the resource from its config fields when a run
    initializes it (the private `_with_updated_values`), and `_carry_over` hands the bound
    state to the rebuilt copy. Replace with a config field Dagster never displays, if it
    offers one."""

    def _with_updated_values(self, values):
        rebuilt = super()._with_updated_values(values)  # type: ignore[misc]
        self._carry_over(rebuilt)
        return rebuilt

    def _carry_over(self, rebuilt: Any) -> None:
        raise NotImplementedError


__all__ = [
    "COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES",
    "SINGLETON_REPOSITORY_NAME",
    "SYNCHRONOUS_EXECUTION",
    "AssetCheckExecutionRecordStatus",
    "DefinitionsLoadContext",
    "DefinitionsLoadType",
    "InstigatorType",
    "KeepsBoundStateOnRebuild",
    "PartitionKeyFilter",
    "TickStatus",
    "WorkspaceFileTarget",
    "WorkspaceProcessContext",
    "dagster_clock",
    "execute_sensor_iteration",
    "instance_from_dir",
    "is_direct_invocation",
    "output_consumed_in_run",
]
