"""A stand-in for EmDash itself, for the demo, the benchmark and the tests: a CMS writer that
changes the database as EmDash's registry and content repository do, deterministic sample content,
EmDash's media library (its `media` table and uploads), rows backdated for the demo, scratch
PostgreSQL schemas, a statement counter and a generated work backlog. Nothing the jobs run
imports it."""
