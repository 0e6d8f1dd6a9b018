"""What operators read and do by hand: coverage, listings and retries; where a media item is used
and which media nothing uses."""
