"""All SQL. The three repositories mirroring EmDash's seed files stand whole at the top (work,
reconciliations, deletions) beside the other repositories; `core/` holds the engine, database
time, the schema and its triggers and the guard vocabulary; `sources/` the source write family."""
