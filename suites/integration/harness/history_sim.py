"""Synthetic test histories with known behaviour, for the history simulation tests.

Each simulated run is one CI run of a whole suite: every test has an outcome, a seed (the
harness's per-test seed from the run's base seed), a runner and a commit. The oracle is the
kind each test was made with. Runs rotate a pool of ten base seeds (a nightly job cycling
seeds, or replays of failing seeds): without seeds that come back, no history could tell a
seed-dependent failure from a flake. Three runners take turns; a commit lands every three
runs, so consecutive runs share a git tree as reruns of one commit do.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

from harness.history.records import RunRecord, TestResult
from harness.seeding import node_seed

SEED_POOL = tuple(1000 + 7 * i for i in range(10))
RUNNERS = ("cpu-1", "cpu-2", "gpu-1")
RUNS_PER_COMMIT = 3

# outcome(run_index, base_seed, runner, rng) -> failed?
Behaviour = Callable[[int, int, str, random.Random], bool]


@dataclasses.dataclass(frozen=True)
class Kind:
    name: str
    truth: str
    """What the test is: broken, flaky, seed-dependent, healthy or fixed."""
    behaviour: Behaviour
    p: float | None = None


def stable() -> Kind:
    return Kind("stable", "healthy", lambda r, s, w, rng: False)


def broken_at(commit: int) -> Kind:
    """Passes until the ``commit``-th commit, fails on every run from then on."""
    return Kind(
        f"broken-at-{commit}", "broken", lambda r, s, w, rng: r // RUNS_PER_COMMIT >= commit
    )


def flaky(p: float) -> Kind:
    return Kind(f"flaky-{p}", "flaky", lambda r, s, w, rng: rng.random() < p, p)


def seed_dependent(bad_seed: int) -> Kind:
    return Kind(f"seed-{bad_seed}", "seed-dependent", lambda r, s, w, rng: s == bad_seed)


def flaky_on(runner: str, p: float) -> Kind:
    return Kind(
        f"flaky-on-{runner}", "flaky", lambda r, s, w, rng: w == runner and rng.random() < p, p
    )


def fixed_at(commit: int, p_before: float = 1.0) -> Kind:
    """Fails (always, or at rate p_before) until the ``commit``-th commit, passes from then on."""
    return Kind(
        f"fixed-at-{commit}",
        "fixed",
        lambda r, s, w, rng: r // RUNS_PER_COMMIT < commit and rng.random() < p_before,
        p_before,
    )


def simulate(
    tests: dict[str, Kind], runs: int, seed: int, *, start: float = 1.7e9
) -> list[RunRecord]:
    """``runs`` runs of all ``tests``, reproducible from ``seed``."""
    rng = random.Random(seed)
    out = []
    for r in range(runs):
        base = rng.choice(SEED_POOL)
        runner = RUNNERS[r % len(RUNNERS)]
        commit = f"{r // RUNS_PER_COMMIT:040x}"
        results = [
            TestResult(
                nodeid,
                "failed" if kind.behaviour(r, base, runner, rng) else "passed",
                0.01,
                node_seed(base, nodeid),
            )
            for nodeid, kind in tests.items()
        ]
        out.append(
            RunRecord(
                run_key=f"sim-{seed}-{r}",
                started_at=start + 60.0 * r,
                source="harness",
                results=results,
                commit=commit,
                tree="t" + commit[1:],
                runner=runner,
                seed=base,
                status="passed",
            )
        )
    return out
