"""The store's infrastructure: engines for both dialects, database time, EmDash's schema and
its installer, the capture triggers, JSON-bound rows, and the lease and guard predicates the
repositories compose."""
