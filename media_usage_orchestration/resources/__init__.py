"""Dagster resources: the database (URL to Engine) and the automation knobs."""
