"""The projection GC: one pass (EmDash's `cleanupMediaUsage`), passes back to back while full."""
