"""Helpers shared by every tier: test databases (the dialect matrix, the SQLite template and
the PostgreSQL schema pool), database states built directly and rows backdated instead of
sleeping, row factories, and the Dagster, CLI, demo and browser harnesses."""
