"""The regression gate, the baseline a change is compared with, and the ``harness ci`` step.

:func:`gate` reads the asv result files of two commits itself and applies asv's own
statistical test (``asv.commands.compare._is_result_better``) with the factor, turning
"nothing comparable" into exit code 2. :func:`merge_base` and :func:`find_baseline` pick the
baseline; :func:`ci_step` runs the benchmarks (measuring the base too when asked) and gates
HEAD against it, writing the step's reports.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path

from harness.perf._common import (
    Echo,
    PerfError,
    Project,
    _echo_stderr,
    _git,
    default_machine,
    env_name,
    resolve_commit,
)
from harness.perf.runs import RunOutcome, run_benchmarks, run_interleaved

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

# How far back along the default branch's first-parent history a missing baseline is looked
# for (a merge-base whose perf job was skipped or failed still leaves its parents).
BASELINE_SEARCH_DEPTH = 20


# --------------------------------------------------------------------------------------------
# The gate


@dataclasses.dataclass
class Row:
    """One benchmark (with its parameters) in one environment, base against head."""

    name: str
    env_name: str
    status: str  # the keys of STATUS_MARK, or a "not comparable" reason
    base: float | None
    head: float | None
    unit: str | None
    n_base: int | None
    n_head: int | None
    ratio: float | None = None

    @property
    def comparable(self) -> bool:
        return self.status in (
            "regressed",
            "improved",
            "unchanged",
            "slower, not significant",
            "faster, not significant",
        )


# Benchmarks named track_info_* are shown with their ratio but never decide the exit code: they
# track a noisy derived number with no samples for the significance test (README.md there).
INFORMATIONAL = re.compile(r"\.track_info_")

STATUS_MARK = {
    "informational": "i",
    "regressed": "❌",
    "failed in head": "❌",
    "improved": "✅",
    "unchanged": "",
    "slower, not significant": "~",
    "faster, not significant": "~",
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

    @property
    def verdict(self) -> str:
        if self.exit_code == EXIT_REGRESSION:
            bad = [r for r in self.rows if r.status in ("regressed", "failed in head")]
            return f"REGRESSION: {len(bad)} benchmark(s) significantly slower or failing"
        if self.exit_code == EXIT_NOT_COMPARABLE:
            return "NOT COMPARABLE: nothing could be compared (see above)"
        n = sum(r.comparable for r in self.rows)
        return f"OK: no significant regression in {n} comparable benchmark(s)"

    def table(self) -> str:
        """The ratio table as GitHub markdown."""
        lines = [
            f"| | benchmark | base `{self.base[:10]}` | head `{self.head[:10]}` | ratio | "
            f"samples | status |",
            "|---|---|---|---|---|---|---|",
        ]
        envs = {r.env_name for r in self.rows}
        for r in self.rows:
            name = r.name if len(envs) == 1 else f"{r.name} [{r.env_name}]"
            ratio = f"{r.ratio:.2f}" if r.ratio is not None else "n/a"
            samples = f"{_n(r.n_base)}/{_n(r.n_head)}"
            base = "-" if r.status.startswith("new in head") else _human(r.base, r.unit)
            head = "-" if r.status == "missing in head" else _human(r.head, r.unit)
            lines.append(
                f"| {STATUS_MARK.get(r.status, '?')} | `{name}` | {base} | {head} | {ratio} | "
                f"{samples} | {r.status} |"
            )
        return "\n".join(lines)

    def markdown(self) -> str:
        head = (
            f"Gate: base `{self.base[:10]}` vs head `{self.head[:10]}` on machine "
            f"`{self.machine}`, factor {self.factor:g} with asv's significance test."
        )
        parts = [head]
        parts += [f"- {p}" for p in self.problems]
        if self.rows:
            parts.append(self.table())
        parts.append(f"**{self.verdict}** (exit {self.exit_code})")
        return "\n\n".join(parts)

    def to_json(self) -> dict:
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
        return human_value(value, unit)
    return f"{value:.4g}" + (f" {unit}" if unit and unit != "unit" else "")


@dataclasses.dataclass
class _Measurement:
    value: float | None
    stats: dict | None
    samples: list[float] | None
    version: str | None


def _load_results(project: Project, machine: str, sha: str) -> dict[str, dict[str, _Measurement]]:
    """{env name: {benchmark name with params: measurement}} for one commit on one machine."""
    from asv.commands.compare import unroll_result
    from asv.results import iter_results_for_machine_and_hash

    by_env: dict[str, dict[str, _Measurement]] = {}
    if not (project.results_dir / machine).is_dir():
        return by_env
    for result in iter_results_for_machine_and_hash(str(project.results_dir), machine, sha):
        rows = by_env.setdefault(result.env_name, {})
        for key in result.get_all_result_keys():
            params = result.get_result_params(key)
            version = result.benchmark_version.get(key)
            for name, value, stats, samples in unroll_result(
                key,
                params,
                result.get_result_value(key, params),
                result.get_result_stats(key, params),
                result.get_result_samples(key, params),
            ):
                rows[name] = _Measurement(value, stats, samples, version)
    return by_env


def _units(project: Project) -> dict[str, str]:
    path = project.results_dir / "benchmarks.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v.get("unit", "") for k, v in data.items() if isinstance(v, dict)}


def has_results(
    root: Path | str, commit: str, *, machine: str | None = None, env: str | None = None
) -> bool:
    """Whether results for commit exist on machine (and in env, when given)."""
    project = Project.load(root)
    by_env = _load_results(
        project, machine or default_machine(), resolve_commit(project.root, commit)
    )
    return bool(by_env.get(env)) if env else any(by_env.values())


def gate(
    root: Path | str,
    base: str,
    head: str,
    *,
    factor: float = DEFAULT_FACTOR,
    machine: str | None = None,
) -> GateReport:
    """Compare the results of two commits: exit 0 nothing regressed, 1 regression, 2 nothing
    comparable. Never passes silently: every benchmark appears in the rows with its status."""
    from asv.commands.compare import _is_result_better

    if not factor >= 1.0:
        raise PerfError(f"--factor must be >= 1.0 (a ratio head/base), got {factor}")
    project = Project.load(root)
    machine = machine or default_machine()
    base_sha = resolve_commit(project.root, base)
    head_sha = resolve_commit(project.root, head)

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
    base_results = _load_results(project, machine, base_sha)
    head_results = _load_results(project, machine, head_sha)
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

    units = _units(project)
    rows: list[Row] = []
    for env in common_envs:
        b_all, h_all = base_results[env], head_results[env]
        for name in sorted(set(b_all) | set(h_all)):
            unit = units.get(name.split("(", 1)[0])
            b, h = b_all.get(name), h_all.get(name)
            row = Row(
                name,
                env,
                "",
                b.value if b else None,
                h.value if h else None,
                unit,
                _count(b),
                _count(h),
            )
            if b is None:
                row.status = "new in head, no baseline"
            elif h is None:
                row.status = "missing in head"
            elif b.version != h.version:
                row.status = "benchmark code changed, not comparable"
            elif INFORMATIONAL.search(name) and not (h.value is None or b.value is None):
                row.status = "informational"
                if not (_isnan(b.value) or _isnan(h.value)) and b.value:
                    row.ratio = h.value / b.value
            elif h.value is None:
                row.status = "failed in head"
            elif b.value is None:
                row.status = "failed in base, not comparable"
            elif _isnan(b.value) or _isnan(h.value):
                row.status = "skipped, not comparable"
            else:
                row.ratio = h.value / b.value if b.value else math.inf
                ss_b, ss_h = (b.stats, b.samples), (h.stats, h.samples)
                if _is_result_better(b.value, h.value, ss_b, ss_h, factor):
                    row.status = "regressed"
                elif _is_result_better(h.value, b.value, ss_h, ss_b, factor):
                    row.status = "improved"
                elif row.ratio > factor:
                    row.status = "slower, not significant"
                elif row.ratio < 1 / factor:
                    row.status = "faster, not significant"
                else:
                    row.status = "unchanged"
            rows.append(row)

    if any(r.status in ("regressed", "failed in head") for r in rows):
        code = EXIT_REGRESSION
    elif not any(r.comparable for r in rows):
        code = EXIT_NOT_COMPARABLE
        changed = sum(r.status.startswith("benchmark code changed") for r in rows)
        problems.append(
            f"nothing comparable: {len(rows)} benchmark(s), {changed} with changed code, the "
            "rest skipped, failed, new or missing on one side"
        )
    else:
        code = EXIT_OK
    return report(code, rows, problems)


def _count(m: _Measurement | None) -> int | None:
    if m is None:
        return None
    if m.samples is not None:
        return len(m.samples)
    if m.stats and isinstance(m.stats, dict) and "repeat" in m.stats:
        return int(m.stats["repeat"])
    return None


def _isnan(value: float) -> bool:
    return isinstance(value, float) and math.isnan(value)


# --------------------------------------------------------------------------------------------
# Baselines: which commit a change is compared with


def default_branch_refs(root: Path) -> list[str]:
    """Refs that may name the default branch, most specific first."""
    refs = []
    for var in ("HARNESS_PERF_BASE_REF", "GITHUB_BASE_REF"):
        value = os.environ.get(var)
        if value:
            refs += [f"origin/{value}", value] if var == "GITHUB_BASE_REF" else [value]
    origin_head = _git(root, "symbolic-ref", "--quiet", "refs/remotes/origin/HEAD", check=False)
    if origin_head:
        refs.append(origin_head.removeprefix("refs/remotes/"))
    refs += ["origin/main", "main", "origin/master", "master"]
    return list(dict.fromkeys(refs))


def merge_base(root: Path | str, *, base_ref: str | None = None) -> tuple[str, str] | None:
    """(sha, description) of the commit a change is compared with, or None.

    The merge-base of HEAD with the default branch; on the default branch itself (the
    merge-base is HEAD), HEAD's first parent.
    """
    root = Path(root)
    head = resolve_commit(root, "HEAD")
    for ref in [base_ref] if base_ref else default_branch_refs(root):
        if not _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False):
            continue
        mb = _git(root, "merge-base", "HEAD", ref, check=False)
        if not mb:
            continue
        if mb != head:
            return mb, f"merge-base of HEAD and {ref}"
        parent = _git(root, "rev-parse", "--verify", "--quiet", "HEAD^1^{commit}", check=False)
        if parent:
            return parent, f"HEAD's first parent (HEAD is on {ref})"
        return None
    return None


def find_baseline(
    root: Path | str, start: str, *, machine: str, env: str, depth: int = BASELINE_SEARCH_DEPTH
) -> str | None:
    """The nearest first-parent ancestor of start (itself included) with results in env."""
    root = Path(root)
    project = Project.load(root)
    shas = _git(
        root, "rev-list", "--first-parent", f"--max-count={depth}", start, check=False
    ).split()
    for sha in shas:
        if _load_results(project, machine, sha).get(env):
            return sha
    return None


# --------------------------------------------------------------------------------------------
# The `harness ci` step


@dataclasses.dataclass
class PerfStepResult:
    """What the perf step of ``harness ci`` found.

    exit_code: 0 passed (or skipped without a baseline, unless a baseline is required), 1 a
    significant regression or a failing benchmark, 2 nothing comparable (or no baseline when
    ``require_baseline``). markdown: the summary for the report. skipped_reason: why the gate
    did not compare anything, shown in the report; None when it did.
    """

    exit_code: int
    markdown: str
    skipped_reason: str | None


def ci_step(
    repo_root: Path,
    report_dir: Path,
    *,
    quick: bool = True,
    require_baseline: bool = False,
    measure_base: str = "never",
    passes: int = 2,
    group: str = "cpu",
    bench: str | None = None,
    machine: str | None = None,
    factor: float = DEFAULT_FACTOR,
    base_ref: str | None = None,
    echo: Echo | None = _echo_stderr,
) -> PerfStepResult:
    """Run the CPU benchmarks (or ``group``) for HEAD and gate them against the baseline.

    docs/perf.md describes the policy.

    The base is the merge-base of HEAD with the default branch (HEAD's first parent on the
    default branch itself). measure_base says where its results come from:

    - "never" (``harness ci`` locally, the GPU runner): stored results of the nearest
      first-parent ancestor of the base that has results on this machine and environment.
    - "always" (the CPU pull-request job): the base is measured in this run, interleaved with
      HEAD; results stored by other machines of the same name are not trusted.
    - "missing": stored results when there are some, else measure as "always".

    When the base is measured here, base and HEAD alternate over ``passes`` runs each: more
    passes spread a drifting machine's speed more evenly over both sides, at one asv start-up
    per pass. ``bench`` narrows the group with a regex (as ``harness perf run --bench``).
    Without a baseline the step says so (skipped_reason) and exits 0, or 2 under
    ``require_baseline``. Writes perf.md, perf-gate.json and perf-run.log into report_dir.
    """
    if measure_base not in ("never", "missing", "always"):
        raise ValueError(f"measure_base must be never, missing or always, got {measure_base!r}")
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _ci_step(
            Path(repo_root),
            report_dir,
            quick=quick,
            require_baseline=require_baseline,
            measure_base=measure_base,
            passes=passes,
            group=group,
            bench=bench,
            machine=machine or default_machine(),
            factor=factor,
            base_ref=base_ref,
            echo=echo,
        )
    except PerfError as exc:  # no asv.conf.json, not a git checkout, unknown base ref...
        reason = f"perf step could not run: {exc}"
        markdown = f"### Performance\n\n**{reason}** (exit {EXIT_NOT_COMPARABLE})"
        (report_dir / "perf.md").write_text(markdown + "\n")
        return PerfStepResult(EXIT_NOT_COMPARABLE, markdown, reason)


def _ci_step(
    repo_root: Path,
    report_dir: Path,
    *,
    quick: bool,
    require_baseline: bool,
    measure_base: str,
    passes: int,
    group: str,
    bench: str | None,
    machine: str,
    factor: float,
    base_ref: str | None,
    echo: Echo | None,
) -> PerfStepResult:
    Project.load(repo_root)  # fails first, and clearly, where there is no asv project
    env = env_name()
    head = resolve_commit(Path(repo_root), "HEAD")
    title = (
        f"### Performance (asv, machine `{machine}`, "
        f"{'quick' if quick else 'full'} run, {group.upper()} group)"
    )
    log: list[str] = []
    run_kwargs = {"group": group, "bench": bench, "quick": quick, "machine": machine, "echo": echo}

    def finish(code: int, body: list[str], skipped: str | None, gate_report=None):
        markdown = "\n\n".join([title, *body])
        (report_dir / "perf.md").write_text(markdown + "\n")
        (report_dir / "perf-run.log").write_text("\n".join(log) + "\n")
        if gate_report is not None:
            (report_dir / "perf-gate.json").write_text(
                json.dumps(gate_report.to_json(), indent=2) + "\n"
            )
        return PerfStepResult(code, markdown, skipped)

    found = merge_base(repo_root, base_ref=base_ref)
    baseline, base_note, base_problem = None, "", ""
    outcomes: list[RunOutcome] = []
    if found:
        start, how = found
        if measure_base != "always":
            baseline = find_baseline(repo_root, start, machine=machine, env=env)
        if baseline is None and measure_base != "never":
            try:
                outcomes = run_interleaved(repo_root, [start, "HEAD"], passes=passes, **run_kwargs)
            except PerfError as exc:  # e.g. the base predates the benchmarks
                base_problem = f" (measuring it failed: {exc})"
            else:
                if has_results(repo_root, start, machine=machine, env=env):
                    baseline = start
        if baseline is not None:
            if baseline == start:
                origin = "measured in this run" if outcomes else "stored results"
                base_note = f"Baseline: `{baseline[:10]}` ({how}; {origin})."
            else:
                base_note = (
                    f"Baseline: `{baseline[:10]}`, the nearest first-parent ancestor "
                    f"with stored results of the {how} ({start[:10]})."
                )
    if not outcomes:
        outcomes = [run_benchmarks(repo_root, commit="HEAD", **run_kwargs)]
    for outcome in outcomes:
        log += outcome.log
    head_outcome = outcomes[-1]
    run_note = f"Head: `{head[:10]}` ({head_outcome.source}), environment `{env}`."
    failed_run = any(o.exit_code != 0 for o in outcomes)
    run_failure = (
        "**asv run reported failing benchmarks or an error** (exit 1): see "
        f"{report_dir / 'perf-run.log'}."
    )

    if baseline is None:
        if found is None:
            reason = (
                "no baseline: HEAD has no merge-base with the default branch "
                f"(tried {', '.join(default_branch_refs(Path(repo_root)))})"
            )
        elif measure_base == "never":
            reason = (
                f"no baseline: no stored results for the {found[1]} ({found[0][:10]}) or "
                f"its {BASELINE_SEARCH_DEPTH - 1} first-parent ancestors on machine "
                f"`{machine}` in environment `{env}`"
            )
        else:
            reason = (
                f"no baseline: the {found[1]} ({found[0][:10]}) has no results in "
                f"environment `{env}`{base_problem}"
            )
        code = (
            EXIT_REGRESSION if failed_run else EXIT_NOT_COMPARABLE if require_baseline else EXIT_OK
        )
        consequence = (
            "this fails the step (a baseline is required here)"
            if require_baseline
            else "HEAD's results are recorded and can serve as a baseline later"
        )
        body = [run_note, f"**Perf gate skipped: {reason}**; {consequence}."]
        if failed_run:
            body.append(run_failure)
        return finish(code, body, reason)

    report = gate(repo_root, baseline, head, factor=factor, machine=machine)
    code = report.exit_code
    if failed_run and code == EXIT_OK:
        code = EXIT_REGRESSION
    body = [base_note, run_note, report.markdown()]
    if failed_run:
        body.append(run_failure)
    skipped = None
    if report.exit_code == EXIT_NOT_COMPARABLE:
        skipped = "nothing comparable: " + "; ".join(report.problems)
    return finish(code, body, skipped, report)
