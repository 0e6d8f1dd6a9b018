"""The Dagster tier: ops, jobs, sensors, the schedule, assets and checks, definitions, one real
daemon tick, the deployed instance and the webserver, on both dialects."""
