"""The gate measures itself: A/A runs and injected slowdowns under the machine's current noise.

``harness perf calibrate`` runs, per timing benchmark and for ``trials`` trials, the gate's own
A/B measurement (ab.py: fresh process pairs, sequential sampling, the verdict at ``factor``)
of the working tree against itself (A/A: whatever it finds is noise), and again with the head
side doing a known fraction more work per sample (the worker spins that fraction of the
sample's CPU time inside the timed region: an injected slowdown of 2%, 5%, 10%, 25%). It
records per benchmark, in ``.asv/calibration/<machine>.json``:

- ``cv``: the spread of single samples (standard deviation / mean, A/A base side);
- ``block_cv``: the spread of the blocks' head/base ratios in A/A (what limits the gate: the
  difference between two fresh processes running identical code);
- ``pass_rate``: the fraction of A/A trials that exit 0 (unchanged or improved), and
  ``false_alarm_rate``: the fraction read "regressed";
- ``caught``: per injected slowdown, the fraction of trials read "regressed";
  ``smallest_caught``: the smallest slowdown caught in >= 95% of trials (None: none was).

The gate reads the file (:func:`check_factor_supported`) and refuses, naming the benchmark and
the record, a factor at which a calibration found unchanged code failing more than 5% of
trials, instead of gating on a threshold the benchmark cannot support.

The measurement is an argument (:data:`Measure`), so that tests drive this with synthetic
samples; the command line passes ab.measure_ab.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from harness import atomic
from harness.perf._common import PerfError, Project, check_factor
from harness.perf.ab import ABResult
from harness.perf.sequential import ab_strata

DEFAULT_SLOWDOWNS = (0.02, 0.05, 0.10, 0.25)
DEFAULT_TRIALS = 20
# What "caught" and "passes" mean: in at least this fraction of trials (19 of 20).
REQUIRED_RATE = 0.95

Measure = Callable[[Sequence[str], float], dict[str, ABResult]]
"""measure(names, extra): one A/B trial of each benchmark, head doing ``extra`` more work."""
Progress = Callable[[str], None]


@dataclasses.dataclass
class BenchmarkCalibration:
    """One benchmark's record (the module docstring says what each field is)."""

    name: str
    trials: int
    cv: float | None
    block_cv: float | None
    pass_rate: float
    false_alarm_rate: float
    undecided_rate: float
    caught: dict[str, float]
    smallest_caught: float | None
    errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def supports_factor(self) -> bool:
        return self.pass_rate >= REQUIRED_RATE


def check_slowdowns(values: Iterable[float]) -> tuple[float, ...]:
    """Fractions of extra work, each > 0 and <= 10, sorted; a PerfError naming a bad one."""
    out = []
    for v in values:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 < v <= 10):
            raise PerfError(
                f"--slowdown {v!r} is not a fraction of extra work: give a number > 0 and "
                "<= 10 (0.05 is 5% more work)"
            )
        out.append(float(v))
    if not out:
        raise PerfError("--slowdown: give at least one fraction of extra work (e.g. 0.05)")
    return tuple(sorted(set(out)))


def calibrate(
    names: Sequence[str],
    measure: Measure,
    *,
    factor: float,
    trials: int = DEFAULT_TRIALS,
    slowdowns: Sequence[float] = DEFAULT_SLOWDOWNS,
    progress: Progress | None = None,
) -> list[BenchmarkCalibration]:
    """Run ``trials`` A/A trials and ``trials`` trials per slowdown of every benchmark in names
    (trial by trial, so that a load change spreads over all levels) and summarize them."""
    check_factor(factor)
    if trials < 1:
        raise PerfError(f"--trials must be >= 1, got {trials}")
    if not names:
        raise PerfError("no timing benchmark to calibrate (check --bench and --group)")
    levels = (0.0, *check_slowdowns(slowdowns))
    verdicts: dict[str, dict[float, list[str]]] = {n: {lv: [] for lv in levels} for n in names}
    aa: dict[str, list[ABResult]] = {n: [] for n in names}
    errors: dict[str, list[str]] = {n: [] for n in names}
    for trial in range(trials):
        for level in levels:
            if progress:
                progress(f"trial {trial + 1}/{trials}, extra work {level:.0%}")
            found = measure(names, level)
            for name in names:
                result = found.get(name)
                if result is None or result.error or result.comparison is None:
                    why = "not measured" if result is None else result.error or "no verdict"
                    errors[name].append(f"trial {trial + 1}, +{level:.0%}: {why}")
                    verdicts[name][level].append("error")
                    continue
                # The verdict the gate would act on: a `regressed` reading confirmed or not by
                # independent re-measurements (decision.settle).
                verdicts[name][level].append(str(result.settled() or result.comparison.verdict))
                if level == 0.0:
                    aa[name].append(result)
    return [_summary(n, trials, verdicts[n], aa[n], errors[n]) for n in names]


def shard(names: Sequence[str], spec: str) -> list[str]:
    """The K-th of N shards (spec "K/N", 0 <= K < N) of names in sorted order: every N-th name
    from the K-th, so that N runs (nightly.yml: one a night) calibrate each name once."""
    k_text, sep, n_text = spec.partition("/")
    try:
        k, n = int(k_text), int(n_text)
    except ValueError:
        k, n = -1, 0
    if not sep or n < 1 or not 0 <= k < n:
        raise PerfError(f"--shard must be K/N with 0 <= K < N (e.g. 3/12), got {spec!r}")
    return sorted(names)[k::n]


def _rate(verdicts: list[str], *wanted: str) -> float:
    return sum(v in wanted for v in verdicts) / len(verdicts) if verdicts else 0.0


def _summary(
    name: str,
    trials: int,
    verdicts: dict[float, list[str]],
    aa: list[ABResult],
    errors: list[str],
) -> BenchmarkCalibration:
    base = [x for r in aa for x in r.base]
    cv = statistics.stdev(base) / statistics.mean(base) if len(base) > 1 else None
    block_logs = []
    for r in aa:
        for b, h in ab_strata(r.base, r.head):
            logs = [math.log(y / x) for x, y in zip(b, h, strict=False) if x > 0 and y > 0]
            if logs:
                block_logs.append(statistics.median(logs))
    block_cv = statistics.stdev(block_logs) if len(block_logs) > 1 else None
    caught = {f"{level:g}": _rate(v, "regressed") for level, v in sorted(verdicts.items()) if level}
    smallest = next((float(level) for level, rate in caught.items() if rate >= REQUIRED_RATE), None)
    return BenchmarkCalibration(
        name=name,
        trials=trials,
        cv=cv,
        block_cv=block_cv,
        pass_rate=_rate(verdicts[0.0], "unchanged", "improved"),
        false_alarm_rate=_rate(verdicts[0.0], "regressed"),
        undecided_rate=_rate(verdicts[0.0], "undecided"),
        caught=caught,
        smallest_caught=smallest,
        errors=errors,
    )


# --------------------------------------------------------------------------------------------
# The record the gate reads


def calibration_path(project: Project, machine: str) -> Path:
    return project.state_dir / "calibration" / f"{machine}.json"


def save(
    project: Project,
    machine: str,
    factor: float,
    found: list[BenchmarkCalibration],
    *,
    env: str,
    slowdowns: Sequence[float],
    load: tuple[float, float, float] | None = None,
) -> Path:
    """Write (merge) this calibration into the machine's file, keyed by factor, then name."""
    path = calibration_path(project, machine)
    data = read(project, machine)
    entry = data.setdefault("factors", {}).setdefault(f"{factor:g}", {})
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = load if load is not None else os.getloadavg()
    for record in found:
        entry[record.name] = dataclasses.asdict(record) | {
            "measured_at": when,
            "load": [round(x, 2) for x in load],
            "env": env,
            "slowdowns": list(slowdowns),
        }
    data["machine"] = machine
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def read(project: Project, machine: str) -> dict[str, Any]:
    """The machine's calibration file ({} when there is none); a PerfError naming a damaged one
    (never read as "no calibration": that would gate at a factor it refused)."""
    path = calibration_path(project, machine)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("factors", {}), dict):
            raise ValueError("not an object with a 'factors' object")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise PerfError(
            f"the calibration file {path} cannot be read ({exc}); delete it and run "
            "`harness perf calibrate` again"
        ) from None
    return data


def check_factor_supported(
    project: Project, machine: str, factor: float, names: Iterable[str]
) -> None:
    """A PerfError when a calibration at this factor or a larger one found unchanged code of
    one of names failing (regressed or undecided) in more than 5% of trials: a smaller factor
    is harder still, so the gate would be guessing."""
    factors = read(project, machine).get("factors", {})
    refused = []
    for name in names:
        for key, records in sorted(factors.items(), key=lambda kv: float(kv[0])):
            record = records.get(name) if isinstance(records, dict) else None
            if not record or float(key) < factor:
                continue
            if float(record.get("pass_rate", 0.0)) < REQUIRED_RATE:
                supported = [
                    float(k)
                    for k, r in factors.items()
                    if isinstance(r, dict)
                    and name in r
                    and float(r[name].get("pass_rate", 0.0)) >= REQUIRED_RATE
                ]
                hint = (
                    f"it passed at factor {min(supported):g}"
                    if supported
                    else "calibrate a larger factor to find one it supports"
                )
                refused.append(
                    f"`{name}`: calibrated at factor {key} on {record.get('measured_at')} "
                    f"(load {record.get('load')}), unchanged code passed in only "
                    f"{record.get('pass_rate', 0.0):.0%} of {record.get('trials')} trials "
                    f"(false alarms {record.get('false_alarm_rate', 0.0):.0%}); {hint}"
                )
                break
    if refused:
        raise PerfError(
            f"factor {factor:g} refused: the calibration ({calibration_path(project, machine)}) "
            "says these benchmarks cannot support it: "
            + "; ".join(refused)
            + ". Gate at a factor they support (--factor), leave them out (--bench), or "
            "calibrate again if the machine changed."
        )
