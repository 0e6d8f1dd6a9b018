"""`media-usage bench` and `make bench`: throughput, phases, statements, peak RSS, scale-out."""

from media_usage_orchestration.bench.command import bench

__all__ = ["bench"]
