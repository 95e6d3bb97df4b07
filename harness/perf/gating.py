"""The regression gate: base against head, benchmark by benchmark, exit 0, 1 or 2.

:func:`gate` reads the asv result files of two commits itself (``asv compare`` exits 0 whatever
it finds) and, for timing benchmarks, compares their samples pass by pass (results.py pairs
the passes) into one of four verdicts (decision.py: regressed, unchanged, improved, undecided,
from the confidence interval of the ratio and the factor). "Undecided", "nothing comparable"
and "too few samples to see a regression" are exit 2, never a pass. gate_report.py holds what
it returns (the rows, their statuses, the report's markdown and JSON); baselines.py picks the
base; step.py is the ``harness ci`` step around it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from harness.perf import decision, stats
from harness.perf._common import (
    Project,
    check_factor,
    env_name,
    resolve_commit,
    resolve_machine,
)
from harness.perf.calibrate import check_factor_supported
from harness.perf.gate_report import (
    EXIT_NOT_COMPARABLE,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_UNDECIDED,
    FAILING,
    GateReport,
    Row,
    RowStatus,
    _n,
)
from harness.perf.results import Measurement, load_passes, load_results
from harness.perf.sequential import AB_BLOCK, CPU_UNIT, GPU_UNIT, MIN_BLOCKS, judge_pairs

if TYPE_CHECKING:
    from harness.perf.ab import ABResult
    from harness.perf.counts import CountComparison

# The factor is the line between "unchanged" and "regressed" (decision.py): a benchmark
# regresses when the estimate of head/base reaches it and the slowdown is significant, and is
# unchanged only when the whole confidence interval stays below it. Noise no longer decides
# how low it can be (too much noise reads "undecided", exit 2, never a pass); what does is a
# systematic difference between two processes running identical code: 0.96-1.07 for interleaved
# CPU-time pairs before both workers got the same hash seed (docs/perf.md). 1.2 keeps that
# below the line with room; `harness perf calibrate` measures what each benchmark supports.
DEFAULT_FACTOR = 1.2


# --------------------------------------------------------------------------------------------
# The gate

# Benchmarks named track_info_* or time_info_* are shown with their ratio but never decide the
# exit code: a noisy derived number with no samples for the significance test, or a time that
# no A/B measurement can settle on a shared runner (I/O-bound, seconds per sample; the
# benchmarks' README.md says which and why).
INFORMATIONAL = re.compile(r"\.(?:track|time)_info_")


def _benchmark_info(project: Project) -> dict[str, tuple[str, str]]:
    """{benchmark name: (unit, type)} from asv's benchmarks.json (type: time, track, peakmem...)."""
    path = project.results_dir / "benchmarks.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {
        k: (str(v.get("unit", "")), str(v.get("type", "")))
        for k, v in data.items()
        if isinstance(v, dict)
    }


def has_results(
    root: Path | str, commit: str, *, machine: str | None = None, env: str | None = None
) -> bool:
    """Whether results for commit exist on machine (and in env, when given)."""
    project = Project.load(root)
    by_env = load_results(project, resolve_machine(machine), resolve_commit(project.root, commit))
    return bool(by_env.get(env)) if env else any(by_env.values())


def gate(
    root: Path | str,
    base: str,
    head: str,
    *,
    factor: float = DEFAULT_FACTOR,
    machine: str | None = None,
    base_results_dir: Path | None = None,
) -> GateReport:
    """Compare the results of two commits: exit 0 nothing regressed, 1 regression, 2 nothing
    comparable (or too few samples to see a regression). Never passes silently: every benchmark
    appears in the rows with its status.

    Timing benchmarks are compared pass by pass when both commits were measured in the same
    alternating run (stats.py; results.py keeps the pass records), pooled otherwise.
    base_results_dir: read the base's results from there (a stored baseline) instead of the
    project's results directory.
    """
    check_factor(factor)
    machine = resolve_machine(machine)
    project = Project.load(root)
    base_sha = resolve_commit(project.root, base)
    head_sha = resolve_commit(project.root, head)
    base_dir = base_results_dir or project.results_dir

    def report(code: int, rows: list[Row], problems: list[str]) -> GateReport:
        return GateReport(code, base_sha, head_sha, machine, factor, rows, problems)

    machines = sorted(p.parent.name for p in project.results_dir.glob("*/machine.json"))
    if machine not in machines:
        return report(
            EXIT_NOT_COMPARABLE,
            [],
            [
                f"no results for machine `{machine}` in {project.results_dir} "
                f"(machines with results: {', '.join(machines) or 'none'})"
            ],
        )
    base_results = load_results(project, machine, base_sha, results_dir=base_dir)
    head_results = load_results(project, machine, head_sha)
    problems = []
    for label, sha, found in (("base", base_sha, base_results), ("head", head_sha, head_results)):
        if not any(found.values()):
            problems.append(
                f"missing results: no results for {label} {sha[:10]} on machine "
                f"`{machine}` (run `harness perf run --commit {sha[:10]}`)"
            )
    if problems:
        return report(EXIT_NOT_COMPARABLE, [], problems)

    common_envs = sorted(set(base_results) & set(head_results))
    if not common_envs:
        return report(
            EXIT_NOT_COMPARABLE,
            [],
            [
                "environment-name mismatch: base ran in "
                f"{', '.join(f'`{e}`' for e in sorted(base_results))}, head in "
                f"{', '.join(f'`{e}`' for e in sorted(head_results))}. asv names an existing "
                "environment after the literal python path: run both with the same interpreter "
                f"path (this one is `{env_name()}`)"
            ],
        )
    for label, found in (("base", base_results), ("head", head_results)):
        for other in sorted(set(found) - set(common_envs)):
            problems.append(
                f"{label} also has results in environment `{other}`, which the "
                "other side lacks: not compared"
            )

    info = _benchmark_info(project)
    # A factor a calibration found these benchmarks cannot support is refused before any
    # verdict (calibrate.py): a PerfError, exit 2, naming them and the record.
    timing = {
        name
        for env in common_envs
        for name in set(base_results[env]) | set(head_results[env])
        if info.get(name.split("(", 1)[0], ("", ""))[1] in ("time", "")
    }
    check_factor_supported(project, machine, factor, sorted(timing))
    rows: list[Row] = []
    for env in common_envs:
        b_all, h_all = base_results[env], head_results[env]
        # Pass records exist only where both sides were measured into this results directory.
        b_passes = (
            load_passes(project, machine, base_sha, env, b_all)
            if base_dir == project.results_dir
            else {}
        )
        h_passes = load_passes(project, machine, head_sha, env, h_all)
        for name in sorted(set(b_all) | set(h_all)):
            unit, kind = info.get(name.split("(", 1)[0], (None, None))
            b, h = b_all.get(name), h_all.get(name)
            row = Row(
                name,
                env,
                RowStatus.UNCHANGED,  # a placeholder: every branch below sets the status
                b.value if b else None,
                h.value if h else None,
                unit,
                _count(b),
                _count(h),
                kind=kind,
            )
            if b is None:
                row.status = RowStatus.NEW_IN_HEAD
            elif h is None:
                row.status = RowStatus.MISSING_IN_HEAD
            elif b.version != h.version:
                row.status = RowStatus.CODE_CHANGED
            elif INFORMATIONAL.search(name) and not (h.value is None or b.value is None):
                row.status = RowStatus.INFORMATIONAL
                if not (_isnan(b.value) or _isnan(h.value)) and b.value:
                    row.ratio = h.value / b.value
            elif h.value is None:
                row.status = RowStatus.FAILED_IN_HEAD
            elif b.value is None:
                row.status = RowStatus.FAILED_IN_BASE
            elif _isnan(b.value) or _isnan(h.value):
                row.status = RowStatus.SKIPPED
            elif kind == "time" or (b.samples and h.samples):
                _compare_samples(row, b, h, b_passes.get(name), h_passes.get(name), factor)
            else:
                _compare_values(row, b.value, h.value, factor)
            rows.append(row)

    code, why = _decide(rows)
    gate_report = report(code, rows, problems + why)
    gate_report.context = problems
    return gate_report


def _decide(rows: list[Row]) -> tuple[int, list[str]]:
    """The exit code of a gate over rows, and the why of a non-zero code."""
    problems: list[str] = []
    too_few = [r for r in rows if r.status is RowStatus.TOO_FEW_SAMPLES]
    if too_few:
        problems.append(
            f"{len(too_few)} timing benchmark(s) have too few samples for the significance "
            f"test to ever reach p < {stats.ALPHA:g} (fewest: {_fewest(too_few)}): a 2x "
            "regression there would pass unseen. Measure with more samples (more --passes, "
            "or without --quick): at least 7 per side pooled, or 2 passes of 5; A/B pairs "
            f"need at least {MIN_BLOCKS * AB_BLOCK} ({MIN_BLOCKS} blocks of {AB_BLOCK}, each "
            "its own pair of processes)."
        )
    undecided = [r for r in rows if r.status is RowStatus.UNDECIDED]
    for r in undecided:
        problems.append(
            f"`{r.name}` is undecided at factor {r.factor_used:g}: ratio {r.ratio:.3g}, "
            f"interval [{_g(r.low)}, {_g(r.high)}] from {_n(r.n_base)} v {_n(r.n_head)} "
            f"samples; to decide it would need {r.would_need}"
        )
    if any(r.status in FAILING for r in rows):
        return EXIT_REGRESSION, problems
    if too_few:
        return EXIT_NOT_COMPARABLE, problems
    if undecided:
        return EXIT_UNDECIDED, problems
    if not any(r.comparable for r in rows):
        changed = sum(r.status is RowStatus.CODE_CHANGED for r in rows)
        problems.append(
            f"nothing comparable: {len(rows)} benchmark(s), {changed} with changed code, the "
            "rest skipped, failed, new or missing on one side"
        )
        return EXIT_NOT_COMPARABLE, problems
    return EXIT_OK, problems


def ab_candidates(report: GateReport) -> list[str]:
    """The timing benchmarks an interleaved A/B measurement can decide: measured on both sides
    with the same benchmark code, neither failed nor skipped (comparable, or too few samples)."""
    return [
        r.name
        for r in report.rows
        if r.kind == "time"
        and r.status is not RowStatus.INFORMATIONAL
        and (r.comparable or r.status is RowStatus.TOO_FEW_SAMPLES)
    ]


def apply_ab(
    report: GateReport, ab: Mapping[str, ABResult], *, method: str = "A/B pairs"
) -> GateReport:
    """The report with each timing row that has A/B pairs judged on those pairs instead.

    The pairs are grouped in blocks of consecutive pairs, each block a stratum
    (sequential.ab_strata): samples taken within a second or so of each other are
    interchangeable, while a load change between blocks shifts both sides alike. A failed A/B
    keeps the row's verdict from the asv runs and says why. method: how the report names the
    pairs ("A/B pairs": CPU time, ab.py; "GPU A/B pairs": CUDA events, gpu_ab.py).
    """
    rows = [dataclasses.replace(r) for r in report.rows]
    problems = list(report.context)
    for row in rows:
        result = ab.get(row.name)
        if result is None:
            continue
        row.ab_seconds = _add_seconds(row.ab_seconds, result)
        if result.error is not None or not result.base:
            problems.append(
                f"A/B of `{row.name}` failed ({result.error or 'no samples'}): judged on the "
                "asv runs' samples"
            )
            continue
        unit = GPU_UNIT if method.startswith("GPU") else CPU_UNIT
        _judge_ab(row, result, report.factor, unit)
        row.method = method
    code, why = _decide(rows)
    return dataclasses.replace(
        report, exit_code=code, rows=rows, problems=problems + why, context=problems
    )


def _add_seconds(so_far: float | None, result: ABResult) -> float | None:
    """so_far plus the wall seconds of result's measurements (ab_seconds: what a row's A/B
    cost); so_far when a measurement kept no time (a sampler that does not keep it)."""
    took = [m.seconds for m in result.measurements()]
    if any(t is None for t in took):
        return so_far
    return round((so_far or 0.0) + sum(t for t in took if t is not None), 1)


def _judge_ab(row: Row, result: ABResult, factor: float, unit: str = CPU_UNIT) -> None:
    """Judge row on its A/B measurements at factor: each one's blocks (judge_pairs), then the
    verdict they settle on (decision.settle: a `regressed` reading stands only when a second,
    independent measurement reads it too). The row shows the first measurement with the
    settled verdict (its pairs, medians and interval), and every reading in ``readings`` when
    there was more than one."""
    judged = [
        (m, judge_pairs(m.base, m.head, factor, unit=unit) if m.error is None and m.base else None)
        for m in result.measurements()
    ]
    verdicts = [c.verdict if c is not None else decision.Verdict.UNDECIDED for _, c in judged]
    verdict = decision.settle(verdicts) or verdicts[0]  # None: a reading not re-measured
    shown, found = next(
        ((m, c) for m, c in judged if c is not None and c.verdict is verdict), judged[0]
    )
    assert found is not None  # the first measurement has pairs (apply_ab checked)
    row.n_base, row.n_head = len(shown.base), len(shown.head)
    row.pairs = [[b, h] for b, h in zip(shown.base, shown.head, strict=False)]
    row.base = statistics.median(shown.base)
    row.head = statistics.median(shown.head)
    row.low = row.high = None  # nothing of an earlier judgement stays on the row
    row.would_need, row.readings = "", None
    _judge(row, found)
    if row.status is RowStatus.TOO_FEW_SAMPLES:
        row.would_need = found.would_need()
    row.p = None  # the blocks' interval decided, not the asv samples' rank test
    row.passes = len(shown.base)
    if len(judged) > 1:
        row.readings = [
            {
                "verdict": str(c.verdict) if c is not None else f"failed: {m.error}",
                "ratio": c.estimate if c is not None else None,
                "low": c.low if c is not None else None,
                "high": c.high if c is not None else None,
                "pairs": [[b, h] for b, h in zip(m.base, m.head, strict=False)],
                "seconds": m.seconds,
            }
            for m, c in judged
        ]
    if verdict is decision.Verdict.UNDECIDED and len(judged) > 1:
        row.status = RowStatus.UNDECIDED
        row.would_need = (
            f"{len(judged)} independent A/B measurements (new worker processes each) disagree: "
            + ", ".join(
                f"{c.verdict} {c.estimate:.3f} [{c.low:.3f}, {c.high:.3f}]"
                if c is not None
                else "failed"
                for _, c in judged
            )
            + "; "
            + (
                (found.would_need() if found.verdict is verdict else "")
                or "a re-run measures afresh"
            )
        )


def _compare_samples(
    row: Row,
    b: Measurement,
    h: Measurement,
    b_passes: dict[tuple[str, int], list[float]] | None,
    h_passes: dict[tuple[str, int], list[float]] | None,
    factor: float,
) -> None:
    """A timing benchmark: the pass-by-pass ratio and rank test (stats.py), then the factor."""
    common = sorted(set(b_passes or {}) & set(h_passes or {}))
    strata: list[stats.Stratum]
    if common and b_passes is not None and h_passes is not None:
        strata = [(b_passes[t], h_passes[t]) for t in common]
        row.passes, row.method = len(strata), "passes"
    else:
        strata = [(b.samples or [], h.samples or [])]
        row.method = "pooled"
    _judge(row, decision.compare(strata, factor))
    if row.ratio is not None:
        row.p = stats.p_slower(strata) if row.ratio >= 1 else stats.p_faster(strata)


def _judge(row: Row, found: decision.Comparison) -> None:
    """Status, ratio and interval of a timing row from its comparison (decision.py). Samples
    that could never build an interval (too few to reach ALPHA) are TOO_FEW_SAMPLES."""
    row.factor_used = found.factor
    row.ratio = None if math.isnan(found.estimate) else found.estimate
    if not math.isfinite(found.high):
        row.status = RowStatus.TOO_FEW_SAMPLES
        return
    row.low, row.high = found.low, found.high
    row.status = RowStatus(found.verdict.value)
    row.would_need = found.would_need()


def _compare_values(row: Row, base: float, head: float, factor: float) -> None:
    """track_* and peakmem_* values have no samples: deterministic numbers, the factor alone."""
    row.ratio = head / base if base else (1.0 if head == base else math.inf)
    if row.ratio > factor:
        row.status = RowStatus.REGRESSED
    elif row.ratio < 1 / factor:
        row.status = RowStatus.IMPROVED
    else:
        row.status = RowStatus.UNCHANGED


def _fewest(rows: list[Row]) -> str:
    r = min(rows, key=lambda r: (r.n_base or 0) + (r.n_head or 0))
    return f"`{r.name}`, {_n(r.n_base)} v {_n(r.n_head)}" + (
        f" in {r.passes} passes" if r.passes else ""
    )


def _count(m: Measurement | None) -> int | None:
    if m is None:
        return None
    if m.samples is not None:
        return len(m.samples)
    if m.stats and isinstance(m.stats, dict) and "repeat" in m.stats:
        return int(m.stats["repeat"])
    return None


def _g(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _isnan(value: float) -> bool:
    return isinstance(value, float) and math.isnan(value)


def apply_counts(
    report: GateReport,
    judged: dict[str, CountComparison],
    confirm: dict[str, ABResult],
) -> GateReport:
    """The report with the instruction-count tier's findings (counts.py) applied.

    A count regression (or unstable counts) fails a row only when its interleaved A/B pairs at
    factor 1 + threshold (``confirm``) read `regressed`; pairs that read `undecided` or failed
    make the row `undecided` (exit 2); pairs that read `unchanged` or `improved` refute it and
    the row keeps its verdict. A count that is unchanged or improved is evidence only: the
    row's A/B verdict at the gate's factor stands (counts never clear a benchmark). A count
    that failed (Valgrind or the benchmark) leaves the row as it is but the gate exits 2 at
    best: the tier asked for could not decide.
    """
    from harness.perf.counts import NEEDS_CONFIRMATION, CountVerdict

    rows = [dataclasses.replace(r) for r in report.rows]
    problems = list(report.context)
    failed: list[str] = []
    for i, row in enumerate(rows):
        found = judged.get(row.name)
        if found is None:
            continue
        if found.verdict is CountVerdict.INELIGIBLE:
            row.counts = f"not counted: {found.why}"
            continue
        if found.verdict is CountVerdict.FAILED:
            row.counts = "count failed"
            failed.append(f"`{row.name}`: {found.why}")
            continue
        line = f"{1 + found.threshold:g}"
        desc = f"Ir x{found.ratio:.4f}: {found.verdict} at {line}"
        if found.why:
            desc += f" ({found.why})"
        if found.verdict not in NEEDS_CONFIRMATION:
            row.counts = desc
            continue
        ab = confirm.get(row.name)
        if ab is not None:  # the confirmation's pairs cost the gate too
            row.ab_seconds = _add_seconds(row.ab_seconds, ab)
        if ab is None or ab.error is not None or not ab.base:
            reason = "not measured" if ab is None else (ab.error or "no samples")
            row.counts = f"{desc}; A/B confirmation failed ({reason})"
            if row.status not in FAILING:
                failed.append(f"`{row.name}`: {desc}, and its A/B confirmation failed: {reason}")
            continue
        check = dataclasses.replace(row)  # the row as the A/B judges it; taken if it fails
        _judge_ab(check, ab, 1 + found.threshold)
        summary = (
            f"A/B at {line}: {check.status} {check.ratio or math.nan:.3f} "
            f"[{check.low or math.nan:.3f}, {check.high or math.nan:.3f}] over {check.passes} "
            "pairs" + (f" ({len(check.readings)} measurements)" if check.readings else "")
        )
        undecided = check.status in (RowStatus.UNDECIDED, RowStatus.TOO_FEW_SAMPLES)
        if check.status is RowStatus.REGRESSED or (undecided and row.status not in FAILING):
            row = rows[i] = check
            row.method = "A/B pairs (count confirmation)"
            if row.status is RowStatus.TOO_FEW_SAMPLES:
                row.status = RowStatus.UNDECIDED
                row.would_need = row.would_need or "more A/B pairs"
        verb = "confirmed" if check.status is RowStatus.REGRESSED else "not confirmed"
        if undecided:
            verb = "neither confirmed nor refuted"
        row.counts = f"{desc}; {verb} by {summary}"
    code, why = _decide(rows)
    if failed:
        why.append(
            "the instruction-count tier could not decide "
            f"{len(failed)} benchmark(s): " + "; ".join(failed)
        )
        if code == EXIT_OK:
            code = EXIT_UNDECIDED
    return dataclasses.replace(
        report, exit_code=code, rows=rows, problems=problems + why, context=problems
    )
