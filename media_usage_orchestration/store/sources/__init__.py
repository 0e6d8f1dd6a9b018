"""The source write family: reads and guards both write protocols share, the single-source and
batch writes, the cleanup fence, projection GC and the usage reader."""
