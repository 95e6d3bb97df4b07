"""`harness tolerances propose`: from recorded check errors over many seeds, a bound per site.

Each sample is one test run's ``max_used`` at one call site (the largest share of its bound
the check used: above 1 it failed). :func:`analyse` groups the records of
:mod:`.recording` by site, fits the tail of the samples (:mod:`.fit`) and turns the value
exceeded with the target probability into a scale factor for the site's bound: the proposed
bound is the current ``(rtol, atol)`` times the upper end of that value's bootstrap interval
(the conservative end: a proposal should not flake because the fit was optimistic), never
below the largest share observed, each rounded up to two significant digits.

Verdicts, with ``F`` that factor:

- ``too tight: expect 1 failure in K runs``: the fitted value itself is above 1 (the bound
  fails more often than the target); ``K = 1 / P(share > 1)`` from the fit;
- ``too loose by Nx``: ``F <= 1/2`` (``N = 1 / F``);
- ``about right``: in between, including a fit below 1 whose interval reaches past 1 (said);
- no fit: fewer than :data:`.fit.MIN_SAMPLES` runs, every error 0 (an exact check), an error
  that does not change with the seed, or a non-finite error: said as such.

:func:`run_sweep` runs the tests (pytest in a subprocess, ``--harness-repeat`` runs per
process under one base seed each) and :func:`patch_for` writes the unified diff of ``--write``.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import difflib
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.tolerances_evidence import fit as _fit

__all__ = [
    "Holdout",
    "ProposeError",
    "SiteReport",
    "analyse",
    "holdout_check",
    "load_records",
    "overrides_for",
    "patch_for",
    "round_up",
    "run_sweep",
    "sweep_seeds",
]


class ProposeError(ValueError):
    """Bad input to ``harness tolerances propose``: a records file, a node id, a run."""


@dataclasses.dataclass
class SiteReport:
    site: str
    tests: list[str]
    function: str
    kind: str
    runs: int
    rtol: float
    atol: float
    dtype: str
    bound: str
    bounds_vary: bool
    max_used: float
    max_abs: float
    max_rel: float
    status: str  # "fitted" | "no fit"
    verdict: str
    factor: float | None = None
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    shape: float | None = None
    """The fitted GPD shape (before the floor of :data:`.fit.SHAPE_FLOOR`)."""
    shape_floored: bool = False
    """The fitted shape was below the floor: the tail was extrapolated as exponential."""
    p_fail_current: float | None = None
    proposed_rtol: float | None = None
    proposed_atol: float | None = None
    failures: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def round_up(x: float, digits: int = 2) -> float:
    """``x`` rounded up to ``digits`` significant digits (0 stays 0)."""
    if x <= 0 or not math.isfinite(x):
        return x
    exp = math.floor(math.log10(x)) - (digits - 1)
    scaled = x / 10.0**exp
    out = math.ceil(scaled - 1e-9) * 10.0**exp
    return float(f"{out:.{digits}g}")


def load_records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a ``--harness-record-errors`` file; raises :class:`ProposeError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ProposeError(f"records file {path}: {exc.strerror or exc}") from None
    out = []
    need = {"test", "site", "max_used", "rtol", "atol"}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ProposeError(f"records file {path}, line {n}: not JSON ({exc})") from None
        if not isinstance(record, dict) or not need <= set(record):
            raise ProposeError(
                f"records file {path}, line {n}: expected an object with {sorted(need)}"
            )
        out.append(record)
    return out


def _fmt_k(p: float) -> str:
    if p <= 0:
        return "never (beyond the fitted tail's end)"
    k = 1.0 / p
    return f"{k:.3g}" if k < 1e6 else f"{k:.2g}"


def analyse(
    records: Iterable[dict[str, Any]],
    target: float,
    *,
    bootstrap: int = 100,
    seed: int = 0,
) -> list[SiteReport]:
    """One :class:`SiteReport` per call site, in site order (see the module docstring)."""
    by_site: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_site.setdefault(record["site"], []).append(record)
    reports = []
    for site in sorted(by_site, key=_site_key):
        group = by_site[site]
        worst = max(group, key=lambda r: float(r["max_used"]))
        used = np.array([float(r["max_used"]) for r in group])
        report = SiteReport(
            site=site,
            tests=sorted({r["test"] for r in group}),
            function=str(worst.get("function", "")),
            kind=str(worst.get("kind", "")),
            runs=len(group),
            rtol=float(worst["rtol"]),
            atol=float(worst["atol"]),
            dtype=str(worst.get("dtype", "")),
            bound=str(worst.get("bound", "")),
            bounds_vary=any(r.get("bounds_vary") for r in group)
            or len({(r["rtol"], r["atol"]) for r in group}) > 1,
            max_used=float(used.max()),
            max_abs=max(float(r.get("max_abs", 0.0)) for r in group),
            max_rel=max(float(r.get("max_rel", 0.0)) for r in group),
            status="no fit",
            verdict="",
            failures=int((used > 1).sum()),
        )
        _judge(report, used, target, bootstrap, seed)
        reports.append(report)
    return reports


def _site_key(site: str) -> tuple[str, int]:
    path, _, line = site.rpartition(":")
    return path, int(line) if line.isdigit() else 0


def _judge(report: SiteReport, used: np.ndarray, target: float, bootstrap: int, seed: int) -> None:
    exact = report.rtol == 0 and report.atol == 0
    if not np.isfinite(used).all():
        bad = int((~np.isfinite(used)).sum())
        report.verdict = (
            f"no fit: {bad} of {report.runs} runs had a non-finite error or differed under "
            "an exact bound (a failure, not a tail)"
            if not exact
            else f"exact check: differed in {bad} of {report.runs} runs"
        )
        return
    if exact or float(used.max()) == 0.0:
        if float(used.max()) != 0.0:
            report.verdict = "no fit: an exact bound"
        elif exact:
            report.verdict = f"no fit: every error is 0 over {report.runs} runs (an exact check)"
        else:
            report.verdict = (
                f"no fit: every error is 0 over {report.runs} runs (the same bits every run: "
                "nothing of the bound is used)"
            )
        return
    if report.runs < _fit.MIN_SAMPLES:
        report.verdict = (
            f"no fit: {report.runs} runs, too few for a tail fit (at least {_fit.MIN_SAMPLES})"
        )
        return
    if np.unique(used).size <= 2:
        report.verdict = (
            f"no fit: the error does not change with the seed (uses {report.max_used:.3g} "
            "of the bound in every run)"
        )
        return
    try:
        est = _fit.estimate(used, target, bootstrap=bootstrap, seed=seed)
    except ValueError as exc:
        report.verdict = f"no fit: {exc}"
        return
    high = est.high if math.isfinite(est.high) else est.value
    factor = max(high, est.value, report.max_used)
    report.status = "fitted"
    report.estimate, report.low, report.high = est.value, est.low, est.high
    report.shape = est.fit.fitted_shape
    report.shape_floored = est.fit.floored
    report.factor = factor
    report.p_fail_current = est.fit.sf(1.0)
    report.proposed_rtol = round_up(report.rtol * factor)
    report.proposed_atol = round_up(report.atol * factor)
    if est.value > 1:
        report.verdict = f"too tight: expect 1 failure in {_fmt_k(report.p_fail_current)} runs"
    elif factor <= 0.5:
        report.verdict = f"too loose by {1 / factor:.3g}x"
    elif factor > 1:
        # The fit says the bound holds at the target rate, its interval does not rule out
        # that it fails more often: neither tighten nor loosen on this evidence.
        report.verdict = (
            f"about right (the interval reaches {factor:.3g}x the bound: more runs would narrow it)"
        )
    else:
        report.verdict = "about right"


def overrides_for(reports: Iterable[SiteReport]) -> dict[str, dict[str, float]]:
    """The ``$HARNESS_TOLERANCE_OVERRIDES`` content that puts every proposal in force: the
    proposed ``rtol``/``atol`` where the site's bound is one (given) pair, else the site's own
    bound times the factor (per-dtype defaults, bounds that vary, ``assert_within``)."""
    out: dict[str, dict[str, float]] = {}
    for r in reports:
        if r.factor is None or r.proposed_rtol is None or r.proposed_atol is None:
            continue
        if r.kind == "within" or r.bounds_vary or r.bound != "given":
            out[r.site] = {"scale": r.factor}
        else:
            out[r.site] = {"rtol": r.proposed_rtol, "atol": r.proposed_atol}
    return out


# --------------------------------------------------------------------------- running


def function_ids(nodeids: Sequence[str]) -> list[str]:
    """Node ids without their parameters: ``--harness-repeat`` adds one to every test, so a
    parametrized id as given would match nothing (every parametrization of the test runs)."""
    out = []
    for nodeid in nodeids:
        base = re.sub(r"\[.*\]$", "", nodeid)
        if base not in out:
            out.append(base)
    return out


HOLDOUT_STREAM = 0x686F6C64
"""Mixed into ``--seed`` for the held-out sweep's base seeds (``"hold"``), so that no
``--seed K``'s held-out stream is another ``--seed``'s fit stream: held-out sweeps split over
processes or machines under distinct seeds never reuse a seed any of them fitted on."""


def sweep_seeds(seed: int, processes: int, *, holdout: bool = False) -> list[int]:
    """The base seeds of a sweep's ``processes`` pytest processes: distinct, drawn from
    ``seed`` (the fit's stream) or, with ``holdout``, from the held-out stream of ``seed``."""
    rng = np.random.default_rng([seed, HOLDOUT_STREAM] if holdout else seed)
    return [int(s) for s in rng.choice(2**32, size=processes, replace=False)]


def run_sweep(
    root: Path,
    nodeids: Sequence[str],
    records: Path,
    *,
    runs: int,
    per_process: int,
    seed: int,
    holdout: bool = False,
    jobs: int = 1,
    on_process: Callable[[int, int], None] | None = None,
    extra_env: dict[str, str] | None = None,
    timeout_s: float = 3600,
) -> tuple[list[int], list[int]]:
    """Run ``nodeids`` ``runs`` times (``per_process`` per pytest process, each process under
    its own base seed from :func:`sweep_seeds`), ``jobs`` processes at a time, appending their
    check errors to ``records`` (under a lock: the processes share the file).

    The seeds, and so the records, do not depend on ``jobs``, only their order in the file.
    With ``jobs > 1`` each process gets ``OMP_NUM_THREADS=1`` unless it is set (``jobs``
    processes each starting a thread per core would oversubscribe the machine).

    Returns the base seeds used and those whose pytest reported a failure (exit 1: a check
    over its bound, or any other failure, which the records alone would not show). A process
    that did not run tests (exit status >= 2: usage or collection error, interrupted) raises
    :class:`ProposeError` with its output's tail (the processes already started finish first).
    """
    procs = math.ceil(runs / per_process)
    seeds = sweep_seeds(seed, procs, holdout=holdout)
    counts = [min(per_process, runs - i * per_process) for i in range(procs)]
    env = {**os.environ, **(extra_env or {})}
    env.pop("PYTEST_ADDOPTS", None)
    if jobs > 1:
        env.setdefault("OMP_NUM_THREADS", "1")

    def one(base: int, k: int) -> subprocess.CompletedProcess[str]:
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--harness-seed={base}",
            f"--harness-record-errors={records}",
            f"--harness-repeat={k}",
            "--harness-deterministic=off",
            *function_ids(nodeids),
        ]
        try:
            return subprocess.run(
                cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            raise ProposeError(f"pytest under base seed {base} ran past {timeout_s:g} s") from None

    done = 0
    failed: list[int] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {
            pool.submit(one, base, k): (base, k) for base, k in zip(seeds, counts, strict=True)
        }
        try:
            for i, future in enumerate(concurrent.futures.as_completed(futures)):
                base, k = futures[future]
                proc = future.result()
                if proc.returncode not in (0, 1):
                    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
                    raise ProposeError(
                        f"pytest exited {proc.returncode} under base seed {base} (no tests "
                        f"run, or a usage/collection error):\n{tail}"
                    )
                if proc.returncode == 1:
                    failed.append(base)
                done += k
                if on_process is not None:
                    on_process(i + 1, done)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    order = {base: i for i, base in enumerate(seeds)}
    return seeds, sorted(failed, key=order.__getitem__)


# --------------------------------------------------------------------------- held-out


@dataclasses.dataclass
class Holdout:
    """The held-out check of one site: ``over`` of ``runs`` fresh samples exceeded the bound
    checked (``bound``: ``"proposed"``, the current bound times ``factor``, or ``"current"``
    where nothing was proposed); ``expected`` = ``runs`` x the target rate and ``p`` the
    binomial probability of at least ``over`` failures at that rate (small: the bound fails
    more often than predicted). ``skipped``: fresh samples recorded under a bound that is no
    multiple of the fitted one (not comparable, not counted)."""

    over: int
    runs: int
    bound: str
    factor: float
    expected: float
    p: float
    skipped: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _sample_key(record: dict[str, Any]) -> tuple[str, str, Any]:
    return (str(record["test"]), str(record["site"]), record.get("seed"))


def holdout_check(
    reports: Iterable[SiteReport],
    fresh: Sequence[dict[str, Any]],
    target: float,
    *,
    fitted: Iterable[dict[str, Any]] = (),
) -> tuple[dict[str, Holdout], list[str]]:
    """Per site, the fresh samples over its proposed bound (the current one where none was
    proposed: an exact check must stay exact), and notes about the data.

    The share of a bound scaled by ``F`` used is the current share divided by ``F``, so no
    rerun is needed per proposal. A fresh sample recorded under another bound than the fit's
    (the site's bound was changed in between, or records merged from several checkouts) is
    rescaled where that bound is a multiple of the fit's, else skipped. Samples recorded
    twice (the same test, site and seed: one file merged twice, or overlapping seed streams)
    count once, said in the notes; a fresh sample whose seed the fit used is not held out:
    :class:`ProposeError`.
    """
    from scipy.stats import binom

    notes: list[str] = []
    seen: set[tuple[str, str, Any]] = set()
    unique = []
    for record in fresh:
        key = _sample_key(record)
        if key[2] is not None and key in seen:
            continue
        seen.add(key)
        unique.append(record)
    dropped = len(fresh) - len(unique)
    fresh = unique
    if dropped:
        notes.append(
            f"{dropped} held-out sample(s) recorded twice (the same test, site and seed: a file "
            "merged twice, or sweeps under the same --seed) counted once"
        )
    fit_keys = {_sample_key(r) for r in fitted if r.get("seed") is not None}
    shared = [r for r in fresh if _sample_key(r) in fit_keys]
    if shared:
        raise ProposeError(
            f"{len(shared)} held-out sample(s) used a seed the fit used (e.g. "
            f"{shared[0]['test']} under seed {shared[0]['seed']}): not held out; sweep the "
            "held-out seeds under another --seed"
        )
    out: dict[str, Holdout] = {}
    for report in reports:
        factor = report.factor if report.factor is not None else 1.0
        over = runs = skipped = 0
        for record in fresh:
            if record["site"] != report.site:
                continue
            scale = _bound_scale(report, record)
            if scale is None:
                skipped += 1
                continue
            runs += 1
            used = float(record["max_used"])
            over += bool(used * scale > factor or math.isnan(used))
        if not runs and not skipped:
            continue
        expected = runs * target
        out[report.site] = Holdout(
            over=over,
            runs=runs,
            bound="proposed" if report.factor is not None else "current",
            factor=factor,
            expected=expected,
            p=float(binom.sf(over - 1, runs, target)) if over else 1.0,
            skipped=skipped,
        )
        if skipped:
            notes.append(
                f"{report.site}: {skipped} held-out sample(s) recorded under a bound that is "
                "no multiple of the fitted one: not counted"
            )
    return out, notes


def _bound_scale(report: SiteReport, record: dict[str, Any]) -> float | None:
    """What a share of ``record``'s bound is in shares of ``report``'s: 1 for the same bound
    (and for a site whose bound varies from call to call: the share is of each call's own
    bound, the same formula), the ratio where one is a multiple of the other, None else."""
    if report.bounds_vary or record.get("bounds_vary"):
        return 1.0
    rtol, atol = float(record["rtol"]), float(record["atol"])
    if (rtol, atol) == (report.rtol, report.atol):
        return 1.0
    ratios = set()
    for mine, theirs in ((report.rtol, rtol), (report.atol, atol)):
        if mine == 0 or theirs == 0:
            if mine != theirs:
                return None
            continue
        ratios.add(theirs / mine)
    if not ratios or max(ratios) > min(ratios) * (1 + 1e-9):
        return None
    return min(ratios)


# --------------------------------------------------------------------------- --write


def patch_for(root: Path, report: SiteReport) -> tuple[str | None, str]:
    """``(unified diff, note)`` changing the ``rtol=``/``atol=`` literals of the call at the
    site to the proposed bound; ``(None, why not)`` when they are not literals there."""
    if report.proposed_rtol is None or report.proposed_atol is None:
        return None, "no proposal"
    path_text, _, line_text = report.site.rpartition(":")
    path = root / path_text
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError) as exc:
        return None, f"cannot read {path_text}: {exc}"
    line = int(line_text)
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and node.lineno <= line <= (node.end_lineno or node.lineno)
        and {kw.arg for kw in node.keywords} >= {"rtol", "atol"}
    ]
    if report.kind == "within":
        return _patch_within(tree, source, path_text, line, report)
    if not calls:
        return None, "the bound is not given as rtol=/atol= at the call (a default or **kwargs)"
    call = min(calls, key=lambda c: (c.end_lineno or c.lineno) - c.lineno)
    edits: list[tuple[ast.expr, str]] = []
    for kw in call.keywords:
        if kw.arg not in ("rtol", "atol"):
            continue
        node = kw.value
        if not (isinstance(node, ast.Constant) and isinstance(node.value, int | float)):
            return None, f"{kw.arg}= is an expression, not a literal: change it where it is set"
        new = report.proposed_rtol if kw.arg == "rtol" else report.proposed_atol
        edits.append((node, repr(float(new)) if new else "0.0"))
    return _apply(source, path_text, edits, report)


def _patch_within(
    tree: ast.AST, source: str, path_text: str, line: int, report: SiteReport
) -> tuple[str | None, str]:
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and node.lineno <= line <= (node.end_lineno or node.lineno)
        and len(node.args) >= 2
    ]
    if not calls:
        return None, "no assert_within(error, bound) call found at the site"
    call = min(calls, key=lambda c: (c.end_lineno or c.lineno) - c.lineno)
    node = call.args[1]
    if not (isinstance(node, ast.Constant) and isinstance(node.value, int | float)):
        return None, "the bound is an expression, not a literal: change it where it is set"
    assert report.proposed_atol is not None
    return _apply(source, path_text, [(node, repr(float(report.proposed_atol)))], report)


def _apply(
    source: str, path_text: str, edits: list[tuple[ast.expr, str]], report: SiteReport
) -> tuple[str | None, str]:
    lines = source.splitlines(keepends=True)
    new_lines = list(lines)
    for node, text in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        if node.lineno != node.end_lineno:
            return None, "a literal spread over lines"
        i = node.lineno - 1
        row = new_lines[i].encode()
        start, end = node.col_offset, node.end_col_offset or node.col_offset
        new_lines[i] = (row[:start] + text.encode() + row[end:]).decode()
    if new_lines == lines:
        return None, "already the proposed bound"
    diff = "".join(
        difflib.unified_diff(lines, new_lines, fromfile=f"a/{path_text}", tofile=f"b/{path_text}")
    )
    return diff, f"rtol {report.rtol:g} -> {report.proposed_rtol}, atol {report.atol:g} -> " + (
        f"{report.proposed_atol}"
    )
