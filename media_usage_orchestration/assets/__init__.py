"""Asset definitions, observations and checks: the media usage index and its coverage check,
each collection's coverage history, the media library and the projection cleanup."""
