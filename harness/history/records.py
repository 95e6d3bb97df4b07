"""What one appended run holds, independent of where it came from and of the database.

``ingest`` builds these from a harness JSON report or a JUnit XML file; ``store`` writes and
reads them; ``scores`` judges them. Nothing here imports SQLAlchemy, so scoring and reading
reports cost no database import.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import NamedTuple

__all__ = [
    "FAIL_OUTCOMES",
    "PASS_OUTCOMES",
    "HistoryError",
    "Observation",
    "Outcome",
    "RunRecord",
    "TestResult",
]


class HistoryError(ValueError):
    """Bad input to the history (a malformed report, an unknown database URL, a bad window):
    the message names the value and the fix; the CLI turns it into exit status 2."""


FAIL_OUTCOMES = frozenset({"failed", "error", "quarantined"})
"""Outcomes that count as a failure. ``quarantined`` is a quarantined test that failed: the
quarantine keeps it from failing the gate, not from counting against the test."""
PASS_OUTCOMES = frozenset({"passed", "xfailed", "xpassed"})
"""Outcomes that count as a pass (an expected failure did what it was expected to do; a
non-strict xpass is not a failure of the test). Anything else (skipped) is no evidence."""


@dataclasses.dataclass(frozen=True)
class TestResult:
    """One test's result in one run."""

    __test__ = False  # a data class, not a pytest test class
    nodeid: str
    outcome: str
    duration_s: float | None = None
    seed: int | None = None


@dataclasses.dataclass
class RunRecord:
    run_key: str
    started_at: float
    source: str
    results: list[TestResult]
    commit: str | None = None
    tree: str | None = None
    runner: str | None = None
    fingerprint: str | None = None
    seed: int | None = None
    status: str | None = None
    label: str | None = None


class Outcome(enum.StrEnum):
    """One test's outcome in one run, as the scores see it.

    PASS and FAIL are evidence; SKIP (skipped, or an outcome the history does not know) is not:
    a skipped run neither breaks a pass streak nor counts as a run of the test.
    """

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"

    @classmethod
    def of(cls, outcome: str) -> Outcome:
        # One dict lookup: a window of 1,000 runs of a failing test asks this 1,000 times.
        return _OUTCOME_OF.get(outcome, cls.SKIP)


_OUTCOME_OF = {
    **dict.fromkeys(FAIL_OUTCOMES, Outcome.FAIL),
    **dict.fromkeys(PASS_OUTCOMES, Outcome.PASS),
}


class Observation(NamedTuple):
    """One test in one run, with what the scores need of the run (a named tuple: a window
    holds ~100,000 of them, and a tuple is built several times faster than a data class)."""

    run_id: int
    started_at: float
    outcome: str
    seed: int | None = None
    tree: str | None = None
    commit: str | None = None
    runner: str | None = None
    duration_s: float | None = None
    run_seed: int | None = None
    """The run's base seed: ``--harness-seed`` of the command that replays this run."""

    @property
    def verdict(self) -> Outcome:
        return Outcome.of(self.outcome)
