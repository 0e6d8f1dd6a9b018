"""EmDash's `MediaUsageReconciliationRepository` (seed `reconciliation.ts`): the repository whole
in repository.py, beside its records and input rules, its named guard predicates and its
statements."""
