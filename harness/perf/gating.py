"""The regression gate: base against head, benchmark by benchmark, exit 0, 1 or 2.

:func:`gate` reads the asv result files of two commits itself (``asv compare`` exits 0 whatever
it finds) and, for timing benchmarks, compares their samples pass by pass (stats.py: the median
of per-pass ratios and a stratified Mann-Whitney test; results.py pairs the passes), then
applies the factor. "Nothing comparable" and "too few samples to see a regression" are exit 2,
never a pass. baselines.py picks the base; step.py is the ``harness ci`` step around it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.perf import stats
from harness.perf._common import (
    Project,
    check_factor,
    env_name,
    resolve_commit,
    resolve_machine,
)
from harness.perf.results import Measurement, load_passes, load_results

if TYPE_CHECKING:
    from harness.perf.ab import ABResult

EXIT_OK = 0
EXIT_REGRESSION = 1  # a benchmark significantly slower than the factor allows, or failing
EXIT_NOT_COMPARABLE = 2  # nothing could be compared: missing results, env or code mismatch

# Ratios seen for identical code on a quiet 2-core CI machine: 0.90-1.06 (docs/platform.md), so 1.2
# is the floor there. With the machine shared by other jobs (load 2-5 on 2 cores), unchanged
# code measured base/head alternately still reached 1.21-1.26 in about 1 pair of 20, and asv's
# test called those significant: 1.3 is the factor that noise allows (docs/perf.md). A 2x
# slowdown read 1.46-3.1 under the same load. Quiet dedicated runners (the GPU machine) can
# pass --factor 1.2.
DEFAULT_FACTOR = 1.3


# --------------------------------------------------------------------------------------------
# The gate


class RowStatus(enum.StrEnum):
    """The verdict on one benchmark, base against head; written to perf-gate.json as its value.

    A row gets one status when :func:`gate` reads both sides' results: the first five below
    (COMPARABLE) from the factor and the significance test, INFORMATIONAL for track_info_*, the
    rest when one side is missing, failed, skipped or ran different benchmark code. The only
    transition is :func:`apply_ab` re-judging a timing row (COMPARABLE or TOO_FEW_SAMPLES) on
    its interleaved A/B pairs, which gives it a status from COMPARABLE or TOO_FEW_SAMPLES again.
    """

    REGRESSED = "regressed"
    IMPROVED = "improved"
    UNCHANGED = "unchanged"
    SLOWER_NOT_SIGNIFICANT = "slower, not significant"
    FASTER_NOT_SIGNIFICANT = "faster, not significant"
    TOO_FEW_SAMPLES = "too few samples to see a regression"
    """A timing benchmark whose samples can never reach significance (stats.min_p >= ALPHA):
    the gate cannot see a regression there, not even a 10x one, and says so (exit 2)."""
    INFORMATIONAL = "informational"
    FAILED_IN_HEAD = "failed in head"
    NEW_IN_HEAD = "new in head, no baseline"
    MISSING_IN_HEAD = "missing in head"
    CODE_CHANGED = "benchmark code changed, not comparable"
    FAILED_IN_BASE = "failed in base, not comparable"
    SKIPPED = "skipped, not comparable"


COMPARABLE = frozenset(
    {
        RowStatus.REGRESSED,
        RowStatus.IMPROVED,
        RowStatus.UNCHANGED,
        RowStatus.SLOWER_NOT_SIGNIFICANT,
        RowStatus.FASTER_NOT_SIGNIFICANT,
    }
)
# What fails the gate (exit 1).
FAILING = frozenset({RowStatus.REGRESSED, RowStatus.FAILED_IN_HEAD})


@dataclasses.dataclass
class Row:
    """One benchmark (with its parameters) in one environment, base against head.

    ``status`` may be given as its string value; it is checked (ValueError for one that is
    not a :class:`RowStatus`).
    """

    name: str
    env_name: str
    status: RowStatus
    base: float | None
    head: float | None
    unit: str | None
    n_base: int | None
    n_head: int | None
    ratio: float | None = None
    passes: int | None = None  # strata compared: asv passes, or A/B pairs (method)
    p: float | None = None  # one-sided p-value of the direction of the ratio (stats.py)
    method: str = ""  # how the samples were compared: "passes", "pooled" or "A/B pairs"
    kind: str | None = None  # asv's benchmark type: time, track, peakmem...

    def __post_init__(self) -> None:
        self.status = RowStatus(self.status)

    @property
    def comparable(self) -> bool:
        return self.status in COMPARABLE


# Kept under its old name: the public alias of RowStatus.TOO_FEW_SAMPLES.
TOO_FEW_SAMPLES = RowStatus.TOO_FEW_SAMPLES

# Benchmarks named track_info_* are shown with their ratio but never decide the exit code: they
# track a noisy derived number with no samples for the significance test (README.md there).
INFORMATIONAL = re.compile(r"\.track_info_")

STATUS_MARK = {
    RowStatus.INFORMATIONAL: "i",
    RowStatus.REGRESSED: "❌",
    RowStatus.FAILED_IN_HEAD: "❌",
    RowStatus.IMPROVED: "✅",
    RowStatus.UNCHANGED: "",
    RowStatus.SLOWER_NOT_SIGNIFICANT: "~",
    RowStatus.FASTER_NOT_SIGNIFICANT: "~",
    RowStatus.TOO_FEW_SAMPLES: "⚠",
}


@dataclasses.dataclass
class GateReport:
    exit_code: int
    base: str
    head: str
    machine: str
    factor: float
    rows: list[Row]
    problems: list[str]  # why something was not comparable (shown above the table)
    context: list[str] = dataclasses.field(default_factory=list)  # problems not from the verdict

    @property
    def verdict(self) -> str:
        if self.exit_code == EXIT_REGRESSION:
            bad = [r for r in self.rows if r.status in FAILING]
            return f"REGRESSION: {len(bad)} benchmark(s) significantly slower or failing"
        too_few = sum(r.status is RowStatus.TOO_FEW_SAMPLES for r in self.rows)
        if self.exit_code == EXIT_NOT_COMPARABLE and too_few:
            return (
                f"TOO FEW SAMPLES: {too_few} benchmark(s) cannot show a regression with the "
                "samples taken (see above)"
            )
        if self.exit_code == EXIT_NOT_COMPARABLE:
            return "NOT COMPARABLE: nothing could be compared (see above)"
        n = sum(r.comparable for r in self.rows)
        return f"OK: no significant regression in {n} comparable benchmark(s)"

    def table(self) -> str:
        """The ratio table as GitHub markdown."""
        lines = [
            f"| | benchmark | base `{self.base[:10]}` | head `{self.head[:10]}` | ratio | "
            f"samples | compared | p | status |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        envs = {r.env_name for r in self.rows}
        for r in self.rows:
            name = r.name if len(envs) == 1 else f"{r.name} [{r.env_name}]"
            ratio = f"{r.ratio:.2f}" if r.ratio is not None else "n/a"
            samples = f"{_n(r.n_base)}/{_n(r.n_head)}"
            base = "-" if r.status is RowStatus.NEW_IN_HEAD else _human(r.base, r.unit)
            head = "-" if r.status is RowStatus.MISSING_IN_HEAD else _human(r.head, r.unit)
            passes = f"{r.passes} {r.method}" if r.passes else r.method or "-"
            p = "-" if r.p is None else f"{r.p:.2g}"
            lines.append(
                f"| {STATUS_MARK.get(r.status, '?')} | `{name}` | {base} | {head} | {ratio} | "
                f"{samples} | {passes} | {p} | {r.status} |"
            )
        return "\n".join(lines)

    def markdown(self) -> str:
        head = (
            f"Gate: base `{self.base[:10]}` vs head `{self.head[:10]}` on machine "
            f"`{self.machine}`, factor {self.factor:g}: a benchmark regresses when head/base "
            "(the median of the ratios of base/head samples taken together: A/B pairs or asv "
            "passes) exceeds it and a Mann-Whitney test within those groups gives "
            f"p < {stats.ALPHA:g} (docs/perf.md)."
        )
        parts = [head]
        parts += [f"- {p}" for p in self.problems]
        if self.rows:
            parts.append(self.table())
        parts.append(f"**{self.verdict}** (exit {self.exit_code})")
        return "\n\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "base": self.base,
            "head": self.head,
            "machine": self.machine,
            "factor": self.factor,
            "problems": self.problems,
            "verdict": self.verdict,
            # NaN (a skipped benchmark) is not JSON: it becomes null, like a missing value.
            "rows": [
                {
                    k: None if isinstance(v, float) and math.isnan(v) else v
                    for k, v in dataclasses.asdict(r).items()
                }
                for r in self.rows
            ],
        }


def _n(n: int | None) -> str:
    return "-" if n is None else str(n)


def _human(value: float | None, unit: str | None) -> str:
    from asv.util import human_value

    if value is None:
        return "failed"
    if isinstance(value, float) and math.isnan(value):
        return "skipped"
    if unit in ("seconds", "bytes"):
        return str(human_value(value, unit))
    return f"{value:.4g}" + (f" {unit}" if unit and unit != "unit" else "")


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
            "or without --quick): at least 7 per side pooled, or 2 passes of 5."
        )
    if any(r.status in FAILING for r in rows):
        return EXIT_REGRESSION, problems
    if too_few:
        return EXIT_NOT_COMPARABLE, problems
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


def apply_ab(report: GateReport, ab: dict[str, ABResult]) -> GateReport:
    """The report with each timing row that has A/B pairs judged on those pairs instead.

    The pairs are grouped in blocks of AB_BLOCK consecutive pairs, each block a stratum
    (stats.py): samples taken within a second or so of each other are interchangeable, while a
    load change between blocks shifts both sides alike. A failed A/B keeps the row's verdict
    from the asv runs and says why.
    """
    rows = [dataclasses.replace(r) for r in report.rows]
    problems = list(report.context)
    for row in rows:
        result = ab.get(row.name)
        if result is None:
            continue
        if result.error is not None or not result.base:
            problems.append(
                f"A/B of `{row.name}` failed ({result.error or 'no samples'}): judged on the "
                "asv runs' samples"
            )
            continue
        strata: list[stats.Stratum] = [
            (result.base[i : i + AB_BLOCK], result.head[i : i + AB_BLOCK])
            for i in range(0, len(result.base), AB_BLOCK)
        ]
        row.n_base, row.n_head = len(result.base), len(result.head)
        row.base = statistics.median(result.base)
        row.head = statistics.median(result.head)
        _judge(row, strata, report.factor)
        row.passes, row.method = len(result.base), "A/B pairs"
    code, why = _decide(rows)
    return dataclasses.replace(
        report, exit_code=code, rows=rows, problems=problems + why, context=problems
    )


# Consecutive A/B pairs per stratum: 5 v 5 gives p >= 1/252 per block, so 20 pairs (4 blocks)
# can reach p < 0.001 with a spike or two in every block.
AB_BLOCK = 5


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
    _judge(row, strata, factor)


def _judge(row: Row, strata: Sequence[stats.Stratum], factor: float) -> None:
    """Status, ratio and p of a timing row from its strata (stats.py), then the factor."""
    sizes = [(len(stats._clean(x)), len(stats._clean(y))) for x, y in strata]
    if stats.min_p(sizes) >= stats.ALPHA:
        row.status = RowStatus.TOO_FEW_SAMPLES
        row.ratio = stats.ratio(strata) if any(n and m for n, m in sizes) else None
        return
    row.ratio = stats.ratio(strata)
    slower, faster = stats.p_slower(strata), stats.p_faster(strata)
    row.p = slower if row.ratio >= 1 else faster
    if row.ratio > factor:
        row.status = (
            RowStatus.REGRESSED if slower < stats.ALPHA else RowStatus.SLOWER_NOT_SIGNIFICANT
        )
    elif row.ratio < 1 / factor:
        row.status = (
            RowStatus.IMPROVED if faster < stats.ALPHA else RowStatus.FASTER_NOT_SIGNIFICANT
        )
    else:
        row.status = RowStatus.UNCHANGED


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


def _isnan(value: float) -> bool:
    return isinstance(value, float) and math.isnan(value)
