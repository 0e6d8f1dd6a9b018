"""The store's floor, importing no other room: engines for both dialects, database time, EmDash's
schema and its installer, the capture triggers and the cleanup fence, JSON-bound rows and text
lists, and the lease and guard predicates the repositories compose."""
