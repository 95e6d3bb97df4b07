"""The gate's verdict on one timing benchmark: regressed, unchanged, improved or undecided.

Why a confidence interval and not "p is not small": a rank test that finds no significant
slowdown has only failed to find one. With 7 noisy wall-time samples per side a 5.8x
slowdown read p = 0.013 and passed as "slower, not significant". Here "unchanged" needs
evidence: the confidence interval of the ratio head/base lies inside the band (1/factor,
factor). Chromium's Pinpoint answers SAME, DIFFERENT or UNKNOWN the same way.

The interval is the one that belongs to the stratified Mann-Whitney test of stats.py
(Hodges-Lehmann, on log times, so that the change is a factor): the ratios r for which
"head = r * base" would not be rejected at ALPHA in either direction. Under that null the
sum over strata of U(r) = #{(b, h) in one stratum: h / r > b} has the exact distribution
stats.py builds; with c the largest count whose lower tail is <= ALPHA, the accepted r are
those with c < U(r) < N - c, i.e. between the (c+1)-th and (N-c)-th smallest within-stratum
ratio h / b. The estimate is the median of those ratios. Distribution-free: no normality,
and one spike moves one ratio in each pair it is part of, not the interval's ends.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

from harness.perf import stats


class Verdict(enum.StrEnum):
    """What the samples say about head against base, at the gate's factor F."""

    REGRESSED = "regressed"
    """Significantly slower (the whole interval is above 1) and the estimate is at least F."""
    UNCHANGED = "unchanged"
    """The whole interval lies inside (1/F, F): any change is smaller than the factor."""
    IMPROVED = "improved"
    """Significantly faster (the whole interval is below 1) and the estimate is at most 1/F."""
    UNDECIDED = "undecided"
    """None of the above: too noisy, or too few samples, to tell at this factor (never a pass)."""


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One benchmark's samples judged at a factor: the verdict, the estimate of head/base and
    its confidence interval [low, high] (level 1 - 2 * ALPHA), and the samples per side."""

    verdict: Verdict
    estimate: float
    low: float
    high: float
    factor: float
    n_base: int
    n_head: int
    units: int = 0  # what the interval's width scales with: samples per side, or blocks
    unit: str = "samples per side"

    def would_need(self) -> str:
        """For an undecided comparison: roughly how many samples per side, or which factor,
        would decide it (the interval narrows as 1/sqrt(n))."""
        if self.verdict is not Verdict.UNDECIDED:
            return ""
        n = self.units or max(self.n_base, self.n_head)
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low <= 0:
            return (
                f"more samples: {n} {self.unit} can never show a difference at this "
                "significance level"
            )
        est, width = math.log(self.estimate), (math.log(self.high) - math.log(self.low)) / 2
        log_f = math.log(self.factor)
        # Unchanged needs the interval's half-width below the distance from the estimate to
        # the band's nearer edge; regressed/improved needs it below the distance to 1.
        room = log_f - abs(est) if abs(est) < log_f else abs(est)
        if room <= 0.05 * log_f:
            samples = "far more samples than any budget (its estimate sits on the factor)"
        else:
            needed = math.ceil(n * (width / room) ** 2)
            samples = f"about {needed} {self.unit} (it has {n})"
        reach = math.ceil(max(self.high, 1 / self.low) * 1000) / 1000  # up: "above" holds
        return (
            f"{samples}, or a factor above {reach:g} (its interval "
            f"[{self.low:.3g}, {self.high:.3g}] reaches that far)"
        )


def _lower_critical(strata: Sequence[tuple[int, int]], alpha: float) -> int:
    """The largest c with P(sum of U <= c) <= alpha under the null; -1 when even c = 0 is
    likelier than alpha (those sample counts can never reject)."""
    sizes = [(n, m) for n, m in strata if n and m]
    if not sizes:
        return -1
    total = sum(n * m for n, m in sizes)
    if max(n * m for n, m in sizes) > stats._EXACT_LIMIT:
        mean = total / 2
        sd = math.sqrt(sum(n * m * (n + m + 1) / 12 for n, m in sizes))
        z = -math.sqrt(2) * _erfcinv(2 * alpha)  # the lower alpha quantile of N(0, 1)
        return math.floor(mean + z * sd - 0.5)  # continuity-corrected
    dist = [1.0]
    for n, m in sizes:
        dist = stats._convolve(dist, stats._pmf(n, m))
    tail, c = 0.0, -1
    for k, p in enumerate(dist):
        tail += p
        if tail > alpha * (1 + 1e-12):
            break
        c = k
    return c


def _erfcinv(y: float) -> float:
    """erfc^-1 by bisection (the normal approximation above only needs a few digits)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if math.erfc(mid) > y:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _positive(samples: Sequence[float]) -> list[float]:
    # A timing of 0 or below (a clock too coarse for the benchmark) has no log; nan is no sample.
    return [float(x) for x in samples if not math.isnan(x) and x > 0]


def compare(
    strata: Sequence[stats.Stratum], factor: float, *, alpha: float = stats.ALPHA
) -> Comparison:
    """Judge head against base from strata of (base samples, head samples) taken together."""
    cleaned = [(_positive(b), _positive(h)) for b, h in strata]
    cleaned = [(b, h) for b, h in cleaned if b and h]
    n_base = sum(len(b) for b, _ in cleaned)
    n_head = sum(len(h) for _, h in cleaned)
    logs = sorted(
        math.log(x) - math.log(y) for b, h in cleaned for x in h for y in b
    )  # log(h / b) for every within-stratum pair
    if not logs:
        return Comparison(Verdict.UNDECIDED, math.nan, 0.0, math.inf, factor, n_base, n_head)
    mid = len(logs) // 2
    est = math.exp(logs[mid] if len(logs) % 2 else (logs[mid - 1] + logs[mid]) / 2)
    c = _lower_critical([(len(b), len(h)) for b, h in cleaned], alpha)
    if c < 0 or c >= len(logs) - c - 1:
        return Comparison(Verdict.UNDECIDED, est, 0.0, math.inf, factor, n_base, n_head)
    low, high = math.exp(logs[c]), math.exp(logs[len(logs) - c - 1])
    verdict = _verdict(est, low, high, factor)
    return Comparison(verdict, est, low, high, factor, n_base, n_head)


def _verdict(est: float, low: float, high: float, factor: float) -> Verdict:
    if 1 / factor < low and high < factor:
        return Verdict.UNCHANGED
    if low > 1 and est >= factor:
        return Verdict.REGRESSED
    if high < 1 and est <= 1 / factor:
        return Verdict.IMPROVED
    return Verdict.UNDECIDED


# A `regressed` reading of interleaved A/B pairs is measured again, independently (new worker
# processes from a new zygote pair: ab.py), up to this many measurements in all; the verdict is
# the one that two of them share (settle).
MEASUREMENTS = 3


def settle(verdicts: Sequence[Verdict]) -> Verdict | None:
    """The verdict of independent measurements of one benchmark, in the order taken; None
    when another measurement is needed.

    Why: the blocks' interval (compare_blocks) sees noise that differs from block to block,
    not a difference that every block of one measurement shares. The gate's own A/A runs on
    a busy 2-core VM read identical code as 1.208 [1.144, 1.327] and 1.375 [1.112, 1.662] in 2 of
    88 runs, every block of the run slower on the head side (docs/perf.md, "The gate's error
    rates, measured"). Such a difference belongs to one measurement (its worker processes,
    the seconds it ran in), so a second, independent one does not share it: a regression fails
    the gate only when two measurements read `regressed`. The first measurement stands alone
    when it reads anything else (unchanged or improved never fail; undecided fails anyway).
    After a `regressed` and a disagreeing second reading, a third decides: the verdict two of
    the three share, or `undecided` (exit 2) when all three differ.
    """
    if not verdicts:
        return None
    if verdicts[0] is not Verdict.REGRESSED:
        return verdicts[0]
    for verdict in Verdict:
        if sum(v is verdict for v in verdicts) >= 2:
            return verdict
    return Verdict.UNDECIDED if len(verdicts) >= MEASUREMENTS else None


def _signed_rank_lower_critical(n: int, alpha: float) -> int:
    """The largest c with P(T+ <= c) <= alpha for the Wilcoxon signed-rank statistic of n
    values (exact: T+ is a sum of a random subset of 1..n); -1 when even 0 is likelier."""
    counts = [1]
    for k in range(1, n + 1):
        grown = counts + [0] * k
        for t, c in enumerate(counts):
            grown[t + k] += c
        counts = grown
    total, tail, c = 2**n, 0, -1
    for t, count in enumerate(counts):
        tail += count
        if tail / total > alpha * (1 + 1e-12):
            break
        c = t
    return c


def compare_blocks(
    blocks: Sequence[stats.Stratum],
    factor: float,
    *,
    alpha: float = stats.ALPHA,
    unit: str = "blocks",
) -> Comparison:
    """Judge head against base from blocks of paired samples, each block measured by its own
    pair of processes: one value per block (the median of its pairs' log(h / b)), and the
    Wilcoxon signed-rank interval of their centre (Hodges-Lehmann: the (c+1)-th smallest and
    largest of the Walsh averages (x_i + x_j) / 2).

    Why blocks are the unit: two processes running identical code differ by a few percent
    (their memory layouts, the core each ran on), for as long as they live; interleaved pairs
    of one process pair share that difference, so the pairs are not independent and a rank test
    over them calls it significant (identical code read 1.13x and 1.20x "significantly" over
    20 pairs of one process pair, docs/perf.md). Across fresh process pairs that difference is
    random, and the blocks are independent. At least 10 blocks are needed to reach ALPHA.
    """
    values = []
    n_base = n_head = 0
    for b, h in blocks:
        logs = [
            math.log(y) - math.log(x)
            for x, y in zip(b, h, strict=False)
            if not (math.isnan(x) or math.isnan(y)) and x > 0 and y > 0
        ]
        if logs:
            values.append(_median(logs))
            n_base += len(logs)
            n_head += len(logs)
    n = len(values)
    if not values:
        return Comparison(Verdict.UNDECIDED, math.nan, 0.0, math.inf, factor, 0, 0, 0, unit)
    walsh = sorted((values[i] + values[j]) / 2 for i in range(n) for j in range(i, n))
    est = math.exp(_median(walsh))
    c = _signed_rank_lower_critical(n, alpha)
    if c < 0 or c >= len(walsh) - c - 1:
        return Comparison(Verdict.UNDECIDED, est, 0.0, math.inf, factor, n_base, n_head, n, unit)
    low, high = math.exp(walsh[c]), math.exp(walsh[len(walsh) - c - 1])
    verdict = _verdict(est, low, high, factor)
    return Comparison(verdict, est, low, high, factor, n_base, n_head, n, unit)


def _median(xs: Sequence[float]) -> float:
    ys = sorted(xs)
    mid = len(ys) // 2
    return ys[mid] if len(ys) % 2 else (ys[mid - 1] + ys[mid]) / 2
