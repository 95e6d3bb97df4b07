"""initial schema: runs, tests, results (see harness/history/schema.py for why each looks as
it does).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_key", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("commit", sa.String(length=64), nullable=True),
        sa.Column("tree", sa.String(length=64), nullable=True),
        sa.Column("runner", sa.String(length=200), nullable=True),
        sa.Column("fingerprint", sa.String(length=64), nullable=True),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=True),
        sa.Column("label", sa.String(length=500), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("run_key", name=op.f("uq_runs_run_key")),
    )
    op.create_index(op.f("ix_runs_started_at"), "runs", ["started_at"], unique=False)
    op.create_table(
        "tests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("nodeid", sa.String(length=2000), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tests")),
        sa.UniqueConstraint("nodeid", name=op.f("uq_tests_nodeid")),
    )
    op.create_table(
        "results",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("test_id", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_results_run_id_runs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["test_id"], ["tests.id"], name=op.f("fk_results_test_id_tests")),
        sa.PrimaryKeyConstraint("run_id", "test_id", name=op.f("pk_results")),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_results_test_run", "results", ["test_id", "run_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_results_test_run", table_name="results")
    op.drop_table("results")
    op.drop_table("tests")
    op.drop_index(op.f("ix_runs_started_at"), table_name="runs")
    op.drop_table("runs")
