"""Running the suites and the ``harness ci`` pipeline, as a library.

``harness run`` and ``harness ci`` (``harness.cli.runs``) only parse and check their
arguments and call these. Every report a run writes is first replaced by an "aborted"
placeholder and replaced again, atomically, only when its step has finished, so an
interrupted run never leaves an earlier run's verdict behind.
"""

from __future__ import annotations

import enum
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from harness import atomic
from harness import history as _history
from harness import prmode as _prmode
from harness import report as _report
from harness.processes import Terminated

console = Console(stderr=False, highlight=False)


class ReportDirError(ValueError):
    """The report folder cannot be created or written to (a usage error of the caller)."""


def make_report_dir(report_dir: Path, option: str = "--report-dir") -> Path:
    """Create the report folder; returns it with '.' and '..' parts folded away, which is the
    path to write to ('a/../out' must neither create 'a' nor need it to exist)."""
    folded = Path(os.path.normpath(report_dir))
    try:
        folded.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ReportDirError(
            f"{option} {str(report_dir)!r} cannot be created ({why}); "
            "give a folder you can write to"
        ) from None
    if not os.access(folded, os.W_OK | os.X_OK):
        raise ReportDirError(f"{option} {str(report_dir)!r} is not writable; give another folder")
    return folded


class RunAborted(Exception):
    """The run was interrupted (Ctrl-C); its reports say so. ``exit_code`` is 130 (SIGINT)."""

    exit_code = 130


@dataclass
class SuiteRun:
    """One pytest run of the suites: its exit status, its JSON report (None when it wrote
    none), its markdown summary and where the reports are."""

    exit_code: int
    report: dict[str, Any] | None
    markdown: str
    report_dir: Path


def run_suites(
    tiers: Sequence[str],
    report_dir: Path,
    *,
    seed: str | None = None,
    deterministic: str | None = None,
    update_goldens: bool = False,
    pytest_args: Sequence[str] = (),
    title: str | None = None,
    step_summary: bool = True,
) -> SuiteRun:
    """Run the suites through pytest in a fresh process; write junit.xml, report.json and
    summary.md to ``report_dir``; print the summary; append it to $GITHUB_STEP_SUMMARY.

    Every report is first replaced by an "aborted" placeholder and only replaced again, each
    atomically, once pytest has finished: a run that is interrupted (``RunAborted``) or stops
    at start-up leaves reports that say aborted, never the previous run's. Arguments are
    expected to be checked already (``_tier_list``, ``_check_seed``, ``_make_report_dir``).
    """
    title = title or f"ml-harness run ({', '.join(tiers) or 'all tiers'})"
    report_dir = make_report_dir(report_dir)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    _report.write_placeholders(
        report_dir,
        _report.RunStatus.ABORTED,
        f"the run started at {started} has not finished: it is still running, or it was "
        "interrupted or crashed",
        title=title,
    )
    # pytest writes its reports beside the real ones under temporary names; they replace the
    # placeholders only once complete (pytest's own JUnit writer is not atomic).
    junit_tmp = report_dir / f".junit.xml.{os.getpid()}{atomic.TEMP_SUFFIX}"
    json_tmp = report_dir / f".report.json.{os.getpid()}{atomic.TEMP_SUFFIX}"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        f"--junitxml={junit_tmp}",
        f"--harness-json={json_tmp}",
    ]
    if tiers:
        cmd.append(f"--tier={','.join(tiers)}")
    if seed is not None:
        cmd.append(f"--harness-seed={seed}")
    if deterministic is not None:
        cmd.append(f"--harness-deterministic={deterministic}")
    if update_goldens:
        cmd.append("--harness-update-goldens")
    cmd += list(pytest_args)
    shown = [a.replace(str(junit_tmp), str(report_dir / "junit.xml")) for a in cmd[1:]]
    shown = [a.replace(str(json_tmp), str(report_dir / "report.json")) for a in shown]
    console.print(f"[bold]$ python {' '.join(shown)}[/bold]", soft_wrap=True)
    try:
        code = _run_pytest(cmd)
    except KeyboardInterrupt as exc:
        junit_tmp.unlink(missing_ok=True)
        json_tmp.unlink(missing_ok=True)
        how = "a SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C (SIGINT)"
        reason = (
            f"interrupted by {how} during the run started at {started}; no report "
            "of it was kept: run it again"
        )
        _report.write_placeholders(report_dir, _report.RunStatus.ABORTED, reason, title=title)
        if step_summary:
            markdown = _report.placeholder_markdown(_report.RunStatus.ABORTED, reason, title=title)
            _report.append_step_summary(markdown)
        raise RunAborted(reason) from None
    try:
        return _finish(code, report_dir, junit_tmp, json_tmp, title, step_summary)
    finally:
        junit_tmp.unlink(missing_ok=True)
        json_tmp.unlink(missing_ok=True)


def _run_pytest(cmd: list[str]) -> int:
    """pytest's exit status. On Ctrl-C pytest (in the same process group) normally gets the
    SIGINT too and stops by itself; when only this process got it, pass it on. Either way wait
    for pytest to end, so no test keeps running behind an "aborted" report."""
    proc = subprocess.Popen(cmd)  # pytest's own progress streams straight to the terminal
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise


def _finish(
    code: int, report_dir: Path, junit_tmp: Path, json_tmp: Path, title: str, step_summary: bool
) -> SuiteRun:
    if not json_tmp.exists():
        reason = (
            f"pytest stopped before writing a report (exit status {code}): a usage or start-up "
            "error; see its output above"
        )
        _report.write_placeholders(report_dir, _report.RunStatus.ABORTED, reason, title=title)
        message = f"## {title}: ❌ {reason}"
        if step_summary:
            _report.append_step_summary(message)
        return SuiteRun(code or 1, None, message, report_dir)
    data = _report.load(json_tmp)
    markdown = _report.render_markdown(data, title=title)
    if _report.run_status(data) is _report.RunStatus.ABORTED:
        # pytest was interrupted (Ctrl-C reached it, not this process): its partial reports
        # would read as a finished run, so every report says aborted instead.
        reason = (
            f"pytest was interrupted by Ctrl-C (exit status {code}) after "
            f"{len(data.get('tests', []))} test(s); no report of the run was kept: run it again"
        )
        _report.write_placeholders(report_dir, _report.RunStatus.ABORTED, reason, title=title)
        markdown = _report.placeholder_markdown(_report.RunStatus.ABORTED, reason, title=title)
        if step_summary:
            _report.append_step_summary(markdown)
        return SuiteRun(code or 1, None, markdown, report_dir)
    if junit_tmp.exists():
        os.replace(junit_tmp, report_dir / "junit.xml")
    os.replace(json_tmp, report_dir / "report.json")
    atomic.write_text(report_dir / "summary.md", markdown + "\n")
    # Test history: appended only when $HARNESS_HISTORY_DB is set; a failure is one warning
    # line, never a change to this run's verdict.
    _history.record_run(data, report_dir / "report.json")
    if step_summary:
        _report.append_step_summary(markdown)
    if code == 5:
        console.print(
            "[red bold]pytest collected no tests (exit 5): a run that ran nothing fails[/]"
        )
    return SuiteRun(code, data, markdown, report_dir)


# --------------------------------------------------------------------------- ci


class StepStatus(enum.StrEnum):
    """How one step of ``harness ci`` ended (shown in its summary table)."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    """Not run, for a stated reason (no CUDA device, no baseline): does not fail the run."""


@dataclass
class Step:
    """One step of ``harness ci``: its name, how it ended, a one-line detail, its time."""

    name: str
    status: StepStatus
    detail: str
    seconds: float = 0.0


def _cuda_present() -> bool:
    from harness import environment

    return environment.cuda_available()


def _env_step(lock: Path | None, allow_extra: bool) -> Step:
    from harness import environment

    path = lock or environment.default_lock_path()
    if lock is None and not path.exists():
        # A project that keeps no lock file (most that adopt the harness) has nothing to
        # compare with: the step says so instead of failing every run, and --lock names one.
        return Step(
            "env check",
            StepStatus.SKIPPED,
            f"no lock file at {path}: nothing to compare the environment with "
            "(pass --lock FILE to check one)",
        )
    try:
        drift = environment.check(path)
    except environment.LockFileError as exc:
        return Step("env check", StepStatus.FAILED, str(exc))
    failing = [*drift.missing, *drift.wrong_version, *(() if allow_extra else drift.extra)]
    if not failing:
        extra = f" ({len(drift.extra)} extra distribution(s) allowed)" if drift.extra else ""
        return Step(
            "env check", StepStatus.PASSED, f"installed distributions match {path.name}{extra}"
        )
    for item in failing:
        console.print(f"  [red]{item}[/]", markup=True)
    return Step(
        "env check",
        StepStatus.FAILED,
        f"{len(failing)} package(s) drift from {path.name}: "
        + "; ".join(str(p) for p in failing[:5]),
    )


def _perf_step(report_dir: Path, bench: str | None = None, base_ref: str | None = None) -> Step:
    try:
        from harness import perf
    except ImportError as exc:  # pragma: no cover - perf ships with the harness
        return Step("perf gate", StepStatus.FAILED, f"harness.perf unavailable: {exc}")
    try:
        # The baseline comes from the same base the tests were selected from: a guessed
        # default branch could be another one and store the branch's code as the baseline.
        config = perf.PerfStepConfig(bench=bench, base_ref=base_ref)
    except perf.PerfError as exc:  # a pattern pull-request mode derived that does not compile
        return Step("perf gate", StepStatus.FAILED, f"perf step could not run: {exc}")
    result = perf.ci_step(Path.cwd(), report_dir, config)
    status = StepStatus.PASSED if result.exit_code == 0 else StepStatus.FAILED
    if result.skipped_reason and result.exit_code == 0:
        status = StepStatus.SKIPPED
    first_line = result.markdown.strip().splitlines()[0] if result.markdown.strip() else ""
    return Step("perf gate", status, result.skipped_reason or first_line)


def _steps_markdown(steps: Sequence[Step], ok: bool) -> str:
    lines = [
        f"# harness ci: {'✅ passed' if ok else '❌ failed'}",
        "",
        "| step | status | time | detail |",
        "|---|---|---|---|",
    ]
    icon = {StepStatus.PASSED: "✅", StepStatus.FAILED: "❌", StepStatus.SKIPPED: "⏭️"}
    for s in steps:
        detail = " ".join(s.detail.split()).replace("|", "\\|")
        lines.append(
            f"| {s.name} | {icon.get(s.status, '')} {s.status} | {s.seconds:.1f} s | {detail} |"
        )
    return "\n".join(lines) + "\n"


# The reports harness.perf.ci_step writes into REPORT_DIR/perf (removed at the start of a run).
_PERF_REPORTS = ("perf.md", "perf-gate.json", "perf-run.log")


def _ci_steps(
    report_dir: Path,
    tier_names: list[str],
    lock: Path | None,
    seed: str | None,
    perf: bool,
    steps: list[Step],
    plan: _prmode.Plan | None = None,
) -> tuple[bool, str]:
    """Run the steps of ``harness ci`` in order, appending each to ``steps``; returns whether
    all passed (or were skipped for a stated reason) and the markdown summary."""
    cuda = _cuda_present()
    markdowns: list[str] = []
    plan = plan or _prmode.Plan(selection=None, note="full run: every test and benchmark")

    def timed(fn: Callable[..., Step], *args: Any) -> Step:
        start = time.monotonic()
        step = fn(*args)
        step.seconds = time.monotonic() - start
        steps.append(step)
        style = {
            StepStatus.PASSED: "green",
            StepStatus.FAILED: "red",
            StepStatus.SKIPPED: "yellow",
        }[step.status]
        console.print(
            f"[{style}]{step.name}: {step.status}[/] ({step.seconds:.1f} s) {step.detail}",
            markup=True,
        )
        return step

    total = 3 + int(perf)
    console.rule(f"[1/{total}] env check")
    # A GPU runner's venv sees the image's torch, triton and CUDA libraries
    # (--system-site-packages): check it against the GPU profile, extras allowed.
    if lock is None and cuda:
        lock = Path("requirements/gpu.lock")
    timed(_env_step, lock, cuda)

    def tests_step(name: str, names: list[str], subdir: str) -> Step:
        outcome = run_suites(
            names,
            report_dir / subdir,
            seed=seed,
            title=f"harness ci: {name}",
            step_summary=False,
            pytest_args=plan.pytest_args if subdir == "cpu" else (),
        )
        markdowns.append(outcome.markdown)
        counts = _report.tier_counts(outcome.report) if outcome.report else {}
        total_counts = sum(counts.values(), Counter())
        detail = ", ".join(f"{n} {o}" for o, n in total_counts.items() if n) or "no report"
        passed = outcome.exit_code == 0
        return Step(name, StepStatus.PASSED if passed else StepStatus.FAILED, detail)

    console.rule(f"[2/{total}] cpu tiers: {', '.join(tier_names) or 'all'}")
    if plan.skip_tests:
        steps.append(Step("cpu tiers", StepStatus.SKIPPED, plan.skip_tests))
        make_report_dir(report_dir / "cpu")
        _report.write_placeholders(
            report_dir / "cpu",
            _report.RunStatus.SKIPPED,
            plan.skip_tests,
            title="harness ci: cpu tiers",
        )
        console.print(f"[yellow]cpu tiers: skipped[/] ({plan.skip_tests})")
    else:
        timed(tests_step, "cpu tiers", tier_names, "cpu")
    console.rule(f"[3/{total}] gpu tier")
    if cuda:
        timed(tests_step, "gpu tier", ["gpu"], "gpu")
    else:
        reason = "no CUDA device visible to torch on this machine"
        steps.append(Step("gpu tier", StepStatus.SKIPPED, reason))
        make_report_dir(report_dir / "gpu")
        _report.write_placeholders(
            report_dir / "gpu", _report.RunStatus.SKIPPED, reason, title="harness ci: gpu tier"
        )
        console.print(f"[yellow]gpu tier: skipped[/] ({reason})")
    # The perf gate plugs in here: harness.perf.ci_step runs the benchmarks and gates them.
    if perf:
        console.rule(f"[4/{total}] perf gate")
        if plan.skip_perf:
            steps.append(Step("perf gate", StepStatus.SKIPPED, plan.skip_perf))
            console.print(f"[yellow]perf gate: skipped[/] ({plan.skip_perf})")
        else:
            timed(_perf_step, report_dir / "perf", plan.bench, plan.base_ref)
    ok = all(s.status is not StepStatus.FAILED for s in steps)
    return ok, _steps_markdown(steps, ok) + f"\n{plan.note}\n\n" + "\n".join(markdowns)


@dataclass
class CiResult:
    """What ``run_ci`` leaves: whether every step passed (or was skipped for a stated reason),
    the markdown summary (also in REPORT_DIR/summary.md) and the reports written."""

    ok: bool
    summary: str
    written: list[Path] = field(default_factory=list)


def _write_ci_aborted(report_dir: Path, reason: str) -> None:
    atomic.write_text(
        report_dir / "summary.md",
        _report.placeholder_markdown(_report.RunStatus.ABORTED, reason, title="harness ci"),
    )


def begin_ci(report_dir: Path) -> tuple[Path, Callable[[str], None]]:
    """Create REPORT_DIR and mark every report in it "aborted" before anything runs.

    Returns the folded report folder and a function that records why the run stopped (a
    usage error found after this, say) in its summary.
    """
    report_dir = make_report_dir(report_dir)
    started = time.strftime("%Y-%m-%d %H:%M:%S")

    def aborted(reason: str) -> None:
        _write_ci_aborted(report_dir, reason)

    aborted(
        f"the run started at {started} has not finished: it is still running, or it was "
        "interrupted or crashed"
    )
    # Every step's reports from an earlier run are replaced before anything runs, so an
    # interrupted run never leaves one of them saying "passed".
    for sub in ("cpu", "gpu"):
        if (report_dir / sub).is_dir():
            _report.write_placeholders(
                report_dir / sub,
                _report.RunStatus.ABORTED,
                f"harness ci started at {started} has not reached this step",
                title=f"harness ci: {sub}",
            )
    for name in _PERF_REPORTS:
        (report_dir / "perf" / name).unlink(missing_ok=True)
    return report_dir, aborted


def run_ci(
    report_dir: Path,
    tier_names: list[str],
    lock: Path | None,
    seed: str | None,
    perf: bool,
    plan: _prmode.Plan | None = None,
) -> CiResult:
    """Run the steps of ``harness ci`` (after ``begin_ci``) and write the summary.

    Raises ``RunAborted`` on Ctrl-C, after the summary says where the run stopped.
    """
    steps: list[Step] = []
    try:
        ok, summary = _ci_steps(report_dir, tier_names, lock, seed, perf, steps, plan)
    except (KeyboardInterrupt, RunAborted):
        where = f"during step {len(steps) + 1} (after {', '.join(s.name for s in steps)})"
        reason = (
            f"interrupted by Ctrl-C (SIGINT) {where if steps else 'during the env check'}; "
            "run it again"
        )
        _write_ci_aborted(report_dir, reason)
        raise RunAborted(reason) from None
    summary_path = report_dir / "summary.md"
    atomic.write_text(summary_path, summary)
    _report.append_step_summary(summary)
    written = [
        summary_path,
        *(d for d in (report_dir / n for n in ("cpu", "gpu", "perf")) if d.is_dir()),
    ]
    return CiResult(ok, summary, written)
