"""The test-history tables (SQLAlchemy 2 declarative models).

Three tables, shaped by the two things history must do cheaply: append a run of thousands of
tests in one transaction, and read every outcome of every test over the last N runs.

``runs``     one row per appended report: when, the git commit and tree, the runner, the
             environment fingerprint's digest, the run's seed and verdict. ``run_key`` is a
             digest of the report's content, so importing the same report twice adds nothing.
``tests``    one row per node id: results refer to an integer, not to a long string repeated
             per run (a 2,000-test run would otherwise store ~150 KB of node ids each time).
``results``  one row per (run, test): outcome, duration, the test's own seed.
``test_summaries``  one row per test: its results, passes and failures over the whole
             history, kept by ``Store.append`` in the run's own transaction. Counts are sums,
             so they hold whatever order runs arrive in; the scores of a window are these
             counts minus those of the runs before it, or the window's own counts, whichever
             reads fewer results (``Store.scores``).

Changes to these models ship as a new Alembic revision in ``migrations/versions``.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, MetaData, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

VERSION_TABLE = "harness_history_version"
"""Alembic's record of the schema revision (not ``alembic_version``: see migrations/env.py)."""

# Named constraints: Alembic's batch mode on SQLite needs names to recreate tables.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_key: Mapped[str] = mapped_column(String(64), unique=True)
    started_at: Mapped[float] = mapped_column(Float, index=True)
    source: Mapped[str] = mapped_column(String(16))
    """``harness`` (a harness JSON report) or ``junit`` (any tool's JUnit XML)."""
    commit: Mapped[str | None] = mapped_column(String(64))
    tree: Mapped[str | None] = mapped_column(String(64))
    """The git tree of a clean checkout (None when dirty or unknown): two runs on one tree ran
    the same code, so a pass and a fail there are not explained by a change."""
    runner: Mapped[str | None] = mapped_column(String(200))
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    seed: Mapped[int | None] = mapped_column(BigInteger)
    status: Mapped[str | None] = mapped_column(String(16))
    label: Mapped[str | None] = mapped_column(String(500))
    """Where the run came from (a report's path), for the person reading the evidence."""


class Test(Base):
    __tablename__ = "tests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    nodeid: Mapped[str] = mapped_column(String(2000), unique=True)


class Result(Base):
    __tablename__ = "results"
    # On SQLite the rows are stored in primary-key order (no rowid): a window of recent runs
    # is a few contiguous ranges instead of 100,000 lookups from an index into the table.
    # The index holds every column a per-test read needs: a test's outcomes over a window
    # (the tests that failed, what un-quarantine reads) come from the index alone, without
    # one lookup into the table per outcome (revision 0002).
    __table_args__ = (
        Index("ix_results_test_outcomes", "test_id", "run_id", "outcome", "seed", "duration_s"),
        {"sqlite_with_rowid": False},
    )

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    test_id: Mapped[int] = mapped_column(ForeignKey("tests.id"), primary_key=True)
    outcome: Mapped[str] = mapped_column(String(16))
    duration_s: Mapped[float | None] = mapped_column(Float)
    seed: Mapped[int | None] = mapped_column(BigInteger)


class TestSummary(Base):
    """Per test, over every run in the history: results recorded, passes, failures (skips
    are the rest). Changed only by ``Store.append``, in the transaction that adds the run."""

    __tablename__ = "test_summaries"
    __test__ = False  # a table, not a pytest test class

    test_id: Mapped[int] = mapped_column(ForeignKey("tests.id"), primary_key=True)
    results: Mapped[int] = mapped_column(Integer)
    passes: Mapped[int] = mapped_column(Integer)
    failures: Mapped[int] = mapped_column(Integer)
