"""Goldens: recorded reference numbers with a tolerance band, kept as reviewable text.

One JSON file per test module, mirroring the suites layout::

    suites/integration/test_training.py  ->  suites/goldens/integration/test_training.json

    {
      "test_twenty_steps_reach_the_golden_loss": {
        "final_loss": {"atol": 0.0, "rtol": 0.0001, "value": 0.6931471805599453}
      }
    }

A golden is a float or a list of floats (a loss curve). The band is stated by the test
(``rtol`` and ``atol``, both required) and recorded beside the value so a reviewer sees it.
Policy (the pytest ``golden`` fixture applies it):

- an existing value changes only with ``--harness-update-goldens``;
- a missing value is recorded on a developer's machine, and is a failure under CI, where
  recording would make the check vacuous;
- a non-finite value never matches and is never recorded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from harness import atomic

__all__ = ["GoldenError", "GoldenFile", "GoldenResult", "compare"]

Number = float | int
Value = Number | Sequence[Number]


class GoldenError(AssertionError):
    """A golden check failed: outside the band, missing under CI, or an unreadable file."""


@dataclass(frozen=True)
class GoldenResult:
    action: str  # "matched" | "recorded" | "updated"
    name: str
    value: float | list[float]


def _as_floats(name: str, value: object) -> float | list[float]:
    if isinstance(value, bool):
        raise TypeError(f"golden {name!r}: expected a number or a list of numbers, got a bool")
    if isinstance(value, (int, float)):
        return float(value)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 1) == 0:  # 0-d tensor or NumPy scalar
        return float(item())
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        value = tolist()
    if isinstance(value, Sequence) and not isinstance(value, str):
        out = []
        for v in value:
            f = _as_floats(name, v)
            if isinstance(f, list):
                raise TypeError(
                    f"golden {name!r}: expected a flat list of numbers, got nested lists"
                )
            out.append(f)
        return out
    raise TypeError(
        f"golden {name!r}: expected a number or a list of numbers, got {type(value).__name__}"
    )


def compare(
    name: str, value: float | list[float], golden: float | list[float], *, rtol: float, atol: float
) -> str | None:
    """None when ``value`` lies within ``atol + rtol * |golden|`` of ``golden`` everywhere,
    else a message saying where and by how much it does not."""
    values = value if isinstance(value, list) else [value]
    goldens = golden if isinstance(golden, list) else [golden]
    if isinstance(value, list) != isinstance(golden, list) or len(values) != len(goldens):

        def shape(v: object) -> str:
            return f"a list of {len(v)}" if isinstance(v, list) else "a scalar"

        return f"golden {name!r}: got {shape(value)}, recorded {shape(golden)}"
    worst = None
    bad = 0
    for i, (v, g) in enumerate(zip(values, goldens, strict=True)):
        allowed = atol + rtol * abs(g)
        diff = abs(v - g)
        if not (math.isfinite(v) and diff <= allowed):
            bad += 1
            excess = math.inf if not math.isfinite(diff) else diff - allowed
            if worst is None or excess > worst[0]:
                worst = (excess, i, v, g, diff, allowed)
    if worst is None:
        return None
    _, i, v, g, diff, allowed = worst
    at = f" at index {i}" if isinstance(value, list) else ""
    count = (
        f" ({bad} of {len(values)} elements outside the band)" if isinstance(value, list) else ""
    )
    return (
        f"golden {name!r}{at}: got {v!r}, recorded {g!r}; "
        f"|difference| {diff:.6g} > allowed {allowed:.6g} (rtol={rtol:g}, atol={atol:g}){count}"
    )


class GoldenFile:
    """The goldens of one test module. Loaded lazily; written atomically by :meth:`save`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._data: dict[str, dict[str, dict[str, Any]]] | None = None
        self._changed: dict[tuple[str, str], dict[str, Any]] = {}

    def _load(self) -> dict[str, dict[str, dict[str, Any]]]:
        if self._data is None:
            self._data = self._read()
        return self._data

    def _read(self) -> dict[str, dict[str, dict[str, Any]]]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise GoldenError(
                f"golden file {self.path} cannot be read ({exc}); fix it or delete it and "
                "re-record with --harness-update-goldens"
            ) from exc
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise GoldenError(f"golden file {self.path}: expected an object of objects per test")
        return data

    def get(self, test: str, name: str) -> dict[str, Any] | None:
        return self._load().get(test, {}).get(name)

    def check(
        self,
        test: str,
        name: str,
        value: object,
        *,
        rtol: float,
        atol: float,
        update: bool,
        ci: bool,
    ) -> GoldenResult:
        """Compare (or record) one golden. Raises :class:`GoldenError` on a failed check."""
        if not (rtol >= 0 and atol >= 0):
            raise ValueError(f"golden {name!r}: rtol and atol must be >= 0, got {rtol}, {atol}")
        floats = _as_floats(name, value)
        finite = all(math.isfinite(v) for v in (floats if isinstance(floats, list) else [floats]))
        if not finite:
            raise GoldenError(f"golden {name!r}: got a non-finite value {floats!r}; never recorded")
        entry = {"value": floats, "rtol": rtol, "atol": atol}
        recorded = self.get(test, name)
        if update:
            self._set(test, name, entry)
            return GoldenResult("updated" if recorded else "recorded", name, floats)
        if recorded is None:
            if ci:
                raise GoldenError(
                    f"golden {name!r} of {test} is missing from {self.path} and CI never records "
                    "goldens; run the test locally (it records missing goldens) or with "
                    "--harness-update-goldens, review the file and commit it"
                )
            self._set(test, name, entry)
            return GoldenResult("recorded", name, floats)
        stored = recorded.get("value")
        if not _is_golden_value(stored):
            raise GoldenError(
                f"golden {name!r} of {test} in {self.path} has no numeric 'value' (found "
                f"{stored!r}); fix the file or re-record it with --harness-update-goldens"
            )
        problem = compare(name, floats, stored, rtol=rtol, atol=atol)
        if problem:
            raise GoldenError(
                f"{problem}\n  recorded in {self.path} [{test!r}]; if the change is intended, "
                "rerun with --harness-update-goldens and commit the reviewed file"
            )
        return GoldenResult("matched", name, floats)

    def _set(self, test: str, name: str, entry: dict[str, Any]) -> None:
        self._load().setdefault(test, {})[name] = entry
        self._changed[(test, name)] = entry

    @property
    def dirty(self) -> bool:
        return bool(self._changed)

    def save(self) -> None:
        """Write changed entries, merged into the file as it is on disk now (another process,
        such as an xdist worker, may have written other tests' goldens since we read it)."""
        if not self._changed:
            return
        data = self._read()
        for (test, name), entry in self._changed.items():
            data.setdefault(test, {})[name] = entry
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        atomic.write_text(self.path, text)
        self._data = data
        self._changed.clear()


def _is_golden_value(value: object) -> TypeGuard[float | list[float]]:
    """A recorded value is a number or a list of numbers (bools are not numbers here)."""

    def number(v: object) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    return number(value) or (isinstance(value, list) and all(number(v) for v in value))
