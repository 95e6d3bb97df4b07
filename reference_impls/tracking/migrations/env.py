"""Alembic environment for the tracking store: run by :func:`reference_impls.tracking.db.migrate`
with an open connection in ``config.attributes["connection"]`` (no alembic.ini needed)."""

from __future__ import annotations

from alembic import context

from reference_impls.tracking.schema import Base

target_metadata = Base.metadata
connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "the tracking migrations run through reference_impls.tracking.db.migrate(), which "
        "passes an open connection; run `python -m reference_impls.tracking migrate --db URL`"
    )
# SQLite cannot ALTER most things in place: batch mode recreates tables when needed.
context.configure(
    connection=connection,
    target_metadata=target_metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
