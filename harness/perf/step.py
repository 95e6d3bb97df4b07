"""The perf step of ``harness ci`` (and ``harness perf ci``): benchmark, find the base, gate.

:func:`ci_step` runs the benchmarks of HEAD, takes its baseline from where the policy says
(docs/perf.md, "Baseline policy": stored results, the base measured in this run in alternation
with HEAD, or the baseline a first run recorded), gates (with interleaved A/B pairs for the
timing benchmarks when the base is measured here), and writes perf.md, perf-gate.json and
perf-run.log.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any, Literal, get_args

from harness.perf._common import (
    Echo,
    PerfError,
    Project,
    _echo_stderr,
    check_factor,
    check_machine,
    check_ref,
    check_regex,
    env_name,
    resolve_commit,
    resolve_machine,
)
from harness.perf.ab import (
    AB_STARTS,
    DEFAULT_PAIRS,
    DEFAULT_START,
    MAX_AB_PAIRS,
    MAX_SECONDS_PER_BENCHMARK,
    measure_ab,
)
from harness.perf.baselines import (
    BASELINE_SEARCH_DEPTH,
    StoredBaseline,
    default_branch_refs,
    find_baseline,
    merge_base,
    others_note,
    record_baseline,
    stored_baseline,
)
from harness.perf.counts import (
    DEFAULT_COUNT_THRESHOLD,
    NEEDS_CONFIRMATION,
    check_counts_tools,
    check_threshold,
    measure_counts,
)
from harness.perf.gate_report import (
    EXIT_NOT_COMPARABLE,
    EXIT_OK,
    EXIT_REGRESSION,
    GateReport,
    RowStatus,
)
from harness.perf.gating import (
    DEFAULT_FACTOR,
    ab_candidates,
    apply_ab,
    apply_counts,
    gate,
    has_results,
)
from harness.perf.gpu_ab import NoGpuError, measure_gpu_ab
from harness.perf.runs import GROUPS, MAX_PASSES, RunOutcome, run_benchmarks, run_interleaved

MeasureBase = Literal["never", "missing", "always"]
"""Where the base's results come from (:func:`ci_step` says what each choice does)."""
MEASURE_BASE: tuple[MeasureBase, ...] = get_args(MeasureBase)
# An A/B budget beyond an hour per benchmark is a typo, not a plan.
MAX_AB_BUDGET_S = 3600.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class PerfStepConfig:
    """How the perf step runs (``harness perf ci``'s options; ``harness ci`` uses the defaults).

    Checked once, on construction: a bad value raises :class:`PerfError` naming it and the fix
    (``harness perf ci``: exit 2), before any benchmark runs or any file is written.
    """

    quick: bool = True
    """One round, 5 samples per benchmark per pass (runs.py); False: asv's default sampling."""
    require_baseline: bool = False
    """No baseline is exit 2 (pull-request jobs) instead of 0."""
    measure_base: MeasureBase = "never"
    """never: stored results; always: measured in this run; missing: stored, else measured."""
    passes: int = 1
    """Alternating asv passes over base and HEAD when the base is measured here."""
    group: str = "cpu"
    """The benchmark group (a key of runs.GROUPS): the CPU runner's, the GPU runner's, or all."""
    bench: str | None = None
    """Only benchmarks whose name matches this regex (re.search); None: the whole group."""
    machine: str | None = None
    """The asv machine name; None: $HARNESS_PERF_MACHINE or ci-cpu, read when the step runs."""
    factor: float = DEFAULT_FACTOR
    """A benchmark regresses when head/base exceeds this and the difference is significant."""
    base_ref: str | None = None
    """The default branch to take the merge-base with; None: found (baselines.py)."""
    ab_pairs: int = DEFAULT_PAIRS
    """Interleaved A/B pairs per timing benchmark before the first look (more while its verdict
    is undecided): all timing benchmarks when the base is measured here, the undecided and
    regressed ones when it is stored; 0: none (the asv samples decide)."""
    ab_budget_s: float = MAX_SECONDS_PER_BENCHMARK
    """Seconds of A/B sampling per benchmark at most (sequential.py)."""
    counts: bool = False
    """Also count instructions under Valgrind (counts.py): a count regression confirmed by A/B
    pairs at 1 + counts_threshold fails the gate; valgrind and a C compiler are checked first."""
    counts_threshold: float = DEFAULT_COUNT_THRESHOLD
    """A count ratio head/base at or above 1 + this is a count regression (a benchmark may set
    its own with ``harness_counts = 0.1``)."""
    counts_cache_sim: bool = False
    """Also simulate caches (callgrind --cache-sim=yes): misses shown, not gated."""
    ab_start: str = DEFAULT_START
    """How each block's A/B workers start: fork (from a zygote per side) or exec (ab.py)."""

    def __post_init__(self) -> None:
        if self.measure_base not in MEASURE_BASE:
            raise PerfError(
                f"--measure-base {self.measure_base!r} is not a choice: give one of "
                f'{", ".join(MEASURE_BASE)} (docs/perf.md, "Baseline policy")'
            )
        if not 1 <= self.passes <= MAX_PASSES:
            raise PerfError(f"--passes must be between 1 and {MAX_PASSES}, got {self.passes}")
        if not 0 <= self.ab_pairs <= MAX_AB_PAIRS:
            raise PerfError(f"--ab-pairs must be between 0 and {MAX_AB_PAIRS}, got {self.ab_pairs}")
        if not (
            isinstance(self.ab_budget_s, (int, float))
            and math.isfinite(self.ab_budget_s)
            and 0 < self.ab_budget_s <= MAX_AB_BUDGET_S
        ):
            raise PerfError(
                f"--ab-budget {self.ab_budget_s!r} is not a time budget: give seconds per "
                f"benchmark, > 0 and <= {MAX_AB_BUDGET_S:g}"
            )
        if self.ab_start not in AB_STARTS:
            raise PerfError(
                f"--ab-start {self.ab_start!r} is not a choice: give one of {', '.join(AB_STARTS)}"
            )
        if self.group not in GROUPS:
            raise PerfError(
                f"--group {self.group!r} is not a benchmark group: give one of "
                f"{', '.join(sorted(GROUPS))}"
            )
        check_factor(self.factor)
        check_threshold(self.counts_threshold)
        if self.bench is not None:
            check_regex(self.bench)
        if self.base_ref is not None:
            check_ref(self.base_ref, source="--base-ref")
        if self.machine is not None:
            check_machine(self.machine)


@dataclasses.dataclass
class PerfStepResult:
    """What the perf step of ``harness ci`` found.

    exit_code: 0 passed (or no baseline yet, unless a baseline is required), 1 a significant
    regression or a failing benchmark, 2 nothing comparable, too few samples, or no baseline
    when ``require_baseline``. markdown: the summary for the report. skipped_reason: why the
    gate did not compare anything, shown in the report; None when it did.
    baseline_recorded: where this run was kept as the baseline (no baseline existed), or None.
    """

    exit_code: int
    markdown: str
    skipped_reason: str | None
    baseline_recorded: str | None = None


def ci_step(
    repo_root: Path,
    report_dir: Path,
    config: PerfStepConfig | None = None,
    *,
    echo: Echo | None = _echo_stderr,
) -> PerfStepResult:
    """Run the CPU benchmarks (or ``config.group``) for HEAD and gate them against the baseline.

    docs/perf.md describes the policy; ``config`` (default: :class:`PerfStepConfig`'s defaults)
    says how.

    The base is the merge-base of HEAD with the default branch (HEAD's first parent on the
    default branch itself). ``config.measure_base`` says where its results come from:

    - "never" (``harness ci`` locally, the GPU runner): stored results of the nearest
      first-parent ancestor of the base that has results on this machine and environment.
    - "always" (the CPU pull-request job): the base is measured in this run, interleaved with
      HEAD; results stored by other machines of the same name are not trusted.
    - "missing": stored results when there are some, else measure as "always".

    When the base is measured here, asv runs base and HEAD alternately over ``passes`` runs
    each (the record, and the verdict for track/peakmem benchmarks and failures), and then
    every timing benchmark comparable on both sides is timed again in ``ab_pairs`` interleaved
    A/B pairs (ab.py: base and head sampled alternately, milliseconds apart), which decide its
    verdict; 0 disables that and the asv samples decide, pass by pass. GPU-group timing
    benchmarks are timed in GPU A/B pairs instead (gpu_ab.py: both sides in one process,
    CUDA events, L2 flushed), stored base or not. ``bench`` narrows the group with a regex
    (as ``harness perf run --bench``).

    Without a baseline ("never"/"missing": no ancestor has results and no stored baseline
    applies), the step says so, keeps this run's results as the baseline (baselines.py) so
    that the next run gates, and exits 0, or 2 under ``require_baseline``. Writes perf.md,
    perf-gate.json and perf-run.log into report_dir. A bad $HARNESS_PERF_MACHINE and an
    unusable report_dir raise PerfError before any benchmark runs (bad settings already did,
    in PerfStepConfig); a missing project or commit is exit 2.
    """
    config = config or PerfStepConfig()
    machine = resolve_machine(config.machine)
    if config.counts:
        check_counts_tools()  # valgrind and the shim before any work (PerfError: exit 2)
    report_dir = Path(report_dir)
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PerfError(
            f"report directory {str(report_dir)!r} cannot be created ({exc.strerror}): "
            "give --report-dir a writable folder"
        ) from None
    try:
        return _ci_step(Path(repo_root), report_dir, config, machine=machine, echo=echo)
    except PerfError as exc:  # no asv.conf.json, not a git checkout, unknown base ref...
        reason = f"perf step could not run: {exc}"
        markdown = f"### Performance\n\n**{reason}** (exit {EXIT_NOT_COMPARABLE})"
        (report_dir / "perf.md").write_text(markdown + "\n")
        return PerfStepResult(EXIT_NOT_COMPARABLE, markdown, reason)


def _ci_step(
    repo_root: Path,
    report_dir: Path,
    config: PerfStepConfig,
    *,
    machine: str,
    echo: Echo | None,
) -> PerfStepResult:
    measure_base, group, quick = config.measure_base, config.group, config.quick
    Project.load(repo_root)  # fails first, and clearly, where there is no asv project
    env = env_name()
    head = resolve_commit(Path(repo_root), "HEAD")
    title = (
        f"### Performance (asv, machine `{machine}`, "
        f"{'quick' if quick else 'full'} run, {group.upper()} group)"
    )
    log: list[str] = []
    run_kwargs: dict[str, Any] = {
        "group": group,
        "bench": config.bench,
        "quick": quick,
        "machine": machine,
        "echo": echo,
    }

    def finish(
        code: int,
        body: list[str],
        skipped: str | None,
        gate_report: GateReport | None = None,
        recorded: str | None = None,
    ) -> PerfStepResult:
        markdown = "\n\n".join([title, *body])
        (report_dir / "perf.md").write_text(markdown + "\n")
        (report_dir / "perf-run.log").write_text("\n".join(log) + "\n")
        gate_json = report_dir / "perf-gate.json"
        if gate_report is not None:
            gate_json.write_text(json.dumps(gate_report.to_json(), indent=2) + "\n")
        else:
            gate_json.unlink(missing_ok=True)  # never leave an older run's verdict behind
        return PerfStepResult(code, markdown, skipped, recorded)

    found = merge_base(repo_root, base_ref=config.base_ref)
    baseline: str | None = None
    stored: StoredBaseline | None = None
    base_note, base_problem = "", ""
    outcomes: list[RunOutcome] = []
    if found:
        start, how = found
        if measure_base != "always":
            baseline = find_baseline(repo_root, start, machine=machine, env=env)
        if baseline is None and measure_base != "never":
            try:
                outcomes = run_interleaved(
                    repo_root, [start, "HEAD"], passes=config.passes, **run_kwargs
                )
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
    if baseline is None and measure_base != "always":
        stored = stored_baseline(repo_root, machine=machine, env=env)
        if stored is not None:
            baseline = stored.commit
            base_note = f"Baseline: {stored.describe()} (no stored results for an ancestor)."
    if not outcomes:
        outcomes = [run_benchmarks(repo_root, commit="HEAD", **run_kwargs)]
    head_outcome = outcomes[-1]
    run_note = f"Head: `{head[:10]}` ({head_outcome.source}), environment `{env}`."

    if baseline is None:
        for outcome in outcomes:
            log.extend(outcome.log)
        failed_run = any(o.exit_code != 0 for o in outcomes)
        if found is None:
            reason = (
                "no baseline: HEAD has no merge-base with the default branch "
                f"(tried {', '.join(default_branch_refs(Path(repo_root)))})"
            )
        elif measure_base == "never":
            reason = (
                f"no baseline: no stored results for the {found[1]} ({found[0][:10]}) or "
                f"its {BASELINE_SEARCH_DEPTH - 1} first-parent ancestors on machine "
                f"`{machine}` in environment `{env}`, and no stored baseline"
            )
        else:
            reason = (
                f"no baseline: the {found[1]} ({found[0][:10]}) has no results in "
                f"environment `{env}`{base_problem}"
            )
        if measure_base != "always":
            # A stored baseline of another machine or environment is not this one's: name it,
            # so that "no baseline" beside a stored one is no mystery, and say it is kept.
            reason += others_note(repo_root, machine=machine, env=env)
        recorded: StoredBaseline | None = None
        # A run with failing benchmarks is not kept: they would be "failed in base" for every
        # run against it, never gated however slow they became once fixed.
        if (
            measure_base != "always"
            and not failed_run
            and has_results(repo_root, head, machine=machine, env=env)
        ):
            recorded = record_baseline(
                repo_root, head, machine=machine, env=env, source=head_outcome.source
            )
        kept = (
            f"this run is now {recorded.describe()}: the next run gates against it"
            if recorded
            else "nothing was kept as a baseline"
            + (
                ": benchmarks failed in this run, so the next run without a baseline records "
                "one instead"
                if failed_run and measure_base != "always"
                else ""
            )
        )
        if echo:
            echo(f"harness perf: NO BASELINE: {reason}; {kept}")
        code = (
            EXIT_REGRESSION
            if failed_run
            else EXIT_NOT_COMPARABLE
            if config.require_baseline
            else EXIT_OK
        )
        consequence = (
            "this fails the step (a baseline is required here)"
            if config.require_baseline
            else "nothing was gated"
        )
        body = [run_note, f"**Perf gate skipped: {reason}**; {consequence}.", f"**{kept}.**"]
        if failed_run:
            body.append(_run_failure(report_dir))
        return finish(
            code,
            body,
            f"{reason}; {kept}",
            recorded=str(recorded.results_dir) if recorded else None,
        )

    base_dir = stored.results_dir if stored else None
    report = gate(
        repo_root,
        baseline,
        head,
        factor=config.factor,
        machine=machine,
        base_results_dir=base_dir,
    )
    notes = [base_note, run_note]
    measured_here = found is not None and baseline == found[0] and len(outcomes) > 1
    if config.ab_pairs:
        names = ab_names(report, measured_here=measured_here)
        if names:
            ab = measure_ab(
                repo_root,
                baseline,
                names,
                factor=config.factor,
                pairs=config.ab_pairs,
                max_seconds=config.ab_budget_s,
                echo=echo,
                start=config.ab_start,
            )
            report = apply_ab(report, ab)
            why = (
                "all timing benchmarks"
                if measured_here
                else "the timing benchmarks the stored results left undecided or showed "
                "changed, against the base commit's code"
            )
            notes.append(
                f"Judged on interleaved A/B pairs (base and head sampled alternately, "
                f"milliseconds apart, in CPU time; {config.ab_pairs} first, more while "
                f"undecided, up to {config.ab_budget_s:g} s each; docs/perf.md): {why}, "
                f"{len(names)} benchmark(s)."
            )
        gpu_names = gpu_ab_names(report)
        if gpu_names:
            report, note = _gpu_ab(repo_root, baseline, gpu_names, report, config, echo)
            notes.append(note)
    if config.counts:
        report, note = counts_tier(
            repo_root,
            report,
            baseline,
            threshold=config.counts_threshold,
            pairs=config.ab_pairs or DEFAULT_PAIRS,
            budget_s=config.ab_budget_s,
            cache_sim=config.counts_cache_sim,
            echo=echo,
            start=config.ab_start,
        )
        notes.append(note)
    for outcome in outcomes:
        log.extend(outcome.log)
    failed_run = any(o.exit_code != 0 for o in outcomes)
    code = report.exit_code
    if failed_run and code == EXIT_OK:
        code = EXIT_REGRESSION
    body = [*notes, report.markdown()]
    if failed_run:
        body.append(_run_failure(report_dir))
    skipped = None
    if report.exit_code == EXIT_NOT_COMPARABLE:
        skipped = f"{report.verdict}: " + "; ".join(report.problems)
    return finish(code, body, skipped, report)


# What stored results' verdicts an A/B re-judges (ab_names says why).
REJUDGED_FROM_STORED = frozenset(
    {RowStatus.UNDECIDED, RowStatus.TOO_FEW_SAMPLES, RowStatus.REGRESSED, RowStatus.IMPROVED}
)


def ab_names(report: GateReport, *, measured_here: bool) -> list[str]:
    """The timing benchmarks the step times again in interleaved A/B pairs.

    Never the GPU group: A/B samples are CPU time, and a CUDA kernel's CPU time is its launch,
    not its run (gpu_ab_names: those get CUDA-event pairs). With the
    base measured in this run: every other candidate. With stored results (measured minutes or
    days apart, in wall time): what they leave undecided is measured again, and a change they
    show is confirmed (a load change between the runs reads as a change: unchanged code read
    "improved" 0.83x, and a slower base could hide a regression that way). Unchanged rows are
    kept: re-measuring every benchmark would cost every local run minutes.
    """
    gpu = re.compile(f"^{GROUPS['gpu']}")
    names = [n for n in ab_candidates(report) if not gpu.match(n)]
    if measured_here:
        return names
    status = {r.name: r.status for r in report.rows}
    return [n for n in names if status[n] in REJUDGED_FROM_STORED]


def gpu_ab_names(report: GateReport) -> list[str]:
    """The GPU group's timing benchmarks the step times in GPU A/B pairs (gpu_ab.py): all that
    are comparable on both sides, stored base or measured here (pairs of a ~1 ms kernel take a
    second or two, not minutes)."""
    gpu = re.compile(f"^{GROUPS['gpu']}")
    return [n for n in ab_candidates(report) if gpu.match(n)]


def _gpu_ab(
    repo_root: Path,
    baseline: str,
    names: list[str],
    report: GateReport,
    config: PerfStepConfig,
    echo: Echo | None,
) -> tuple[GateReport, str]:
    """GPU rows judged on CUDA-event A/B pairs; without a CUDA device they keep the asv
    samples' verdict (an undecided one still exits 2) and the note says why."""
    try:
        pairs = measure_gpu_ab(
            repo_root,
            baseline,
            names,
            factor=config.factor,
            pairs=config.ab_pairs,
            max_seconds=config.ab_budget_s,
            echo=echo,
        )
    except NoGpuError as exc:
        return report, f"GPU A/B pairs not taken ({exc}): the GPU rows are judged on asv's samples."
    report = apply_ab(report, pairs, method="GPU A/B pairs")
    return report, (
        f"GPU rows judged on GPU A/B pairs (base and head kernels in one process, each call "
        f"after an L2 flush, timed with CUDA events; {config.ab_pairs} pairs first, more while "
        f"undecided, up to {config.ab_budget_s:g} s each; docs/perf.md): {len(names)} "
        "benchmark(s)."
    )


def counts_tier(
    root: Path | str,
    report: GateReport,
    base_sha: str,
    *,
    threshold: float = DEFAULT_COUNT_THRESHOLD,
    pairs: int = DEFAULT_PAIRS,
    budget_s: float = MAX_SECONDS_PER_BENCHMARK,
    cache_sim: bool = False,
    echo: Echo | None = None,
    start: str = DEFAULT_START,
) -> tuple[GateReport, str]:
    """The instruction-count tier over the report's CPU timing benchmarks (counts.py): counts
    for base_sha and the working tree under Valgrind, then interleaved A/B pairs at factor
    1 + threshold for each count regression (or unstable count), and the report with both
    applied (gating.apply_counts), with a note for the summary."""
    gpu = re.compile(f"^{GROUPS['gpu']}")
    names = [n for n in ab_candidates(report) if not gpu.match(n)]
    if not names:
        return report, "Instruction counts: no comparable CPU timing benchmark to count."
    counted = measure_counts(root, base_sha, names, cache_sim=cache_sim, echo=echo)
    judged = {name: result.judge(threshold) for name, result in counted.items()}
    by_factor: dict[float, list[str]] = {}
    for name, found in judged.items():
        if found.verdict in NEEDS_CONFIRMATION:
            by_factor.setdefault(1 + found.threshold, []).append(name)
    confirm = {}
    for factor, todo in sorted(by_factor.items()):
        confirm.update(
            measure_ab(
                root,
                base_sha,
                todo,
                factor=factor,
                pairs=pairs,
                max_seconds=budget_s,
                echo=echo,
                start=start,
            )
        )
    note = (
        f"Instruction counts (callgrind, docs/perf.md): {len(names)} benchmark(s) counted at "
        f"threshold {threshold:.0%}; {len(confirm)} count regression(s) or unstable count(s) "
        "sent to A/B pairs for confirmation."
    )
    return apply_counts(report, judged, confirm), note


def _run_failure(report_dir: Path) -> str:
    return (
        "**asv run reported failing benchmarks or an error** (exit 1): see "
        f"{report_dir / 'perf-run.log'}."
    )
