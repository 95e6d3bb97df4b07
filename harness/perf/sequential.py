"""Sequential sampling: take interleaved A/B pairs until the verdict is decided or the budget ends.

Why: a fixed number of pairs is too many for a clear case and too few for a noisy one. Like
Chromium's Pinpoint, the gate looks at the pairs taken so far, and when the verdict is still
undecided (decision.py) it takes more: ``first`` pairs, then 1.5 times as many at each look,
up to ``max_pairs`` or until ``budget_s`` seconds have passed. Looks are few (at most
MAX_LOOKS) because every look is one more chance for noise to cross the line: with at most
7 looks at a one-sided 0.001 each, the chance that identical code ever reads "significantly
slower" stays below 1% (Bonferroni).

Pair i belongs to block i // AB_BLOCK; the sampler starts a fresh pair of worker processes at
every block's first pair. The sampler and the clock are arguments, so that tests drive this
loop with synthetic pairs and a fake clock (ab.py passes the workers' sampler and time.monotonic).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

from harness.perf import stats
from harness.perf._common import PerfError
from harness.perf.decision import Comparison, Verdict, compare_blocks

# Consecutive A/B pairs per block; each block is measured by a fresh pair of worker processes
# (ab.py) and is one value of decision.compare_blocks' signed-rank interval, which needs at
# least 10 blocks to reach ALPHA. 5 pairs: the block's median shrugs off two spikes.
AB_BLOCK = 5
# The fewest blocks that can decide anything at ALPHA (signed-rank: 2^-10 < 0.001 < 2^-9).
MIN_BLOCKS = 10
# Each look takes this many times the pairs of the one before.
GROWTH = 1.5
MAX_LOOKS = 7


@dataclasses.dataclass(frozen=True)
class SamplingPlan:
    """How many A/B pairs to take: ``first`` before the first look, at most ``max_pairs``, and
    no new pair once ``budget_s`` seconds (per benchmark) have passed."""

    first: int = 60
    max_pairs: int = 600
    budget_s: float = 120.0

    def __post_init__(self) -> None:
        if self.first < 1 or self.max_pairs < self.first:
            raise PerfError(
                f"A/B pairs: need 1 <= first ({self.first}) <= max_pairs ({self.max_pairs})"
            )
        if not (math.isfinite(self.budget_s) and self.budget_s > 0):
            raise PerfError(f"--ab-budget {self.budget_s!r} is not a time budget: give seconds > 0")

    def looks(self) -> list[int]:
        """The pair counts at which the verdict is looked at (whole blocks)."""
        counts: list[int] = []
        n = float(self.first)
        while len(counts) < MAX_LOOKS - 1 and _blocks(n) < self.max_pairs:
            counts.append(_blocks(n))
            n *= GROWTH
        return [*counts, _blocks(self.max_pairs)]


def _blocks(pairs: float) -> int:
    return math.ceil(pairs / AB_BLOCK) * AB_BLOCK


def ab_strata(base: list[float], head: list[float]) -> list[stats.Stratum]:
    """Pairs in blocks of AB_BLOCK consecutive pairs (one process pair each)."""
    return [(base[i : i + AB_BLOCK], head[i : i + AB_BLOCK]) for i in range(0, len(base), AB_BLOCK)]


CPU_UNIT = f"process pairs of {AB_BLOCK} A/B pairs"
GPU_UNIT = f"blocks of {AB_BLOCK} GPU A/B pairs"


def judge_pairs(
    base: list[float], head: list[float], factor: float, *, unit: str = CPU_UNIT
) -> Comparison:
    """The verdict on interleaved A/B pairs: their blocks' signed-rank interval. unit: what
    a block is (a fresh process pair for the CPU A/B; consecutive pairs for the GPU's)."""
    return compare_blocks(ab_strata(base, head), factor, unit=unit)


@dataclasses.dataclass
class Sampled:
    """What sequential sampling took and found: the pairs, the last comparison, the looks made,
    and why it stopped (decided, max_pairs, budget, or a sampler error)."""

    base: list[float]
    head: list[float]
    comparison: Comparison | None
    looks: int
    stopped: str
    error: str | None = None


PairSampler = Callable[[int], tuple[float, float]]
"""Takes pair i (the sampler alternates which side goes first, and starts fresh processes at
each block's first pair) and returns (base, head) seconds; raises SamplerError when a side
cannot be measured."""


class SamplerError(Exception):
    """A side could not take a sample (the worker's error is the message)."""


def sample_until_decided(
    sample_pair: PairSampler,
    factor: float,
    plan: SamplingPlan,
    *,
    clock: Callable[[], float] = time.monotonic,
    unit: str = CPU_UNIT,
    budget_s: Callable[[], float | None] | None = None,
) -> Sampled:
    """Take pairs until a look decides (decision.compare on ab_strata), the plan's pairs run
    out, or its budget does (then the pairs taken so far are judged).

    The budget starts when the first pair is in: that pair carries what a benchmark pays once
    (the workers' imports, its setup_cache: a history database built for a query benchmark),
    which is no measure of what more pairs cost. Counted, a setup_cache of a minute left one
    pair of bench_history.HistoryQuery and "too few samples" (exit 2) on unchanged code
    (2026-12-03). budget_s: asked then, a benchmark's own budget (None: the plan's), known
    once the first pair's workers have loaded it."""
    deadline = math.inf
    base: list[float] = []
    head: list[float] = []
    comparison: Comparison | None = None
    looks = 0
    for target in plan.looks():
        while len(base) < target:
            if clock() > deadline:
                break
            try:
                b, h = sample_pair(len(base))
            except SamplerError as exc:
                return Sampled(base, head, comparison, looks, "error", str(exc))
            base.append(b)
            head.append(h)
            if len(base) == 1:
                own = budget_s() if budget_s is not None else None
                deadline = clock() + (plan.budget_s if own is None else own)
        looks += 1
        comparison = judge_pairs(base, head, factor, unit=unit)
        if comparison.verdict is not Verdict.UNDECIDED:
            return Sampled(base, head, comparison, looks, "decided")
        if clock() > deadline:
            return Sampled(base, head, comparison, looks, "budget")
    return Sampled(base, head, comparison, looks, "max_pairs")
