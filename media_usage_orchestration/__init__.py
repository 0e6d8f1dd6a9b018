"""Keeps an EmDash CMS database's media usage index true and deletes collections safely, as
lease-guarded Dagster jobs. docs/architecture.md maps every module."""
