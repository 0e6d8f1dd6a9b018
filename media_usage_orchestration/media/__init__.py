"""EmDash's media usage domain, byte-compatible and free of I/O except `fields.load_fields`:
field discovery, extraction, canonical JSON, fingerprints and source rows."""
