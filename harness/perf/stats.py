"""The gate's statistics: a robust ratio and a rank test over base/head samples taken in pairs.

Why not asv's own test on the pooled samples: under load a shared machine's speed shifts from
one asv run to the next (another job starts, two busy loops on 2 cores). ``harness perf run``
measures base and head alternately (base, head, base, head: one *pass* is one asv run of each),
so each pass is a pair of sample sets taken seconds apart under the same load. Pooling all
passes mixes those shifts into both sides; one loaded pass then makes a 2x slowdown overlap
the base and asv's Mann-Whitney test calls it "not significant". Here each pass is a stratum:

- the ratio is the median over passes of ``median(head_k) / median(base_k)`` (a geometric
  median of per-pass ratios): one spiked pass out of four does not move it far;
- significance is a stratified Mann-Whitney test (the sum over passes of each pass's U
  statistic, exact null distribution by convolution): only comparisons within a pass count,
  so a shift between passes adds no noise.

With one stratum (results measured without pass records) both reduce to the pooled median
ratio and the one-sided Mann-Whitney U test, the same evidence asv's compare uses.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

# One-sided level for "slower" (and separately for "faster"): asv's compare uses a two-sided
# p < 0.002, which is one-sided 0.001 in each direction.
ALPHA = 0.001

# Above this many (base x head) comparisons in one stratum the exact null distribution is
# replaced by its normal approximation (exact convolution costs O(n * n * m) there).
_EXACT_LIMIT = 2500

Stratum = tuple[Sequence[float], Sequence[float]]  # (base samples, head samples) of one pass


def _clean(samples: Sequence[float]) -> list[float]:
    return [float(x) for x in samples if not math.isnan(x)]


def u_statistic(base: Sequence[float], head: Sequence[float]) -> float:
    """How many (base, head) pairs have head slower (ties count half): 0 .. len(base)*len(head)."""
    return sum(1.0 if h > b else 0.5 if h == b else 0.0 for b in base for h in head)


def _u_counts(n: int, m: int) -> list[int]:
    """Arrangements of n base and m head samples by U (no ties): the Gaussian binomial
    coefficients of [n+m choose n]_q, built as prod_{i=1..n} (1 - q^(m+i)) / (1 - q^i)."""
    poly = [1]
    for i in range(1, n + 1):
        grown = poly + [0] * (m + i)
        for k, c in enumerate(poly):  # times (1 - q^(m+i))
            grown[k + m + i] -= c
        for k in range(i, len(grown)):  # divided by (1 - q^i): exact, the quotient is a polynomial
            grown[k] += grown[k - i]
        poly = grown[: i * m + 1]
    return poly


def _pmf(n: int, m: int) -> list[float]:
    counts = _u_counts(n, m)
    total = math.comb(n + m, n)
    return [c / total for c in counts]


def _convolve(a: list[float], b: list[float]) -> list[float]:
    out = [0.0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        if x:
            for j, y in enumerate(b):
                out[i + j] += x * y
    return out


def p_slower(strata: Sequence[Stratum]) -> float:
    """One-sided p-value of "head is slower than base", pass by pass (stratified Mann-Whitney).

    Under the null hypothesis (no difference) every arrangement of a pass's samples is equally
    likely, independently between passes; the statistic is the sum of the passes' U. Ties count
    half in U while the null assumes none (timings rarely tie), so with ties p is approximate.
    """
    cleaned = [(_clean(b), _clean(h)) for b, h in strata]
    cleaned = [(b, h) for b, h in cleaned if b and h]
    if not cleaned:
        return 1.0
    observed = sum(u_statistic(b, h) for b, h in cleaned)
    if max(len(b) * len(h) for b, h in cleaned) > _EXACT_LIMIT:
        mean = sum(len(b) * len(h) / 2 for b, h in cleaned)
        var = sum(len(b) * len(h) * (len(b) + len(h) + 1) / 12 for b, h in cleaned)
        z = (observed - 0.5 - mean) / math.sqrt(var)  # continuity-corrected
        return 0.5 * math.erfc(z / math.sqrt(2))
    dist = [1.0]
    for b, h in cleaned:
        dist = _convolve(dist, _pmf(len(b), len(h)))
    return min(1.0, sum(dist[math.ceil(observed - 1e-9) :]))


def p_faster(strata: Sequence[Stratum]) -> float:
    """One-sided p-value of "head is faster than base" (p_slower with the sides swapped)."""
    return p_slower([(h, b) for b, h in strata])


def min_p(sizes: Sequence[tuple[int, int]]) -> float:
    """The smallest p-value passes of these (base, head) sample counts can give: every head
    sample slower than every base sample in every pass. At or above ALPHA nothing can ever be
    significant: such a gate cannot see even a 10x regression."""
    p = 1.0
    for n, m in sizes:
        if n and m:
            p /= math.comb(n + m, n)
    return p


def ratio(strata: Sequence[Stratum]) -> float:
    """head/base: the median over passes of median(head) / median(base) of each pass.

    Medians of logs, so that 0.5 and 2.0 are equally far from 1. nan when no pass has samples
    on both sides; inf when a base median is 0 and the head's is not.
    """
    logs = []
    for b, h in strata:
        b, h = _clean(b), _clean(h)
        if not (b and h):
            continue
        mb, mh = statistics.median(b), statistics.median(h)
        if mb <= 0 or mh <= 0:
            if mb == mh:
                logs.append(0.0)
            else:
                logs.append(math.inf if mb <= 0 else -math.inf)
            continue
        logs.append(math.log(mh / mb))
    if not logs:
        return math.nan
    return math.exp(statistics.median(logs))
