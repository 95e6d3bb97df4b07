"""initial schema: projects, runs, typed params, metric series, tags, artifacts, upload intents,
lineage edges, users, tokens and memberships (see schema.py for why each looks as it does).

Revision ID: 0001
Revises:
Create Date: 2026-12-01 15:29:24.790343
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
        "lineage_edges",
        sa.Column("src", sa.String(length=300), nullable=False),
        sa.Column("dst", sa.String(length=300), nullable=False),
        sa.Column("relation", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("src", "dst", name=op.f("pk_lineage_edges")),
    )
    with op.batch_alter_table("lineage_edges", schema=None) as batch_op:
        batch_op.create_index("ix_lineage_dst", ["dst", "src"], unique=False)

    op.create_table(
        "projects",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_projects")),
        sa.UniqueConstraint("name", name=op.f("uq_projects_name")),
    )
    op.create_table(
        "uploads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_uploads")),
    )
    with op.batch_alter_table("uploads", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_uploads_sha256"), ["sha256"], unique=False)

    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("name", name=op.f("uq_users_name")),
    )
    op.create_table(
        "memberships",
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_memberships_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_memberships_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("user_id", "project_id", name=op.f("pk_memberships")),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("git_commit", sa.String(length=64), nullable=True),
        sa.Column("environment", sa.Text(), nullable=True),
        sa.Column("deleted_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name=op.f("fk_runs_project_id_projects")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_project_created", ["project_id", "created_at"], unique=False)
        batch_op.create_index("ix_runs_project_status", ["project_id", "status"], unique=False)

    op.create_table(
        "tokens",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_tokens_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_tokens")),
    )
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=500), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("promoted", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("deleted_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_artifacts_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifacts")),
        sa.UniqueConstraint("run_id", "name", name="uq_artifacts_run_name"),
    )
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.create_index("ix_artifacts_sha256", ["sha256"], unique=False)

    op.create_table(
        "latest_metrics",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_latest_metrics_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "key", name=op.f("pk_latest_metrics")),
    )
    with op.batch_alter_table("latest_metrics", schema=None) as batch_op:
        batch_op.create_index(
            "ix_latest_metrics_key_value", ["key", "value", "run_id"], unique=False
        )

    op.create_table(
        "metrics",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_metrics_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "key", "step", name=op.f("pk_metrics")),
    )
    op.create_table(
        "params",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("num_value", sa.Float(), nullable=True),
        sa.Column("str_value", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_params_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "key", name=op.f("pk_params")),
    )
    with op.batch_alter_table("params", schema=None) as batch_op:
        batch_op.create_index("ix_params_key_num", ["key", "num_value", "run_id"], unique=False)
        batch_op.create_index("ix_params_key_str", ["key", "str_value", "run_id"], unique=False)

    op.create_table(
        "tags",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_tags_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "key", name=op.f("pk_tags")),
    )
    with op.batch_alter_table("tags", schema=None) as batch_op:
        batch_op.create_index("ix_tags_key_value", ["key", "value", "run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tags", schema=None) as batch_op:
        batch_op.drop_index("ix_tags_key_value")

    op.drop_table("tags")
    with op.batch_alter_table("params", schema=None) as batch_op:
        batch_op.drop_index("ix_params_key_str")
        batch_op.drop_index("ix_params_key_num")

    op.drop_table("params")
    op.drop_table("metrics")
    with op.batch_alter_table("latest_metrics", schema=None) as batch_op:
        batch_op.drop_index("ix_latest_metrics_key_value")

    op.drop_table("latest_metrics")
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.drop_index("ix_artifacts_sha256")

    op.drop_table("artifacts")
    op.drop_table("tokens")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_project_status")
        batch_op.drop_index("ix_runs_project_created")

    op.drop_table("runs")
    op.drop_table("memberships")
    op.drop_table("users")
    with op.batch_alter_table("uploads", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_uploads_sha256"))

    op.drop_table("uploads")
    op.drop_table("projects")
    with op.batch_alter_table("lineage_edges", schema=None) as batch_op:
        batch_op.drop_index("ix_lineage_dst")

    op.drop_table("lineage_edges")
