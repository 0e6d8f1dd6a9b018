"""Invoke one op directly, as a run would, and read what it emitted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg

from tests.support.sensor_loop import plain, resources


@dataclass(frozen=True)
class OpResult:
    """What one op invocation emitted: every output's value and metadata by output name.

    `metadata` is the reporting output's (the `lease` handed on, else `outcome` when the op
    stopped the run there, else `result`); `lease` is the lease or claim handed on to the next
    op (None when the op stopped the run there)."""

    values: dict[str, Any]
    metadata_of: dict[str, dict[str, Any]]

    @property
    def metadata(self) -> dict[str, Any]:
        [reporting] = [name for name in ("lease", "outcome", "result") if name in self.metadata_of]
        return self.metadata_of[reporting]

    @property
    def outcome(self) -> str:
        return self.metadata["outcome"]

    @property
    def lease(self) -> Any:
        return self.values.get("lease")


def invoke(
    op_def: dg.OpDefinition,
    db,
    lease: Any = None,
    *,
    instance: dg.DagsterInstance | None = None,
    partition_key: str | None = None,
    op_config: Mapping[str, Any] | None = None,
    run_tags: Mapping[str, str] | None = None,
) -> OpResult:
    """Call `op_def` with the project's resources for `db`, the given config, run tags,
    partition and instance, and `lease` as its input when given; it must emit exactly one of
    a `lease` (handed on), an `outcome` (stopped there) or a `result`."""
    with dg.build_op_context(
        resources=resources(db),
        instance=instance,
        partition_key=partition_key,
        op_config=dict(op_config) if op_config else None,
        run_tags=dict(run_tags) if run_tags else None,
    ) as context:
        outputs = list(op_def(context) if lease is None else op_def(context, lease))
    by_name = {output.output_name: output for output in outputs}
    assert len(by_name) == len(outputs), outputs
    assert set(by_name) in ({"outcome"}, {"lease"}, {"result"}), by_name
    return OpResult(
        {name: output.value for name, output in by_name.items()},
        {name: plain(output.metadata) for name, output in by_name.items()},
    )
