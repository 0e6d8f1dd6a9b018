"""Collection reconciliation (spec 6.3): the coordinator's guarded transitions, the op graph's
steps and the walks over them, EmDash's one-step tick, maintenance of every coordinator, and a
whole reconciliation in one call.

Import from the module that owns what you need:

- `model`: limits, error codes, outcomes and step results;
- `machine`: the coordinator's guarded transitions, shared by the two drivers below;
- `steps`: one guarded step per op of the graph, plus renew, release, reload and
  `record_step_failure`;
- `walks`: the paging loops over those steps (scan, drain, sources), for the ops and `driver`;
- `tick`: EmDash's one-step tick (`process_due_reconciliation`);
- `maintenance`: `settle_reconciliations`, the tick's maintenance half for every coordinator;
- `driver`: `run_to_completion`, the graph's steps in one call.
"""
