"""The bench's own SQL, outside the store: the floor mode's bulk statements and the soak's reads of
the Dagster instance's database."""
