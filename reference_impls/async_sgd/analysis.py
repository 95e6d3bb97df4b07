"""Staleness vs loss: does a window of high staleness go with slower loss decrease?

The log is cut into consecutive windows of ``window`` applied updates (in version order). For
each window:

* ``x`` = mean staleness of its updates;
* ``slowdown`` = mean relative change of the loss per update, ``(L_t - L_{t-1}) / L_{t-1}``
  (negative while the loss falls; larger = slower decrease, positive = the loss rose);
* ``spread`` = standard deviation of those relative changes (the loss's jitter).

``L`` is the server's full-data loss after each update when the run evaluated it, else the
workers' minibatch losses. Training's own progress makes both the loss changes and (while the
workers start up) the staleness drift with time, which alone would correlate them; so the
first window is dropped and each series is detrended (its least-squares quadratic in the
window index removed) before Pearson's correlation is taken, with a percentile bootstrap
confidence interval over windows (seeded: the report is reproducible).

A correlation is **found** when (1) the run has windows of high staleness: the mean
staleness of its top quarter of windows is at least ``contrast`` (1.5) times that of its
bottom quarter, and (2) the whole interval of r lies above zero. Windows are consecutive, so
neighbouring ones are not independent; the interval is indicative, and the control run
(same setup, no stragglers) is the check that a finding comes from staleness and not from
the analysis. (Staleness does slow SGD a little at every level; in a control all windows
are about equally stale, so condition (1) fails and its r, reported anyway, describes noise
around a near-constant staleness.)

``python -m reference_impls.async_sgd analyze RUN_DIR [--control DIR]`` prints the table,
writes ``analysis.json`` and two plots into RUN_DIR: ``staleness_hist.png`` (staleness
histogram per worker) and ``loss_vs_time.png`` (loss against time, windows of high staleness
shaded).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reference_impls.async_sgd.runlog import read_log, read_summary
from reference_impls.async_sgd.server import UpdateRecord, UpdateStatus

__all__ = ["Correlation", "WindowStats", "analyze_run", "correlation", "window_stats"]


@dataclasses.dataclass(frozen=True)
class WindowStats:
    """Per-window arrays (one entry per window)."""

    mean_staleness: np.ndarray  # (W,)
    slowdown: np.ndarray  # (W,) mean relative loss change per update
    spread: np.ndarray  # (W,) std of relative loss changes
    t_start: np.ndarray  # (W,) time of the window's first update
    t_end: np.ndarray  # (W,)
    loss_source: str


@dataclasses.dataclass(frozen=True)
class Correlation:
    """Pearson's r of staleness with one loss statistic, with its bootstrap interval."""

    r: float
    low: float
    high: float
    confidence: float
    windows: int

    @property
    def found(self) -> bool:
        """A positive correlation whose whole interval is above zero."""
        return self.low > 0

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "found": self.found}


def window_stats(records: Sequence[UpdateRecord], window: int) -> WindowStats:
    """Cut the applied updates into windows of ``window`` (module docstring)."""
    if window < 2:
        raise ValueError(f"window must be >= 2 updates, got {window}")
    applied = sorted(
        (r for r in records if r.status is UpdateStatus.APPLIED), key=lambda r: r.version
    )
    use_server = bool(applied) and all(r.server_loss is not None for r in applied)
    loss = np.array([r.server_loss if use_server else r.loss for r in applied], dtype=np.float64)
    s = np.array([r.staleness for r in applied], dtype=np.float64)
    t = np.array([r.time_s for r in applied], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(loss))
    if len(bad):
        # A NaN would make every r NaN, and "NaN > 0" is False: a diverged run would read as
        # "no correlation found" instead of as the failure it is.
        raise ValueError(
            f"the loss is not finite ({loss[bad[0]]}) first at applied update version "
            f"{applied[bad[0]].version} ({len(bad)} of {len(loss)} updates not finite): the run "
            "diverged; lower the learning rate or bound the staleness, then analyze the new run"
        )
    if len(applied) < 3 * window + 1:
        raise ValueError(
            f"{len(applied)} applied updates give fewer than 3 windows of {window}: use a "
            "smaller --window or a longer run"
        )
    rel = np.diff(loss) / np.maximum(np.abs(loss[:-1]), 1e-12)  # (n-1,) change at update i+1
    n_win = len(rel) // window
    rel = rel[: n_win * window].reshape(n_win, window)
    s_w = s[1 : 1 + n_win * window].reshape(n_win, window)
    t_w = t[1 : 1 + n_win * window].reshape(n_win, window)
    return WindowStats(
        mean_staleness=s_w.mean(1),
        slowdown=rel.mean(1),
        spread=rel.std(1),
        t_start=t_w[:, 0],
        t_end=t_w[:, -1],
        loss_source="server full-data loss" if use_server else "worker minibatch loss",
    )


def detrend(v: np.ndarray, degree: int = 2) -> np.ndarray:
    """``v`` minus its least-squares polynomial in the window index: what is left once the
    slow progress of training (and the start-up ramp of staleness) is taken out."""
    k = np.linspace(-1.0, 1.0, len(v))
    basis = np.vander(k, degree + 1)  # (n, degree + 1)
    coef, *_ = np.linalg.lstsq(basis, v, rcond=None)
    return np.asarray(v - basis @ coef)


def correlation(
    x: np.ndarray, y: np.ndarray, *, resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> Correlation:
    """Pearson's r with a percentile bootstrap interval (pairs resampled with replacement)."""
    if len(x) != len(y) or len(x) < 3:
        raise ValueError(f"need >= 3 paired values, got {len(x)} and {len(y)}")
    r = _pearson(x, y)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(resamples, len(x)))  # (B, n)
    xs, ys = x[idx], y[idx]
    xc = xs - xs.mean(1, keepdims=True)
    yc = ys - ys.mean(1, keepdims=True)
    den = np.sqrt((xc * xc).sum(1) * (yc * yc).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        rs = np.where(den > 0, (xc * yc).sum(1) / den, 0.0)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(rs, [alpha, 1 - alpha])
    return Correlation(float(r), float(low), float(high), confidence, len(x))


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    xc, yc = x - x.mean(), y - y.mean()
    den = math.sqrt(float((xc * xc).sum() * (yc * yc).sum()))
    return float((xc * yc).sum() / den) if den > 0 else 0.0


def staleness_contrast(mean_staleness: np.ndarray) -> float:
    """Mean staleness of the top quarter of windows over that of the bottom quarter."""
    q = np.sort(mean_staleness)
    k = max(1, len(q) // 4)
    return float(q[-k:].mean() / max(q[:k].mean(), 1e-9))


def analyze_windows(
    ws: WindowStats, *, contrast: float = 1.5, resamples: int = 2000, seed: int = 0
) -> dict[str, Any]:
    """The correlations and the verdict for one run's windows (module docstring)."""
    if len(ws.mean_staleness) < 5:
        raise ValueError(
            f"only {len(ws.mean_staleness)} windows: need >= 5 (a longer run or a smaller window)"
        )
    x = detrend(ws.mean_staleness[1:])
    has_contrast = staleness_contrast(ws.mean_staleness[1:])
    out: dict[str, Any] = {
        "windows": len(ws.mean_staleness) - 1,
        "loss_source": ws.loss_source,
        "staleness_contrast": has_contrast,
        "contrast_needed": contrast,
    }
    for name, y in (("slowdown", ws.slowdown), ("spread", ws.spread)):
        c = correlation(x, detrend(y[1:]), resamples=resamples, seed=seed)
        out[f"staleness_vs_{name}"] = {**c.to_json(), "found": c.found and has_contrast >= contrast}
    out["found"] = bool(
        out["staleness_vs_slowdown"]["found"] or out["staleness_vs_spread"]["found"]
    )
    return out


def analyze_run(
    run_dir: str | Path,
    *,
    window: int = 20,
    contrast: float = 1.5,
    resamples: int = 2000,
    seed: int = 0,
    plots: bool = True,
) -> dict[str, Any]:
    """Correlations of one run directory (and its plots); also written to analysis.json."""
    if not (math.isfinite(contrast) and contrast >= 1):
        # The contrast is a ratio of the top quarter's staleness to the bottom quarter's, so it
        # is >= 1 on every run: a bar below 1 (or NaN) would switch condition (1) off unseen.
        raise ValueError(
            f"contrast must be a finite number >= 1 (a ratio of mean staleness, top quarter of "
            f"windows over bottom quarter; default 1.5), got {contrast!r}"
        )
    run_dir = Path(run_dir)
    records = read_log(run_dir)
    summary = read_summary(run_dir)
    ws = window_stats(records, window)
    result = {
        "run_dir": str(run_dir),
        "mode": summary.get("mode"),
        "window": window,
        "mean_staleness": float(
            np.mean([r.staleness for r in records if r.status is UpdateStatus.APPLIED])
        ),
        **analyze_windows(ws, contrast=contrast, resamples=resamples, seed=seed),
    }
    if plots:
        result["plots"] = _plot(run_dir, records, ws, summary.get("time_unit", "s"))
    (run_dir / "analysis.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _plot(run_dir: Path, records: Sequence[UpdateRecord], ws: WindowStats, unit: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    applied = [r for r in records if r.status is UpdateStatus.APPLIED]
    workers = sorted({r.worker for r in applied})
    fig, ax = plt.subplots(figsize=(7, 4))
    top = max(r.staleness for r in applied)
    bins = [b - 0.5 for b in range(top + 2)]
    for w in workers:
        ax.hist(
            [r.staleness for r in applied if r.worker == w],
            bins=bins,
            histtype="step",
            label=f"worker {w}",
            linewidth=1.5,
        )
    ax.set_xlabel("staleness s (updates)")
    ax.set_ylabel("updates")
    ax.set_title("staleness per worker")
    ax.legend()
    fig.tight_layout()
    hist = run_dir / "staleness_hist.png"
    fig.savefig(hist, dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    applied.sort(key=lambda r: r.version)
    scale = 1000.0 if unit == "simulated ms" else 1.0
    t = [r.time_s * scale for r in applied]
    use_server = all(r.server_loss is not None for r in applied)
    losses = [
        float(r.server_loss) if use_server and r.server_loss is not None else r.loss
        for r in applied
    ]
    ax.plot(t, losses, lw=1, color="C0")
    threshold = float(np.quantile(ws.mean_staleness, 0.75))
    for m, a, b in zip(ws.mean_staleness, ws.t_start, ws.t_end, strict=True):
        if m > threshold:
            ax.axvspan(a * scale, b * scale, color="C3", alpha=0.2, lw=0)
    ax.set_xlabel("time (ms, simulated)" if unit == "simulated ms" else "time (s)")
    ax.set_ylabel("loss (" + ws.loss_source + ")")
    ax.set_title(f"loss vs time; shaded: windows with mean staleness > {threshold:.1f}")
    fig.tight_layout()
    curve = run_dir / "loss_vs_time.png"
    fig.savefig(curve, dpi=100)
    plt.close(fig)
    return [str(hist), str(curve)]
