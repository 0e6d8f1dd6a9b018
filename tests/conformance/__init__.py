"""The conformance tier: the store's repositories (one file per repository, named after it)
and the state machines above them, on SQLite and on PostgreSQL, against the seeds and the spec."""
