"""The acceptance tier: races and faults across processes, end to end runs (EmDash's own
fixture among them), the `media-usage` command, the demo, the benchmark's smoke and the
browser."""
