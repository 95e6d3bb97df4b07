"""The Alembic migrations shipped in the package create exactly the tables the models
declare, on SQLite and PostgreSQL, and go down and up again."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from reference_impls.tracking.db import (
    HEAD,
    current_revision,
    downgrade,
    head_revision,
    migrate,
    open_engine,
)
from reference_impls.tracking.schema import Base


def test_the_head_constant_names_the_newest_migration():
    assert head_revision() == HEAD


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql"])
def test_migrations_match_the_models_and_downgrade_and_upgrade(db_kind, tmp_path, request):
    url = str(tmp_path / "m.db") if db_kind == "sqlite" else request.getfixturevalue("pg_url")
    engine = open_engine(url)
    assert current_revision(engine) == HEAD
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
    downgrade(engine, "base")
    assert current_revision(engine) is None
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    migrate(engine)
    assert current_revision(engine) == HEAD
    assert {"runs", "metrics", "latest_metrics", "artifacts"} <= set(
        inspect(engine).get_table_names()
    )
    engine.dispose()
