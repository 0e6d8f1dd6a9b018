"""The project's own run leases (`_muo_run_leases`): a run is alive while its lease is."""
