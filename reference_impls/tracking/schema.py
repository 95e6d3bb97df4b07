"""The metadata schema (SQLAlchemy 2 declarative tables), SQLite and PostgreSQL alike.

Tables and why they look the way they do:

``projects``        one row per project; runs, roles and searches are scoped to one.
``runs``            status, times (UNIX seconds, float: sortable and comparable on both
                    databases without time-zone surprises), git commit, environment
                    fingerprint (JSON text), soft-delete time.
``params``          typed: a number is stored in ``num_value`` (so ``params.lr > 1e-3`` is a
                    numeric comparison served by the ``(key, num_value)`` index), text in
                    ``str_value``, a boolean as 0/1 in ``num_value`` with kind ``bool``.
``metrics``         the time series, one row per (run, key, step); batches are upserts, so a
                    re-sent batch never stores a point twice.
``latest_metrics``  the last step's value of each (run, key), kept by the same transaction that
                    writes the batch: searches compare and order by it through ``(key, value)``.
``tags``            string key/value per run, indexed by ``(key, value)``.
``artifacts``       references to content-addressed bytes (sha256, size, URI of the store) by
                    run and name; ``kind`` (checkpoint, model, dataset, file, report...),
                    ``promoted`` (retention keeps it), soft-delete time.
``uploads``         upload intents: written before bytes are uploaded and removed when the
                    reference commits, so that collection never deletes bytes an upload in
                    flight is about to reference (and a crashed upload's bytes are collected
                    once its intent is older than the grace period).
``lineage_edges``   directed edges between nodes named ``kind:id`` (``run:<id>``,
                    ``artifact:<sha256>``, ``dataset:<name>@<version>``, ``code:<commit>``);
                    an edge points from what was consumed or produced first to what came next.
``users``/``tokens``/``memberships``  access control: tokens are stored as sha256 hashes;
                    a membership gives one user one role in one project.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "Artifact",
    "Base",
    "LatestMetric",
    "LineageEdge",
    "Membership",
    "Metric",
    "Param",
    "Project",
    "Run",
    "Tag",
    "Token",
    "Upload",
    "User",
]

# Constraint names fixed by convention: Alembic migrations and both databases agree on them.
_NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=_NAMING)


class Project(Base):
    __tablename__ = "projects"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[float] = mapped_column(Float)


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # uuid4 hex
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    git_commit: Mapped[str | None] = mapped_column(String(64), nullable=True)
    environment: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    __table_args__ = (
        Index("ix_runs_project_created", "project_id", "created_at"),
        Index("ix_runs_project_status", "project_id", "status"),
    )


class Param(Base):
    __tablename__ = "params"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))  # num | str | bool
    num_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    str_value: Mapped[str | None] = mapped_column(Text, nullable=True)
    __table_args__ = (
        Index("ix_params_key_num", "key", "num_value", "run_id"),
        Index("ix_params_key_str", "key", "str_value", "run_id"),
    )


class Metric(Base):
    __tablename__ = "metrics"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    value: Mapped[float] = mapped_column(Float)


class LatestMetric(Base):
    __tablename__ = "latest_metrics"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    step: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)
    __table_args__ = (Index("ix_latest_metrics_key_value", "key", "value", "run_id"),)


class Tag(Base):
    __tablename__ = "tags"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(250), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    __table_args__ = (Index("ix_tags_key_value", "key", "value", "run_id"),)


class Artifact(Base):
    __tablename__ = "artifacts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(500))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    uri: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(32))
    promoted: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float)
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    __table_args__ = (
        UniqueConstraint("run_id", "name", name="uq_artifacts_run_name"),
        Index("ix_artifacts_sha256", "sha256"),
    )


class Upload(Base):
    __tablename__ = "uploads"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    started_at: Mapped[float] = mapped_column(Float)


class LineageEdge(Base):
    __tablename__ = "lineage_edges"
    src: Mapped[str] = mapped_column(String(300), primary_key=True)
    dst: Mapped[str] = mapped_column(String(300), primary_key=True)
    relation: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[float] = mapped_column(Float)
    __table_args__ = (Index("ix_lineage_dst", "dst", "src"),)


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float)


class Token(Base):
    __tablename__ = "tokens"
    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    created_at: Mapped[float] = mapped_column(Float)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class Membership(Base):
    __tablename__ = "memberships"
    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )
    project_id: Mapped[int] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True
    )
    role: Mapped[str] = mapped_column(String(16))
