"""Recording how close each numeric check comes to its bound, per call site.

The pytest plugin's ``--harness-record-errors[=FILE]`` installs a :class:`CheckRecorder` as the
observer of :func:`harness.tolerances.assert_close` (and of ``golden.check``). For every check
it finds the call site (the first frame outside the ``harness`` package: the test's line, or
the line of a helper in the test file), measures the errors against the bound the check uses,
and keeps the worst per ``(test, site)``. When the test finishes it appends one JSON line per
site to FILE::

    {"test": "suites/unit/test_x.py::test_y", "nodeid": "...::test_y[repeat3]",
     "site": "suites/unit/test_x.py:42", "function": "test_y", "kind": "assert_close",
     "calls": 3, "max_abs": 2.1e-07, "max_rel": 3.4e-07, "max_used": 0.021,
     "rtol": 1e-05, "atol": 1e-06, "dtype": "float32", "bound": "given",
     "bounds_vary": false, "seed": 123, "base_seed": 7, "overridden": false}

``max_used`` is the error at the bound's own metric: the largest ``|a - e| / (atol + rtol
|e|)`` over every element of every call at the site, so a check fails exactly when it is
above 1 (an infinity when a NaN or infinity did not match, or the bound is 0 and the values
differ). Appends take an exclusive ``flock`` on FILE, so xdist workers write one file.

``harness.assert_within(err, bound)`` checks (an elementwise bound computed by the test, such as
a rounding-error bound, or a ``rel_error`` against a per-dtype constant) are recorded the same
way, with ``max_used = max(err / bound)`` and the bound's largest value as ``atol``.

``$HARNESS_TOLERANCE_OVERRIDES`` names a JSON file ``{"suites/x.py:42": {"rtol": r, "atol":
a}, "suites/y.py:7": {"scale": f}}``: the checks at those sites use that bound (or their own
bound times ``f``) instead of their own (how ``harness tolerances propose --mutants`` runs the
tests with a proposed bound without editing them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

import harness
from harness import tolerances as _tol

__all__ = [
    "OVERRIDES_ENV",
    "CheckRecorder",
    "Override",
    "OverrideError",
    "SiteStats",
    "base_test_id",
    "error_stats",
    "load_overrides",
]

OVERRIDES_ENV = "HARNESS_TOLERANCE_OVERRIDES"

_HARNESS_DIR = str(Path(harness.__file__).resolve().parent) + os.sep
_REPEAT_ID = re.compile(r"(?<=[\[-])repeat\d+(?=[\]-])")


class OverrideError(ValueError):
    """The overrides file cannot be read or holds something other than site -> bound."""


def base_test_id(nodeid: str) -> str:
    """``nodeid`` without the ``repeatN`` parameter ``--harness-repeat`` adds."""
    out = _REPEAT_ID.sub("", nodeid)
    return out.replace("--", "-").replace("[-", "[").replace("-]", "]").replace("[]", "")


@dataclasses.dataclass
class SiteStats:
    """The worst a check site came to its bound within one test run."""

    kind: str
    function: str
    calls: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_used: float = 0.0
    rtol: float = 0.0
    atol: float = 0.0
    dtype: str = ""
    bound: str = ""
    bounds: set[tuple[float, float]] = dataclasses.field(default_factory=set)
    overridden: bool = False


def _inexact(x: np.ndarray) -> np.ndarray:
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64, copy=False)


def _leaf_stats(
    a: np.ndarray, e: np.ndarray, rtol: float, atol: float
) -> tuple[float, float, float]:
    """``(max |a-e|, max |a-e|/|e|, max |a-e| / (atol + rtol |e|))`` over matching finite
    elements; a non-matching NaN or infinity makes the last one inf."""
    a, e = _inexact(a), _inexact(e)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        equal = (a == e) | (np.isnan(a) & np.isnan(e))
        finite = np.isfinite(a) & np.isfinite(e)
        if bool((~equal & ~finite).any()):
            return math.inf, math.inf, math.inf
        diff = np.where(equal, 0.0, np.abs(a - e))
        mag = np.abs(e)
        rel = np.where(diff == 0, 0.0, diff / mag)
        allowed = atol + rtol * mag
        used = np.where(diff == 0, 0.0, diff / allowed)
    if diff.size == 0:
        return 0.0, 0.0, 0.0
    return float(diff.max()), float(rel.max()), float(used.max())


def error_stats(
    actual: Any, expected: Any, rtol: float | None, atol: float | None, check_dtype: bool
) -> dict[str, Any] | None:
    """Errors of one ``assert_close(actual, expected, ...)`` against the bound it uses, over
    every leaf; None where the structures or shapes differ (the check itself reports those)."""
    out: dict[str, Any] = {"max_abs": 0.0, "max_rel": 0.0, "max_used": 0.0}
    worst: tuple[float, float, float, str, str] | None = None

    def walk(a: Any, e: Any) -> bool:
        nonlocal worst
        kind = _tol._kind(a, "actual")
        if kind != _tol._kind(e, "expected"):
            return False
        if kind == "none":
            return True
        if kind == "mapping":
            return set(a) == set(e) and all(walk(a[k], e[k]) for k in e)
        if kind == "sequence":
            return len(a) == len(e) and all(walk(x, y) for x, y in zip(a, e, strict=True))
        (av, ad), (ev, ed) = _tol._to_leaf(a, "actual"), _tol._to_leaf(e, "expected")
        if av.shape != ev.shape:
            return False
        r, t, source = _tol._tolerances(ad, ed, rtol, atol)
        abs_err, rel_err, used = _leaf_stats(av, ev, r, t)
        out["max_abs"] = max(out["max_abs"], abs_err)
        out["max_rel"] = max(out["max_rel"], rel_err)
        if worst is None or used > worst[0]:
            worst = (used, r, t, ed, source)
        return True

    try:
        if not walk(actual, expected) or worst is None:
            return None
    except (TypeError, ValueError):
        return None
    out["max_used"], out["rtol"], out["atol"], out["dtype"], out["bound"] = worst
    return out


@dataclasses.dataclass(frozen=True)
class Override:
    """A site's bound replaced: ``(rtol, atol)`` given, or the site's own times ``scale``."""

    rtol: float | None = None
    atol: float | None = None
    scale: float | None = None

    def bound(self, rtol: float, atol: float) -> tuple[float, float]:
        if self.scale is not None:
            return rtol * self.scale, atol * self.scale
        assert self.rtol is not None and self.atol is not None
        return self.rtol, self.atol


def load_overrides(path: Path) -> dict[str, Override]:
    """Read an overrides file (see the module docstring); raises :class:`OverrideError`."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise OverrideError(f"${OVERRIDES_ENV}={path}: cannot be read as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise OverrideError(f"${OVERRIDES_ENV}={path}: expected an object of site -> bound")
    out = {}
    for site, bound in data.items():
        ok = isinstance(bound, dict) and set(bound) in ({"rtol", "atol"}, {"scale"})
        values = list(bound.values()) if ok else []
        if not ok or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values
        ):
            raise OverrideError(
                f"${OVERRIDES_ENV}={path}: site {site!r} needs {{'rtol': r, 'atol': a}} or "
                f"{{'scale': f}} with numbers >= 0, got {bound!r}"
            )
        if not re.fullmatch(r".+:\d+", site):
            raise OverrideError(f"${OVERRIDES_ENV}={path}: {site!r} is not PATH:LINE")
        out[site] = (
            Override(scale=float(bound["scale"]))
            if "scale" in bound
            else Override(rtol=float(bound["rtol"]), atol=float(bound["atol"]))
        )
    return out


class CheckRecorder:
    """The observer the plugin installs: keeps each site's worst per test run, appends JSON
    lines at the end of the test (:meth:`flush`)."""

    def __init__(
        self,
        path: Path | None,
        rootpath: Path,
        base_seed: int,
        overrides: dict[str, Override] | None = None,
    ) -> None:
        self.path = path
        self.root = str(rootpath.resolve()) + os.sep
        self.base_seed = base_seed
        self.overrides = overrides or {}
        self.nodeid: str | None = None
        self.seed: int | None = None
        self.sites: dict[str, SiteStats] = {}

    def start(self, nodeid: str, seed: int) -> None:
        self.nodeid, self.seed, self.sites = nodeid, seed, {}

    def _site(self) -> tuple[str, str]:
        frame = sys._getframe(2)
        while frame.f_back is not None and frame.f_code.co_filename.startswith(_HARNESS_DIR):
            frame = frame.f_back
        filename = frame.f_code.co_filename
        if filename.startswith(self.root):
            filename = filename[len(self.root) :]
        return f"{Path(filename).as_posix()}:{frame.f_lineno}", frame.f_code.co_name

    def __call__(
        self,
        kind: str,
        actual: Any,
        expected: Any,
        rtol: float | None,
        atol: float | None,
        check_dtype: bool,
    ) -> tuple[float, float] | None:
        site, function = self._site()
        override = self.overrides.get(site)
        if kind == "within":
            return self._within(site, function, actual, expected, override)
        given: tuple[float, float] | None = None
        if override is not None:
            if override.scale is None:
                given = rtol, atol = override.bound(0.0, 0.0)
            else:
                # The bound in force times the scale; a per-dtype default is resolved on the
                # worst leaf (one dtype in all but mixed structures).
                first = error_stats(actual, expected, rtol, atol, check_dtype)
                if first is not None:
                    given = rtol, atol = override.bound(first["rtol"], first["atol"])
        if self.nodeid is None or self.path is None:
            return given  # outside a test (collection), or overriding only
        stats = error_stats(actual, expected, rtol, atol, check_dtype)
        if stats is None:
            return given
        self._add(site, function, kind, stats, override is not None)
        return given

    def _within(
        self, site: str, function: str, err: Any, bound: Any, override: Override | None
    ) -> tuple[float, float] | None:
        scale = 1.0
        if override is not None:
            scale = override.scale if override.scale is not None else 1.0
        if self.nodeid is not None and self.path is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                e = np.asarray(err, dtype=np.float64)
                b = np.broadcast_to(np.asarray(bound, dtype=np.float64) * scale, e.shape)
                used = np.where(e == 0, 0.0, e / b)
                used = np.where(np.isnan(used), np.inf, used)
            peak = float(np.max(b, initial=0.0))
            stats = {
                "max_abs": float(np.max(e, initial=0.0)),
                "max_rel": 0.0,
                "max_used": float(np.max(used, initial=0.0)),
                "rtol": 0.0,
                "atol": peak,
                "dtype": "",
                "bound": "assert_within",
            }
            self._add(site, function, "within", stats, override is not None)
        return None if override is None else (0.0, scale)

    def _add(
        self, site: str, function: str, kind: str, stats: dict[str, Any], overridden: bool
    ) -> None:
        entry = self.sites.setdefault(site, SiteStats(kind=kind, function=function))
        entry.calls += 1
        entry.max_abs = max(entry.max_abs, stats["max_abs"])
        entry.max_rel = max(entry.max_rel, stats["max_rel"])
        entry.bounds.add((stats["rtol"], stats["atol"]))
        entry.overridden = entry.overridden or overridden
        if entry.calls == 1 or stats["max_used"] > entry.max_used:
            entry.max_used = stats["max_used"]
            entry.rtol, entry.atol = stats["rtol"], stats["atol"]
            entry.dtype, entry.bound = stats["dtype"], stats["bound"]

    def flush(self) -> None:
        """Append this test's sites to the file (under an exclusive lock) and forget them."""
        sites, nodeid, self.sites, self.nodeid = self.sites, self.nodeid, {}, None
        if not sites or self.path is None or nodeid is None:
            return
        lines = []
        for site, s in sites.items():
            record = {
                "test": base_test_id(nodeid),
                "nodeid": nodeid,
                "site": site,
                "function": s.function,
                "kind": s.kind,
                "calls": s.calls,
                "max_abs": s.max_abs,
                "max_rel": s.max_rel,
                "max_used": s.max_used,
                "rtol": s.rtol,
                "atol": s.atol,
                "dtype": s.dtype,
                "bound": s.bound,
                "bounds_vary": len(s.bounds) > 1,
                "seed": self.seed,
                "base_seed": self.base_seed,
                "overridden": s.overridden,
            }
            lines.append(json.dumps(record) + "\n")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                fh.write("".join(lines))
                fh.flush()
            finally:
                with contextlib.suppress(OSError):
                    fcntl.flock(fh, fcntl.LOCK_UN)
