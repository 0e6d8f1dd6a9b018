"""The state machines, free of Dagster: step functions take an Engine and return outcomes."""
