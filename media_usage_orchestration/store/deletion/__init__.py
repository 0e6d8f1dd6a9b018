"""EmDash's `MediaUsageCollectionDeletionRepository` (seed `collection-deletion.ts`): the
repository whole in repository.py, beside its records, guard predicates and statements, and
EmDash's local deletion guard (local_guard.py)."""
