"""EmDash's `MediaUsageWorkRepository` (seed `media-usage-work.ts`): the repository whole in
repository.py, beside its records and input rules, its guard predicates and its statements."""
