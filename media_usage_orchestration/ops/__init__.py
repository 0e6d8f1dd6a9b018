"""Ops, one module per workflow (work, reconciliation, deletion, projection_gc) and per maintenance
or operator path (activation, maintenance, operator retries, instance pruning); every op of the
reconciliation and deletion graphs is one lease-guarded step, declared once (leased_op.py)."""
