"""The source write family and its read side: reads and guards both write protocols share, the
single-source and batch writes, and the usage reader."""
