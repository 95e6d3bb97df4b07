"""Shards: one test run split across N runners, K of N each, by recorded test durations.

The splitting itself is pytest-split's (``--splits N --group K``, algorithm
``least_duration``: each test, longest first, goes to the shard with the least total so far).
Durations come from ``.test_durations`` in the repository root (pytest-split's JSON map of
node id -> seconds, committed); a test missing from it counts as the average of the known ones,
so a new test never breaks the split, it only balances it less well. Refresh the file with
``harness run --store-durations``, or, without running anything, from the JSON reports of a
run that already happened (a full ``make test``, CI's merged shards) with ``harness report
durations`` (:func:`durations_from_reports`; docs/harness.md, "Shards").

What a shard must record so that ``harness report merge`` can prove the shards add up to the
whole run (:mod:`harness.merge`): which shard it was (K of N), and the node ids of the whole
collection *before* the split (every shard collects the same tests and keeps its part). The
run's seed is already in the JSON report. :mod:`harness.shard_plugin` writes the collection;
:func:`annotate_report` puts both into the shard's ``report.json`` under ``"shard"``.

Nothing here imports pytest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness import atomic

__all__ = [
    "ALGORITHM",
    "DURATIONS_FILE",
    "MAX_SHARDS",
    "Shard",
    "ShardError",
    "TIMED_OUTCOMES",
    "annotate_report",
    "check_durations",
    "collection_digest",
    "durations_from_reports",
    "durations_text",
    "origin",
    "pytest_args",
    "store_durations_args",
]

DURATIONS_FILE = ".test_durations"
"""pytest-split's durations file, in the repository root (committed)."""

ALGORITHM = "least_duration"
"""pytest-split's algorithm: balances totals (its default, ``duration_based_chunks``, keeps
file order but can leave one shard with most of the time when slow tests sit together)."""

MAX_SHARDS = 256
"""The most shards a run may be split into: a GitHub Actions matrix runs at most 256 jobs
(docs/harness.md, "Shards"). pytest-split builds one list per shard before it keeps one, so an
unbounded N (``--shard 1/10000000000``) would exhaust memory instead of failing by name."""

_SPEC = re.compile(r"\s*([0-9]+)\s*/\s*([0-9]+)\s*")
"""K/N in ASCII digits only, as seeds are written (``\\d`` and int() accept any script's)."""


class ShardError(ValueError):
    """A malformed shard spec or shard record."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shard:
    """Shard ``index`` of ``total`` (1-based, as ``--shard 1/2`` and GitHub matrices count)."""

    index: int
    """Which part this runner runs, 1 <= index <= total."""
    total: int
    """How many parts the run is split into, >= 1."""

    def __post_init__(self) -> None:
        if self.total < 1:
            raise ShardError(f"the shard count must be >= 1, got {self.total}")
        if self.total > MAX_SHARDS:
            raise ShardError(
                f"the shard count must be at most {MAX_SHARDS} (a GitHub matrix runs at most "
                f"{MAX_SHARDS} jobs), got {self.total}"
            )
        if not 1 <= self.index <= self.total:
            raise ShardError(
                f"the shard index must be between 1 and {self.total}, got {self.index}"
            )

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"2/4"`` -> Shard(index=2, total=4), with an error that names the bad value."""
        match = _SPEC.fullmatch(text)
        if not match:
            raise ShardError(f"expected K/N such as 1/2 (shard K of N), got {text!r}")
        try:
            return cls(index=int(match.group(1)), total=int(match.group(2)))
        except ShardError as exc:
            raise ShardError(f"{text!r}: {exc}") from None

    def __str__(self) -> str:
        return f"{self.index}/{self.total}"


def check_durations(path: Path) -> dict[str, float] | None:
    """The durations file as pytest-split will read it, or None when there is none.

    pytest-split reads it inside pytest, where a damaged file is an INTERNALERROR traceback on
    every runner; this says what is wrong, by name, before pytest starts. A missing file is
    not an error: pytest-split then gives every test the same weight (a split by count) and
    says so. Accepted: pytest-split's JSON object of node id -> seconds, or its older list of
    ``[node id, seconds]`` pairs; seconds finite and >= 0 (NaN would make the order of the
    split arbitrary, a negative time would pull tests into one shard).
    """
    fix = f"refresh it with `harness run --store-durations --durations-path {path}`"
    if path.is_dir():
        raise ShardError(
            f"durations file {path} is a folder; {fix}, or point --durations-path at a file"
        )
    if not path.exists():
        return None

    def refuse_constant(name: str) -> float:
        raise ShardError(f"durations file {path}: {name} is not a number of seconds; {fix}")

    try:
        data = json.loads(path.read_text(), parse_constant=refuse_constant)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardError(f"durations file {path}: not valid JSON ({exc}); {fix}") from None
    if isinstance(data, list) and all(isinstance(p, list) and len(p) == 2 for p in data):
        data = dict(data)  # pytest-split's older format: [[node id, seconds], ...]
    if not isinstance(data, dict):
        raise ShardError(f"durations file {path}: not a JSON object of node id -> seconds; {fix}")
    for nodeid, seconds in data.items():
        if (
            not isinstance(seconds, int | float)
            or isinstance(seconds, bool)
            or not math.isfinite(seconds)
            or seconds < 0
        ):
            raise ShardError(
                f"durations file {path}: {nodeid!r} has {seconds!r}, not a number of seconds "
                f">= 0; {fix}"
            )
    return {str(k): float(v) for k, v in data.items()}


def pytest_args(shard: Shard, durations_path: Path, collection_path: Path) -> list[str]:
    """The pytest arguments that run ``shard`` and record the whole collection."""
    return [
        "-p",
        "harness.shard_plugin",
        f"--harness-shard-collection={collection_path}",
        f"--splits={shard.total}",
        f"--group={shard.index}",
        f"--splitting-algorithm={ALGORITHM}",
        f"--durations-path={durations_path}",
    ]


def store_durations_args(durations_path: Path) -> list[str]:
    """pytest-split's arguments to record this run's durations (merged into the file)."""
    return ["--store-durations", f"--durations-path={durations_path}"]


TIMED_OUTCOMES = ("passed", "failed", "quarantined", "xfailed", "xpassed")
"""Outcomes whose recorded time is the test's own: a skipped test's few milliseconds (or an
error's, at set-up) say nothing about how long it runs, and would pull the average that
pytest-split gives unrecorded tests down."""


def durations_from_reports(
    reports: Sequence[tuple[str, Mapping[str, Any]]], tiers: Sequence[str] | None = None
) -> dict[str, float]:
    """Node id -> seconds, from the JSON reports (``report.json``) of runs that already
    happened: a test's ``duration_s`` is set-up + call + tear-down, the same sum pytest-split's
    ``--store-durations`` records. ``reports`` are (name, parsed report) pairs, the name for
    errors; a test in several reports gets the mean of its times. Only tests of ``tiers`` are
    kept when given, and only :data:`TIMED_OUTCOMES`.

    Raises :class:`ShardError` for a report that holds no run (an aborted or skipped run's
    placeholder, no ``tests`` list) or a test record without a finite time >= 0.
    """
    wanted = set(tiers) if tiers is not None else None
    times: dict[str, list[float]] = {}
    for name, report in reports:
        tests = report.get("tests") if isinstance(report, Mapping) else None
        if not isinstance(tests, list) or report.get("status") in ("aborted", "skipped"):
            status = report.get("status") if isinstance(report, Mapping) else None
            raise ShardError(
                f"{name}: not the report of a run that ran tests (status {status!r}); give "
                "the report.json of a finished run"
            )
        for test in tests:
            if not isinstance(test, Mapping) or not isinstance(test.get("nodeid"), str):
                raise ShardError(f"{name}: a test record without a node id: {test!r}")
            if test.get("outcome") not in TIMED_OUTCOMES:
                continue
            if wanted is not None and test.get("tier") not in wanted:
                continue
            seconds = test.get("duration_s")
            if (
                not isinstance(seconds, int | float)
                or isinstance(seconds, bool)
                or not math.isfinite(seconds)
                or seconds < 0
            ):
                raise ShardError(
                    f"{name}: {test['nodeid']!r} has duration_s {seconds!r}, not a number of "
                    "seconds >= 0"
                )
            times.setdefault(test["nodeid"], []).append(float(seconds))
    return {nodeid: sum(values) / len(values) for nodeid, values in times.items()}


def durations_text(durations: Mapping[str, float]) -> str:
    """The durations file's text: sorted keys, one per line, milliseconds (as committed; a
    refresh then changes only the lines whose times moved)."""
    rounded = {nodeid: round(seconds, 3) for nodeid, seconds in durations.items()}
    return json.dumps(rounded, sort_keys=True, indent=1) + "\n"


def collection_digest(nodeids: Sequence[str]) -> str:
    """A digest of the collection that does not depend on order (shards compare it)."""
    return hashlib.sha256("\n".join(sorted(nodeids)).encode()).hexdigest()


def origin(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """Which CI run and attempt produced a shard: GitHub's ``GITHUB_RUN_ID`` and
    ``GITHUB_RUN_ATTEMPT``, None where unset (a local run).

    Re-running a failed shard job on GitHub gives it the same seed and collection, so without
    this its green re-run would merge as if it had passed the first time; the merge compares
    these (:mod:`harness.merge`, docs/harness.md "Re-run shards").
    """
    env = os.environ if environ is None else environ
    return {
        "run_id": env.get("GITHUB_RUN_ID") or None,
        "run_attempt": env.get("GITHUB_RUN_ATTEMPT") or None,
    }


def annotate_report(report_path: Path, shard: Shard, collection_path: Path) -> dict[str, Any]:
    """Add ``"shard"`` (K, N, the whole collection and its digest, and the CI run and attempt
    it came from, :func:`origin`) to a shard's report.json.

    A collection file that is missing (pytest stopped before collecting) leaves
    ``collected`` as None: the merge then reports the shard as incomplete rather than guess.
    """
    report: dict[str, Any] = json.loads(report_path.read_text())
    collected: list[str] | None = None
    if collection_path.is_file():
        collected = json.loads(collection_path.read_text())["collected"]
    report["shard"] = {
        "index": shard.index,
        "total": shard.total,
        "algorithm": ALGORITHM,
        "collected": collected,
        "digest": collection_digest(collected) if collected is not None else None,
        "origin": origin(),
    }
    atomic.write_text(report_path, json.dumps(report, indent=2, default=str) + "\n")
    return report
