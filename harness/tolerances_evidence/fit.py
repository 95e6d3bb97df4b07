"""The tail of a check's error over seeds: peaks over threshold with a generalized Pareto fit.

The method of FLEX (Dutta et al., "FLEX: Fixing Flaky Tests in Machine Learning Projects by
Updating Assertion Bounds", FSE 2021): of ``n`` samples (one per test run: the largest share
of its bound a check used in that run), the ``k`` above a threshold ``u`` are, by the
Pickands-Balkema-de Haan theorem, close to a generalized Pareto distribution (GPD) once ``u``
is high enough, whatever the distribution of the samples was. With the GPD fitted to the
exceedances ``x - u`` (maximum likelihood, ``scipy.stats.genpareto``, location fixed at 0),
the probability that a run exceeds ``x > u`` is

    P(X > x) = (k / n) * GPD.sf(x - u; shape, scale)

and the value exceeded with probability ``p`` (``p < k / n``) is
``u + GPD.isf(p * n / k; shape, scale)``. A bootstrap over the samples (resample, re-choose
the threshold, refit) gives the interval around that value.

The threshold is the ``threshold_quantile`` (0.8) empirical quantile, with at least
``MIN_EXCEEDANCES`` samples above it: with the 50 to 200 runs a shared machine affords, a
higher threshold leaves too few points for a two-parameter fit, a lower one fits the body of
the distribution rather than its tail.

A fitted shape below :data:`SHAPE_FLOOR` (0) is raised to it and the scale refitted: the
tail used is never lighter than exponential. A negative shape is a tail with an end, and
fitted to a few dozen exceedances that end lands just past the largest sample: the most
confident fit is the one most likely to be wrong. One held-out check refuted such a fit
(docs/benchmarks/tolerances.md, the ragged-lengths forward: shape -0.55, 5 of 1,044 fresh
samples past a bound predicted to fail 1 run in 10,000). For a truly bounded tail the
exponential overstates the quantile, which for a proposed bound is the safe side.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "MIN_EXCEEDANCES",
    "MIN_SAMPLES",
    "SHAPE_FLOOR",
    "Estimate",
    "TailFit",
    "estimate",
    "fit_tail",
    "pwm",
]

MIN_SAMPLES = 30
"""Fewer runs than this are reported as too few to fit."""
MIN_EXCEEDANCES = 8
"""The fewest samples above the threshold a fit uses."""
SHAPE_FLOOR = 0.0
"""The lightest tail a fit extrapolates with (the exponential; see the module docstring)."""


@dataclasses.dataclass(frozen=True)
class TailFit:
    """A GPD fitted to the samples above ``threshold``."""

    n: int
    threshold: float
    exceedances: int
    shape: float
    """The shape the tail is extrapolated with: the fitted one, raised to the floor."""
    scale: float
    fitted_shape: float
    """The maximum-likelihood shape before the floor (below it: the tail was floored)."""

    @property
    def floored(self) -> bool:
        return self.shape != self.fitted_shape

    def sf(self, x: float) -> float:
        """P(a run's value > x); for x below the threshold only the empirical share above it
        is known, which this returns as an upper bound's stand-in (the threshold's rate)."""
        from scipy.stats import genpareto

        rate = self.exceedances / self.n
        if x <= self.threshold:
            return rate
        return float(rate * genpareto.sf(x - self.threshold, self.shape, 0.0, self.scale))

    def quantile(self, p: float) -> float:
        """The value a run exceeds with probability ``p`` (``p`` below the threshold's rate)."""
        from scipy.stats import genpareto

        rate = self.exceedances / self.n
        if p >= rate:
            return self.threshold
        return float(self.threshold + genpareto.isf(p / rate, self.shape, 0.0, self.scale))


def fit_tail(
    samples: Sequence[float] | np.ndarray,
    threshold_quantile: float = 0.8,
    shape_floor: float | None = SHAPE_FLOOR,
) -> TailFit:
    """Fit a GPD to the samples above their ``threshold_quantile`` quantile; a shape below
    ``shape_floor`` is raised to it and the scale refitted (None: no floor).

    Raises ``ValueError`` when fewer than :data:`MIN_EXCEEDANCES` samples lie above it or
    they do not vary (no tail to fit).
    """
    from scipy.stats import genpareto

    x = np.sort(np.asarray(samples, dtype=np.float64))
    if not np.isfinite(x).all():
        raise ValueError("samples must be finite")
    n = x.size
    k = max(MIN_EXCEEDANCES, int(round(n * (1.0 - threshold_quantile))))
    if k >= n:
        raise ValueError(f"{n} samples leave fewer than {MIN_EXCEEDANCES} above a threshold")
    u = float(x[n - k - 1])
    excess = x[n - k :] - u
    excess = excess[excess > 0]
    if excess.size < MIN_EXCEEDANCES or np.unique(excess).size < 3:
        raise ValueError("the samples above the threshold do not vary: no tail to fit")
    shape0, scale0 = pwm(excess)
    shape, _, scale = genpareto.fit(excess, shape0, floc=0.0, scale=scale0)
    if not (math.isfinite(shape) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"the GPD fit did not converge (shape {shape}, scale {scale})")
    used_shape, used_scale = shape, scale
    if shape_floor is not None and shape < shape_floor:
        used_shape = shape_floor
        if shape_floor == 0.0:
            used_scale = float(excess.mean())  # the exponential's maximum-likelihood scale
        else:
            _, _, used_scale = genpareto.fit(excess, f0=shape_floor, floc=0.0, scale=scale0)
    return TailFit(
        n=n,
        threshold=u,
        exceedances=int(excess.size),
        shape=float(used_shape),
        scale=float(used_scale),
        fitted_shape=float(shape),
    )


def pwm(excess: np.ndarray) -> tuple[float, float]:
    """``(shape, scale)`` of a GPD by probability-weighted moments (Hosking and Wallis,
    Technometrics 1987): closed-form, the maximum-likelihood search's starting point (it
    then converges in a fraction of the evaluations, which the bootstrap repeats 100 times)."""
    x = np.sort(excess)
    n = x.size
    b0 = float(x.mean())
    b1 = float(np.sum(np.arange(n) / (n - 1) * x) / n)
    a1 = b0 - b1  # E[X (1 - F(X))]
    denom = b0 - 2 * a1
    if denom <= 0:
        return 0.0, b0
    return -(b0 / denom - 2), 2 * b0 * a1 / denom


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The value exceeded with probability ``target``, with a bootstrap interval."""

    fit: TailFit
    target: float
    value: float
    low: float
    high: float
    confidence: float
    replicates: int


def estimate(
    samples: Sequence[float] | np.ndarray,
    target: float,
    *,
    bootstrap: int = 100,
    confidence: float = 0.9,
    seed: int = 0,
    threshold_quantile: float = 0.8,
    shape_floor: float | None = SHAPE_FLOOR,
) -> Estimate:
    """The ``1 - target`` quantile of the samples' distribution from the fitted tail, and a
    percentile-bootstrap interval of level ``confidence`` from ``bootstrap`` resamples
    (seeded: the same samples give the same interval). Raises ``ValueError`` as
    :func:`fit_tail` does."""
    if not 0 < target < 1:
        raise ValueError(f"target failure probability must be in (0, 1), got {target}")
    x = np.asarray(samples, dtype=np.float64)
    fit = fit_tail(x, threshold_quantile, shape_floor)
    value = fit.quantile(target)
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(bootstrap):
        try:
            resample = rng.choice(x, size=x.size, replace=True)
            refit = fit_tail(resample, threshold_quantile, shape_floor)
        except ValueError:
            continue  # a resample without a tail says nothing about its width
        q = refit.quantile(target)
        if math.isfinite(q):
            values.append(q)
    if values:
        alpha = (1.0 - confidence) / 2
        low, high = (float(v) for v in np.quantile(values, [alpha, 1 - alpha]))
    else:
        low = high = math.nan
    return Estimate(fit, target, value, low, high, confidence, len(values))
