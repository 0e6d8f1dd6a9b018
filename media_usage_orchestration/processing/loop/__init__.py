"""The loop kit every long step uses: the budget, the leased page loop and the work drain, the run
heartbeat, the backoff policy, and the phase marks the bench's phase clock reads."""
