"""per-test summaries kept at append time, and a covering index for per-test reads (see
harness/history/schema.py): `harness history flaky` over 1,000 runs x 2,000 tests read every
outcome (7 s); it now reads counts, and outcomes only for the tests that need them.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

FAIL = "('error', 'failed', 'quarantined')"
PASS = "('passed', 'xfailed', 'xpassed')"
# harness.history.records.FAIL_OUTCOMES and PASS_OUTCOMES as they were at this revision (a
# migration must not change meaning when those change later); a test checks they agree.


def upgrade() -> None:
    op.create_table(
        "test_summaries",
        sa.Column("test_id", sa.Integer(), nullable=False),
        sa.Column("results", sa.Integer(), nullable=False),
        sa.Column("passes", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["test_id"], ["tests.id"], name=op.f("fk_test_summaries_test_id_tests")
        ),
        sa.PrimaryKeyConstraint("test_id", name=op.f("pk_test_summaries")),
    )
    # The summaries of the runs already there, in the same transaction as the table.
    op.execute(
        "INSERT INTO test_summaries (test_id, results, passes, failures) "
        f"SELECT test_id, count(*), sum(CASE WHEN outcome IN {PASS} THEN 1 ELSE 0 END), "
        f"sum(CASE WHEN outcome IN {FAIL} THEN 1 ELSE 0 END) FROM results GROUP BY test_id"
    )
    op.drop_index("ix_results_test_run", table_name="results")
    op.create_index(
        "ix_results_test_outcomes",
        "results",
        ["test_id", "run_id", "outcome", "seed", "duration_s"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_results_test_outcomes", table_name="results")
    op.create_index("ix_results_test_run", "results", ["test_id", "run_id"], unique=False)
    op.drop_table("test_summaries")
