"""What the regression gate returns: one row per benchmark, its status, and the report.

:class:`RowStatus` is the verdict on one benchmark (its value is what perf-gate.json holds);
:class:`Row` one benchmark base against head; :class:`GateReport` the rows with the exit code,
rendered as markdown (the table in the CI summary) or JSON (perf-gate.json). gating.py decides
the statuses and the exit code.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

from harness.perf import stats

EXIT_OK = 0
EXIT_REGRESSION = 1  # a benchmark significantly slower than the factor allows, or failing
EXIT_NOT_COMPARABLE = 2  # nothing could be compared: missing results, env or code mismatch
EXIT_UNDECIDED = 2  # compared, but too noisy to tell at the factor: never a pass


class RowStatus(enum.StrEnum):
    """The verdict on one benchmark, base against head; written to perf-gate.json as its value.

    A row gets one status when :func:`gate` reads both sides' results: the first four below
    (COMPARABLE; decision.Verdict's four, which say what each means) from the confidence
    interval of the ratio and the factor, INFORMATIONAL for track_info_*, the
    rest when one side is missing, failed, skipped or ran different benchmark code. The only
    transition is :func:`apply_ab` re-judging a timing row (COMPARABLE or TOO_FEW_SAMPLES) on
    its interleaved A/B pairs, which gives it a status from COMPARABLE or TOO_FEW_SAMPLES again.
    """

    REGRESSED = "regressed"
    IMPROVED = "improved"
    UNCHANGED = "unchanged"
    UNDECIDED = "undecided"
    """Too noisy, or too few samples, to tell at the factor, after sampling more where the
    gate could (A/B pairs): exit 2, and the gate says what it would need."""
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
        RowStatus.UNDECIDED,
    }
)
# What fails the gate (exit 1).
FAILING = frozenset({RowStatus.REGRESSED, RowStatus.FAILED_IN_HEAD})

# The report names this many of the rows whose A/B pairs took longest.
AB_COST_SHOWN = 5


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
    low: float | None = None  # the confidence interval of ratio (decision.py)
    high: float | None = None
    factor_used: float | None = None  # the factor the row was judged at
    would_need: str = ""  # for an undecided row: the samples or factor that would decide it
    counts: str = ""  # the instruction-count tier's finding (counts.py), when it ran
    # For a row judged on A/B pairs: every pair as [base, head] seconds, in the order taken
    # (blocks of sequential.AB_BLOCK consecutive pairs), so a verdict can be re-examined from
    # perf-gate.json (docs/perf.md, "The gate's error rates, measured").
    pairs: list[list[float]] | None = None
    # For a row whose A/B read `regressed` and was measured again (decision.settle): every
    # measurement's verdict, ratio, interval and pairs, in the order taken.
    readings: list[dict[str, Any]] | None = None
    # For a row timed in A/B pairs: the wall seconds its A/B measurements took together
    # (worker starts and setups included): what the row cost the gate.
    ab_seconds: float | None = None

    def __post_init__(self) -> None:
        self.status = RowStatus(self.status)

    @property
    def comparable(self) -> bool:
        return self.status in COMPARABLE


# Kept under its old name: the public alias of RowStatus.TOO_FEW_SAMPLES.
TOO_FEW_SAMPLES = RowStatus.TOO_FEW_SAMPLES

STATUS_MARK = {
    RowStatus.INFORMATIONAL: "i",
    RowStatus.REGRESSED: "❌",
    RowStatus.FAILED_IN_HEAD: "❌",
    RowStatus.IMPROVED: "✅",
    RowStatus.UNCHANGED: "",
    RowStatus.UNDECIDED: "?",
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
        undecided = sum(r.status is RowStatus.UNDECIDED for r in self.rows)
        if self.exit_code == EXIT_UNDECIDED and undecided and not too_few:
            return (
                f"UNDECIDED: {undecided} benchmark(s) too noisy to tell at factor "
                f"{self.factor:g} (see above for what each would need)"
            )
        if self.exit_code == EXIT_NOT_COMPARABLE and too_few:
            return (
                f"TOO FEW SAMPLES: {too_few} benchmark(s) cannot show a regression with the "
                "samples taken (see above)"
            )
        if self.exit_code == EXIT_NOT_COMPARABLE:
            return "NOT COMPARABLE: nothing could be compared (see above)"
        n = sum(r.comparable for r in self.rows)
        return f"OK: no regression in {n} comparable benchmark(s)"

    def table(self) -> str:
        """The ratio table as GitHub markdown."""
        lines = [
            f"| | benchmark | base `{self.base[:10]}` | head `{self.head[:10]}` | ratio | "
            f"interval | samples | compared | p | status |",
            "|---|---|---|---|---|---|---|---|---|---|",
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
            interval = (
                f"{r.low:.2f}-{r.high:.2f}"
                if r.low is not None and r.high is not None and math.isfinite(r.high)
                else "-"
            )
            status = f"{r.status}; {r.counts}" if r.counts else str(r.status)
            if r.readings:
                status += "; measured " + ", ".join(
                    f"{x['verdict']} {x['ratio']:.2f}" if x["ratio"] is not None else x["verdict"]
                    for x in r.readings
                )
            lines.append(
                f"| {STATUS_MARK.get(r.status, '?')} | `{name}` | {base} | {head} | {ratio} | "
                f"{interval} | {samples} | {passes} | {p} | {status} |"
            )
        return "\n".join(lines)

    def markdown(self) -> str:
        head = (
            f"Gate: base `{self.base[:10]}` vs head `{self.head[:10]}` on machine "
            f"`{self.machine}`, factor {self.factor:g}: a benchmark regresses when head/base "
            "(the median ratio of base/head samples taken together: A/B pairs or asv passes) "
            "reaches it and the whole confidence interval of the ratio (rank-based, "
            f"{1 - 2 * stats.ALPHA:.1%}: Mann-Whitney within asv passes, signed-rank over A/B "
            "blocks) is above 1; it is unchanged only when "
            "the interval lies inside (1/factor, factor); otherwise it is undecided, which "
            "fails (docs/perf.md)."
        )
        parts = [head]
        parts += [f"- {p}" for p in self.problems]
        if self.rows:
            parts.append(self.table())
        cost = self.ab_cost()
        if cost:
            parts.append(cost)
        parts.append(f"**{self.verdict}** (exit {self.exit_code})")
        return "\n\n".join(parts)

    def ab_cost(self) -> str:
        """What the A/B pairs cost, in all and for the slowest rows ("" when none was timed):
        where a gate's minutes go, and which benchmarks to give a budget of their own or make
        ``time_info_`` (docs/perf.md)."""
        timed = sorted(
            (r for r in self.rows if r.ab_seconds is not None),
            key=lambda r: (-(r.ab_seconds or 0.0), r.name),
        )
        if not timed:
            return ""
        total = sum(r.ab_seconds or 0.0 for r in timed)
        slowest = ", ".join(f"`{r.name}` {r.ab_seconds:.0f} s" for r in timed[:AB_COST_SHOWN])
        return (
            f"A/B pairs: {total / 60:.1f} min for {len(timed)} benchmarks; the longest: {slowest}."
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "base": self.base,
            "head": self.head,
            "machine": self.machine,
            "factor": self.factor,
            "problems": self.problems,
            "verdict": self.verdict,
            # NaN (a skipped benchmark) and an unbounded interval are not JSON: they become
            # null, like a missing value.
            "rows": [
                {
                    k: None if isinstance(v, float) and not math.isfinite(v) else v
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
