"""The projection GC's guarded statements (EmDash's `cleanupMediaUsage`):
`ProjectionGcRepository`."""
