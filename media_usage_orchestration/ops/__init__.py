"""Ops: one module per workflow, each op one lease-guarded step."""
