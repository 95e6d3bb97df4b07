"""Alembic migrations of the test-history schema, run by :func:`harness.history.store.migrate`
(a package so that it ships with ``harness`` without any package-data entry)."""
