"""The state machines, free of Dagster, in rooms by workflow: step functions take an Engine and
return outcomes."""
