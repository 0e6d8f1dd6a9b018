"""`media-usage bench` and `make bench`: throughput, phases, statements, peak RSS, scale-out."""

from .command import bench

__all__ = ["bench"]
