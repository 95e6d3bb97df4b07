"""Alembic environment for the test-history store: run by :func:`harness.history.store.migrate`
with an open connection in ``config.attributes["connection"]`` (no alembic.ini needed)."""

from __future__ import annotations

from alembic import context

from harness.history.schema import VERSION_TABLE, Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "the history migrations run through harness.history.store.migrate(), which passes an "
        "open connection; any `harness history` command opens (and upgrades) the database"
    )
# SQLite cannot ALTER most things in place: batch mode recreates tables when needed.
# A version table of its own: a team's PostgreSQL database may already hold another Alembic
# project's alembic_version (the tracking store's, say), and the two must not collide.
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
