"""All SQL, in rooms by workflow: each seed mirror (work, reconciliation, deletion) a room whose
repository.py keeps EmDash's class whole beside its records, guards and statements; the
projection GC's statements; the source write family and the usage reader (sources); EmDash's
host rows the workflows read (host); bounded reads (reads); the project's run leases (runs); and
core, the floor every room builds on."""
