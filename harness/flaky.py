"""The flake hunter: rerun one test in fresh processes and say *why* it flakes.

Retrying a flaky test until it passes hides the bug; this module does the opposite. It runs
the test ``runs`` times under one base seed and ``runs`` times under new seeds, each in a
fresh ``python -m pytest`` process, and classifies it:

=====================  ==========================================================  ====
verdict                meaning                                                     exit
=====================  ==========================================================  ====
stable                 passed every run: no flake found in 2 x runs                 0
deterministic failure  failed every run, whatever the seed: a plain bug             1
seed-dependent         same seed, same outcome; some seeds fail (listed, and each   3
                       failing seed confirmed by one more run): a numerical edge
                       case the seeds reach
nondeterministic       different outcomes under the *same* seed: unseeded           4
                       randomness, timing, threads, uninitialised memory
could not run          not collected, skipped, or a collection/usage error          5
=====================  ==========================================================  ====

(Exit 2 is left to usage errors of the command line.) Quarantined tests are hunted as they
are: a quarantined failure counts as a failure.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness import seeding

__all__ = ["EXIT_CODES", "Hunt", "RunResult", "Verdict", "classify", "hunt", "run_once"]


class Verdict(enum.StrEnum):
    """What the hunt concluded (the table above); written to flaky.json as its value."""

    STABLE = "stable"
    DETERMINISTIC_FAILURE = "deterministic failure"
    SEED_DEPENDENT = "seed-dependent"
    NONDETERMINISTIC = "nondeterministic"
    COULD_NOT_RUN = "could not run"


EXIT_CODES = {
    Verdict.STABLE: 0,
    Verdict.DETERMINISTIC_FAILURE: 1,
    Verdict.SEED_DEPENDENT: 3,
    Verdict.NONDETERMINISTIC: 4,
    Verdict.COULD_NOT_RUN: 5,
}

_FAIL = ("failed", "error", "quarantined", "timeout")


@dataclasses.dataclass(frozen=True)
class RunResult:
    seed: int
    outcome: str  # passed | failed | error | quarantined | skipped | timeout | not run
    message: str = ""

    @property
    def failed(self) -> bool:
        return self.outcome in _FAIL


@dataclasses.dataclass
class Hunt:
    test: str
    base_seed: int
    same_seed: list[RunResult]
    new_seeds: list[RunResult]
    confirmations: list[RunResult]
    verdict: Verdict = Verdict.COULD_NOT_RUN
    detail: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def failing_seeds(self) -> list[int]:
        return sorted({r.seed for r in self.same_seed + self.new_seeds if r.failed})

    def to_dict(self) -> dict[str, Any]:
        return {
            "test": self.test,
            "verdict": str(self.verdict),
            "exit_code": self.exit_code,
            "detail": self.detail,
            "base_seed": self.base_seed,
            "failing_seeds": self.failing_seeds,
            "runs": [
                {"phase": phase, **dataclasses.asdict(r)}
                for phase, rs in (
                    ("same-seed", self.same_seed),
                    ("new-seed", self.new_seeds),
                    ("confirm", self.confirmations),
                )
                for r in rs
            ],
        }


def run_once(
    test: str,
    seed: int,
    *,
    cwd: Path | None = None,
    python: str = sys.executable,
    timeout_s: float = 600.0,
    extra_args: Sequence[str] = (),
) -> RunResult:
    """Run one test in a fresh pytest process under ``--harness-seed=seed``.

    ``test`` must not start with '-' (``ValueError``): it is handed to pytest after ``--``,
    but the argparse of Python < 3.12.8, which pytest's intermixed parsing uses, ignores
    ``--`` there, so an id such as ``--junitxml=../x`` would still be read as an option.
    """
    if test.startswith("-"):
        raise ValueError(
            f"test {test!r} starts with '-', which pytest would read as an option; "
            "give a node id such as 'suites/unit/test_x.py::test_y'"
        )
    with tempfile.TemporaryDirectory(prefix="harness-flaky-") as tmp:
        report_path = Path(tmp) / "report.json"
        cmd = [
            python,
            "-m",
            "pytest",
            f"--harness-seed={seed}",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--harness-json={report_path}",
            "--harness-no-fingerprint",
            *extra_args,
            # After "--" an id (from quarantine.toml, say) is a path, never an option such as
            # --junitxml=... (with the leading-'-' check above for older Pythons' argparse).
            "--",
            test,
        ]
        try:
            proc = subprocess.run(
                cmd,
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            )
        except subprocess.TimeoutExpired:
            return RunResult(seed, "timeout", f"no result within {timeout_s:g} s")
        if not report_path.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return RunResult(seed, "not run", f"pytest exit {proc.returncode}: {' | '.join(tail)}")
        tests = json.loads(report_path.read_text()).get("tests", [])
        matching = [t for t in tests if t["nodeid"] == test] or tests
        if len(matching) != 1:
            ids = ", ".join(t["nodeid"] for t in tests) or "nothing"
            return RunResult(seed, "not run", f"expected one test, pytest ran {ids}")
        t = matching[0]
        return RunResult(seed, t["outcome"], t.get("message") or "")


def classify(
    same_seed: Sequence[RunResult],
    new_seeds: Sequence[RunResult],
    confirmations: Sequence[RunResult],
) -> tuple[Verdict, str]:
    """(verdict, one-line detail) from the three groups of runs."""
    everything = [*same_seed, *new_seeds, *confirmations]
    unrunnable = [r for r in everything if r.outcome in ("not run", "skipped")]
    if unrunnable:
        r = unrunnable[0]
        return Verdict.COULD_NOT_RUN, f"{r.outcome}: {r.message}"
    same_fail = [r.failed for r in same_seed]
    if any(same_fail) and not all(same_fail):
        return Verdict.NONDETERMINISTIC, (
            f"{sum(same_fail)} of {len(same_fail)} runs under the same seed "
            f"{same_seed[0].seed} failed"
        )
    by_seed: dict[int, set[bool]] = {}
    for r in everything:
        by_seed.setdefault(r.seed, set()).add(r.failed)
    flipping = sorted(seed for seed, outcomes in by_seed.items() if len(outcomes) > 1)
    if flipping:
        return Verdict.NONDETERMINISTIC, f"seed(s) {flipping} both passed and failed"
    failing = sorted(seed for seed, outcomes in by_seed.items() if True in outcomes)
    if not failing:
        return Verdict.STABLE, f"passed all {len(everything)} runs"
    if len(failing) == len(by_seed):
        first = next(r for r in everything if r.failed)
        return (
            Verdict.DETERMINISTIC_FAILURE,
            f"failed under all {len(by_seed)} seeds: {first.message}",
        )
    return Verdict.SEED_DEPENDENT, (
        f"{len(failing)} of {len(by_seed)} seeds fail, each reproducibly: {failing}"
    )


def hunt(
    test: str,
    *,
    runs: int = 10,
    base_seed: int | None = None,
    cwd: Path | None = None,
    python: str = sys.executable,
    timeout_s: float = 600.0,
    new_seeds: Sequence[int] | None = None,
    progress: Callable[[str, RunResult], None] | None = None,
    runner: Callable[..., RunResult] = run_once,
) -> Hunt:
    """Rerun ``test`` ``runs`` times under one seed and ``runs`` times under new seeds (random
    ones unless ``new_seeds`` names them), confirm each failing new seed once more, and
    classify the outcomes."""
    if runs < 2:
        raise ValueError(f"runs must be >= 2 to tell a flake from a failure, got {runs}")
    base = seeding.new_base_seed() if base_seed is None else base_seed

    def go(phase: str, seed: int) -> RunResult:
        result = runner(test, seed, cwd=cwd, python=python, timeout_s=timeout_s)
        if progress:
            progress(phase, result)
        return result

    same = [go("same-seed", base) for _ in range(runs)]
    seeds: list[int] = list(new_seeds or [])
    while len(seeds) < runs:  # distinct, and different from the base seed
        s = seeding.new_base_seed()
        if s != base and s not in seeds:
            seeds.append(s)
    new = [go("new-seed", s) for s in seeds]
    confirm = [go("confirm", r.seed) for r in new if r.failed]
    verdict, detail = classify(same, new, confirm)
    return Hunt(test, base, same, new, confirm, verdict, detail)
