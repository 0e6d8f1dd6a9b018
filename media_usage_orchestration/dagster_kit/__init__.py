"""The Dagster vocabulary the wiring shares, under ops/, sensors/, assets/, resources/ and
schedules.py and importing none of them: run tags, outcomes, the transient-only retries, the
default statuses, the shape of a leased step, the claim IO manager, progress lines, and the one
module that wraps Dagster's internals."""
