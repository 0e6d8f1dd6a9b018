"""EmDash's media usage domain, byte-compatible and free of I/O: field discovery, extraction,
canonical JSON, fingerprints, source rows and snapshots built from rows already read, and
projection admission."""
