"""`harness run`, `harness ci` and `harness flaky`: running suites and reading the results."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness import atomic, seeding
from harness import flaky as _flaky
from harness import report as _report
from harness import tiers as _tiers
from harness.cli.errors import UsageProblem

console = Console(stderr=False, highlight=False)

CPU_TIERS = ("unit", "property", "integration", "distributed")


def _project_root() -> Path:
    """The nearest directory at or above the current one with a pyproject.toml (pytest's
    rootdir in this project's layout), else the current directory."""
    here = Path.cwd().resolve()
    return next((d for d in (here, *here.parents) if (d / "pyproject.toml").is_file()), here)


def _tier_list(value: str | None, option: str = "--tier") -> list[str]:
    """The tier names in ``value`` (comma-separated), checked against the project's tiers.

    An empty name (``--tier ',,,'``, ``--tier 'unit,'``) is an error rather than nothing: an
    empty selection would otherwise mean "every tier", which nobody asked for.
    """
    if value is None:
        return []
    names = [name.strip() for name in value.split(",")]
    try:
        known = _tiers.project_tiers(_project_root())
    except _tiers.TierConfigError as exc:
        raise UsageProblem(str(exc)) from None
    if not all(names):
        raise UsageProblem(
            f"{option} {value!r} has an empty tier name; give tier names separated by commas, "
            f"e.g. {option} unit,property (known tiers: {', '.join(known)})"
        )
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UsageProblem(
            f"{option}: unknown tier(s) {', '.join(map(repr, unknown))}; "
            f"known tiers: {', '.join(known)}"
        )
    return list(dict.fromkeys(names))


def _check_seed(value: str | None, option: str = "--seed") -> str | None:
    """``value`` when it is a seed, 'last' or 'random' (what pytest's --harness-seed takes)."""
    if value is None or value in ("last", "random"):
        return value
    try:
        seeding.parse_seed(value)
    except ValueError as exc:
        raise UsageProblem(f"{option}: {exc}; or 'last', or 'random'") from None
    return value


# Options that would send pytest's reports elsewhere than the report directory (leaving the
# reports there from an earlier run) or switch the harness plugin off (no JSON report).
_OWNED_OPTIONS = ("--junitxml", "--junit-xml", "--harness-json", "--junit-prefix")


def _check_pytest_args(args: Sequence[str]) -> list[str]:
    """The arguments for pytest, refusing those that would leave the report directory stale."""
    for i, arg in enumerate(args):
        name = arg.split("=", 1)[0]
        plugin = arg[2:] if arg.startswith("-p") and len(arg) > 2 else None
        if plugin is None and arg == "-p" and i + 1 < len(args):
            plugin = args[i + 1]
        if name in _OWNED_OPTIONS or (plugin or "").strip() == "no:harness":
            raise UsageProblem(
                f"{arg!r} cannot be passed through to pytest: harness run writes junit.xml, "
                "report.json and summary.md itself (with the harness plugin on); choose where "
                "with --report-dir"
            )
    return list(args)


def _make_report_dir(report_dir: Path, option: str = "--report-dir") -> Path:
    """Create the report folder; returns it with '.' and '..' parts folded away, which is the
    path to write to ('a/../out' must neither create 'a' nor need it to exist)."""
    folded = Path(os.path.normpath(report_dir))
    try:
        folded.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise UsageProblem(
            f"{option} {str(report_dir)!r} cannot be created ({why}); "
            "give a folder you can write to"
        ) from None
    if not os.access(folded, os.W_OK | os.X_OK):
        raise UsageProblem(f"{option} {str(report_dir)!r} is not writable; give another folder")
    return folded


class RunAborted(Exception):
    """The run was interrupted (Ctrl-C); its reports say so. ``exit_code`` is 130 (SIGINT)."""

    exit_code = 130


@dataclass
class RunOutcome:
    exit_code: int
    report: dict | None
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
) -> RunOutcome:
    """Run the suites through pytest in a fresh process; write junit.xml, report.json and
    summary.md to ``report_dir``; print the summary; append it to $GITHUB_STEP_SUMMARY.

    Every report is first replaced by an "aborted" placeholder and only replaced again, each
    atomically, once pytest has finished: a run that is interrupted (``RunAborted``) or stops
    at start-up leaves reports that say aborted, never the previous run's. Arguments are
    expected to be checked already (``_tier_list``, ``_check_seed``, ``_make_report_dir``).
    """
    title = title or f"ml-harness run ({', '.join(tiers) or 'all tiers'})"
    report_dir = _make_report_dir(report_dir)
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
    except KeyboardInterrupt:
        junit_tmp.unlink(missing_ok=True)
        json_tmp.unlink(missing_ok=True)
        reason = (
            f"interrupted by Ctrl-C (SIGINT) during the run started at {started}; no report "
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
) -> RunOutcome:
    if not json_tmp.exists():
        reason = (
            f"pytest stopped before writing a report (exit status {code}): a usage or start-up "
            "error; see its output above"
        )
        _report.write_placeholders(report_dir, _report.RunStatus.ABORTED, reason, title=title)
        message = f"## {title}: ❌ {reason}"
        if step_summary:
            _report.append_step_summary(message)
        return RunOutcome(code or 1, None, message, report_dir)
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
        return RunOutcome(code or 1, None, markdown, report_dir)
    if junit_tmp.exists():
        os.replace(junit_tmp, report_dir / "junit.xml")
    os.replace(json_tmp, report_dir / "report.json")
    atomic.write_text(report_dir / "summary.md", markdown + "\n")
    if step_summary:
        _report.append_step_summary(markdown)
    if code == 5:
        console.print(
            "[red bold]pytest collected no tests (exit 5): a run that ran nothing fails[/]"
        )
    return RunOutcome(code, data, markdown, report_dir)


def _print_summary(outcome: RunOutcome) -> None:
    console.rule("summary")
    click.echo(outcome.markdown)
    console.print(
        f"reports: {outcome.report_dir / 'junit.xml'}, {outcome.report_dir / 'report.json'}, "
        f"{outcome.report_dir / 'summary.md'}"
    )


@click.command(
    name="run",
    context_settings={"ignore_unknown_options": True},
    epilog="""\b
Examples:
  harness run --tier unit                      # one tier, reports in reports/
  harness run --tier unit,property --seed 42   # replay a seed
  harness run -- -k quarantine -x              # anything after -- goes to pytest
""",
)
@click.option(
    "--tier",
    "tiers",
    metavar="TIER[,TIER]",
    help="Tiers to run (folders under suites/). Default: every tier.",
)
@click.option(
    "--report-dir",
    type=click.Path(path_type=Path),
    default=Path("reports"),
    show_default=True,
    help="Where junit.xml, report.json and summary.md are written.",
)
@click.option("--seed", metavar="N|last", help="Base seed of the run (default: random, printed).")
@click.option(
    "--deterministic",
    type=click.Choice(["auto", "on", "off"]),
    default=None,
    help="Deterministic torch mode (default: auto, on under $CI).",
)
@click.option(
    "--update-goldens", is_flag=True, help="Record golden values instead of comparing them."
)
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def run_command(tiers, report_dir, seed, deterministic, update_goldens, pytest_args) -> None:
    """Run the suites and write JUnit XML, a JSON report and a markdown summary.

    The summary (per tier: passed / failed / skipped with reasons / quarantined, the seed and
    the environment fingerprint) is printed, written to REPORT_DIR/summary.md and appended to
    $GITHUB_STEP_SUMMARY when that is set. Exits with pytest's exit status: 0 all passed
    (quarantined failures do not gate), 1 failures or quarantine problems, 5 nothing ran.
    """
    report_dir = _make_report_dir(report_dir)
    try:
        names = _tier_list(tiers)
        seed = _check_seed(seed)
        args = _check_pytest_args(pytest_args)
    except UsageProblem as exc:
        # The run stops before it starts: its reports say so rather than an earlier run's.
        _report.write_placeholders(
            report_dir, _report.RunStatus.ABORTED, f"usage error, nothing ran: {exc.message}"
        )
        raise
    try:
        outcome = run_suites(
            names,
            report_dir,
            seed=seed,
            deterministic=deterministic,
            update_goldens=update_goldens,
            pytest_args=args,
        )
    except RunAborted as exc:
        console.print(f"[red bold]aborted[/]: {exc}; the reports in {report_dir} say so")
        sys.exit(RunAborted.exit_code)
    _print_summary(outcome)
    sys.exit(outcome.exit_code)


# --------------------------------------------------------------------------- ci


@dataclass
class Step:
    name: str
    status: str  # passed | failed | skipped
    detail: str
    seconds: float = 0.0


def _cuda_present() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _env_step(lock: Path | None, allow_extra: bool) -> Step:
    from harness import environment

    path = lock or environment.default_lock_path()
    try:
        drift = environment.check(path)
    except environment.LockFileError as exc:
        return Step("env check", "failed", str(exc))
    failing = [*drift.missing, *drift.wrong_version, *(() if allow_extra else drift.extra)]
    if not failing:
        extra = f" ({len(drift.extra)} extra distribution(s) allowed)" if drift.extra else ""
        return Step("env check", "passed", f"installed distributions match {path.name}{extra}")
    for item in failing:
        console.print(f"  [red]{item}[/]", markup=True)
    return Step(
        "env check",
        "failed",
        f"{len(failing)} package(s) drift from {path.name}: "
        + "; ".join(str(p) for p in failing[:5]),
    )


def _perf_step(report_dir: Path) -> Step:
    try:
        from harness import perf
    except ImportError as exc:  # pragma: no cover - perf ships with the harness
        return Step("perf gate", "failed", f"harness.perf unavailable: {exc}")
    result = perf.ci_step(Path.cwd(), report_dir)
    status = "passed" if result.exit_code == 0 else "failed"
    if result.skipped_reason and result.exit_code == 0:
        status = "skipped"
    first_line = result.markdown.strip().splitlines()[0] if result.markdown.strip() else ""
    return Step("perf gate", status, result.skipped_reason or first_line)


def _steps_markdown(steps: Sequence[Step], ok: bool) -> str:
    lines = [
        f"# harness ci: {'✅ passed' if ok else '❌ failed'}",
        "",
        "| step | status | time | detail |",
        "|---|---|---|---|",
    ]
    icon = {"passed": "✅", "failed": "❌", "skipped": "⏭️"}
    for s in steps:
        detail = " ".join(s.detail.split()).replace("|", "\\|")
        lines.append(
            f"| {s.name} | {icon.get(s.status, '')} {s.status} | {s.seconds:.1f} s | {detail} |"
        )
    return "\n".join(lines) + "\n"


@click.command(
    name="ci",
    epilog="""\b
Steps, in order (each one runs even when an earlier one failed, so one run shows everything):
  1. env check      installed distributions vs the lock file
  2. cpu tiers      unit, property, integration, distributed (one pytest run)
  3. gpu tier       when CUDA is present; otherwise reported as skipped with the reason
  4. perf gate      asv benchmarks vs the baseline (harness perf), unless --no-perf
  5. report         REPORT_DIR/summary.md (+ $GITHUB_STEP_SUMMARY), per-step reports below it
""",
)
@click.option(
    "--report-dir", type=click.Path(path_type=Path), default=Path("reports"), show_default=True
)
@click.option(
    "--tier",
    "tiers",
    metavar="TIER[,TIER]",
    default=",".join(CPU_TIERS),
    show_default=True,
    help="CPU tiers to run.",
)
@click.option(
    "--lock",
    type=click.Path(path_type=Path),
    default=None,
    help="Lock file for the env check (default: requirements/cpu.lock; "
    "requirements/gpu.lock when CUDA is present).",
)
@click.option("--seed", metavar="N|last", help="Base seed (default: random, printed).")
@click.option("--perf/--no-perf", default=True, show_default=True, help="Run the perf gate step.")
def ci_command(
    report_dir: Path, tiers: str, lock: Path | None, seed: str | None, perf: bool
) -> None:
    """The main job: the same pipeline the GitHub workflow runs, locally.

    Exits 0 when every step passed or was skipped for a stated reason, 1 otherwise, 2 for a
    usage error and 130 when interrupted (Ctrl-C). From the start every report in REPORT_DIR
    says "aborted" until the step that writes it has finished.
    """
    report_dir = _make_report_dir(report_dir)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    summary_path = report_dir / "summary.md"

    def aborted(reason: str) -> None:
        atomic.write_text(
            summary_path,
            _report.placeholder_markdown(_report.RunStatus.ABORTED, reason, title="harness ci"),
        )

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
    try:
        tier_names = _tier_list(tiers)
        seed = _check_seed(seed)
    except UsageProblem as exc:
        aborted(f"usage error, nothing ran: {exc.message}")
        raise
    steps: list[Step] = []
    try:
        ok, summary = _ci_steps(report_dir, tier_names, lock, seed, perf, steps)
    except (KeyboardInterrupt, RunAborted):
        where = f"during step {len(steps) + 1} (after {', '.join(s.name for s in steps)})"
        aborted(
            f"interrupted by Ctrl-C (SIGINT) {where if steps else 'during the env check'}; "
            "run it again"
        )
        console.print(f"[red bold]harness ci aborted[/]; the reports in {report_dir} say so")
        sys.exit(RunAborted.exit_code)
    atomic.write_text(summary_path, summary)
    _report.append_step_summary(summary)
    console.rule("harness ci summary")
    click.echo(summary)
    written = [
        summary_path,
        *(d for d in (report_dir / n for n in ("cpu", "gpu", "perf")) if d.is_dir()),
    ]
    console.print("reports: " + ", ".join(map(str, written)), soft_wrap=True)
    sys.exit(0 if ok else 1)


# The reports harness.perf.ci_step writes into REPORT_DIR/perf (removed at the start of a run).
_PERF_REPORTS = ("perf.md", "perf-gate.json", "perf-run.log")


def _ci_steps(
    report_dir: Path,
    tier_names: list[str],
    lock: Path | None,
    seed: str | None,
    perf: bool,
    steps: list[Step],
) -> tuple[bool, str]:
    """Run the steps of ``harness ci`` in order, appending each to ``steps``; returns whether
    all passed (or were skipped for a stated reason) and the markdown summary."""
    cuda = _cuda_present()
    markdowns: list[str] = []

    def timed(fn, *args) -> Step:
        start = time.monotonic()
        step = fn(*args)
        step.seconds = time.monotonic() - start
        steps.append(step)
        style = {"passed": "green", "failed": "red", "skipped": "yellow"}[step.status]
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
        )
        markdowns.append(outcome.markdown)
        counts = _report.tier_counts(outcome.report) if outcome.report else {}
        total_counts = sum(counts.values(), Counter())
        detail = ", ".join(f"{n} {o}" for o, n in total_counts.items() if n) or "no report"
        return Step(name, "passed" if outcome.exit_code == 0 else "failed", detail)

    console.rule(f"[2/{total}] cpu tiers: {', '.join(tier_names) or 'all'}")
    timed(tests_step, "cpu tiers", tier_names, "cpu")
    console.rule(f"[3/{total}] gpu tier")
    if cuda:
        timed(tests_step, "gpu tier", ["gpu"], "gpu")
    else:
        reason = "no CUDA device visible to torch on this machine"
        steps.append(Step("gpu tier", "skipped", reason))
        _make_report_dir(report_dir / "gpu")
        _report.write_placeholders(
            report_dir / "gpu", _report.RunStatus.SKIPPED, reason, title="harness ci: gpu tier"
        )
        console.print(f"[yellow]gpu tier: skipped[/] ({reason})")
    # The perf gate plugs in here: harness.perf.ci_step runs the benchmarks and gates them.
    if perf:
        console.rule(f"[4/{total}] perf gate")
        timed(_perf_step, report_dir / "perf")
    ok = all(s.status != "failed" for s in steps)
    return ok, _steps_markdown(steps, ok) + "\n" + "\n".join(markdowns)


# --------------------------------------------------------------------------- flaky


def _hunt_with_progress(
    test: str, runs: int, seed: int | None, seeds: list[int] | None, timeout: float
) -> _flaky.Hunt:
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[last]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task(test, total=2 * runs, last="")

        def progress(phase: str, result: _flaky.RunResult) -> None:
            if phase == "confirm" and bar.tasks[0].total is not None:
                bar.update(task, total=bar.tasks[0].total + 1)
            bar.update(task, advance=1, last=f"{phase} seed {result.seed}: {result.outcome}")

        return _flaky.hunt(
            test, runs=runs, base_seed=seed, new_seeds=seeds, timeout_s=timeout, progress=progress
        )


def _hunt_markdown(hunts: Sequence[_flaky.Hunt]) -> str:
    lines = [
        "## harness flaky",
        "",
        "| test | verdict | failing seeds | detail |",
        "|---|---|---|---|",
    ]
    for h in hunts:
        seeds = ", ".join(map(str, h.failing_seeds[:10])) or "-"
        detail = " ".join(h.detail.split()).replace("|", "\\|")[:300]
        lines.append(f"| `{h.test}` | {h.verdict} | {seeds} | {detail} |")
    return "\n".join(lines) + "\n"


@click.command(
    name="flaky",
    epilog="""\b
Verdicts and exit codes:
  0  stable                 passed every run
  1  deterministic failure  failed under every seed
  3  seed-dependent         some seeds fail, reproducibly (they are listed)
  4  nondeterministic       outcomes differ under the same seed (unseeded randomness, timing)
  5  could not run          not collected, skipped, or a usage/collection error
  2  usage error of this command
With --quarantined the exit code is 0 once every entry was hunted (the verdicts are the
report), and 5 when an entry could not be run.

\b
Examples:
  harness flaky 'suites/unit/test_x.py::test_y' --runs 20
  harness flaky --quarantined --runs 10 --report-dir reports/flaky
""",
)
@click.argument("test", required=False)
@click.option(
    "--runs",
    type=click.IntRange(min=2),
    default=10,
    show_default=True,
    help="Runs under the same seed, and as many under new seeds.",
)
@click.option(
    "--seed",
    default=None,
    metavar="N",
    help="The fixed base seed, in [0, 2**32) (default: random).",
)
@click.option(
    "--seeds", default=None, metavar="S1,S2,...", help="The new seeds to try (default: random)."
)
@click.option("--quarantined", is_flag=True, help="Hunt every test in quarantine.toml.")
@click.option(
    "--quarantine-file",
    type=click.Path(path_type=Path),
    default=Path("quarantine.toml"),
    show_default=True,
)
@click.option(
    "--timeout",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds per run before it counts as a failure (a finite number > 0).",
)
@click.option(
    "--report-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Write flaky.json and flaky.md here (and append to $GITHUB_STEP_SUMMARY).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def flaky_command(
    test, runs, seed, seeds, quarantined, quarantine_file, timeout, report_dir, as_json
) -> None:
    """Rerun one test in fresh processes under one seed and under new seeds, and classify it.

    Never a retry: the point is to learn why a test flakes, not to make it pass.
    """
    from harness import quarantine as _quarantine

    if quarantined == bool(test):
        raise click.UsageError("give either a TEST node id or --quarantined")
    if test is not None:
        problem = _quarantine.node_id_problem(test)
        if problem is not None:
            raise UsageProblem(f"TEST: {problem}")
    base_seed = None
    if seed is not None:
        try:
            base_seed = seeding.parse_seed(seed)
        except ValueError as exc:
            raise UsageProblem(f"--seed: {exc}") from None
    seed_list = _seed_list(seeds) if seeds is not None else None
    # A timeout of 0, below 0 or NaN fails every run: a passing test would be called a
    # deterministic failure. inf would let one hung run block the hunt forever.
    if not (math.isfinite(timeout) and timeout > 0):
        raise UsageProblem(
            f"--timeout must be a finite number of seconds > 0, got {timeout!r}; e.g. --timeout 600"
        )
    if report_dir is not None:
        report_dir = _make_report_dir(report_dir)
        _write_flaky_reports(
            report_dir,
            [],
            f"## harness flaky: ❌ aborted\n\nThe hunt started at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} has not finished: it is still running, or "
            "it was interrupted or crashed.\n",
            status=_report.RunStatus.ABORTED,
        )
    if quarantined:
        try:
            tests = [e.test for e in _quarantine.load(quarantine_file)]
        except (_quarantine.QuarantineError, OSError) as exc:
            raise UsageProblem(str(exc)) from None
        if not tests:
            console.print(f"{quarantine_file}: no quarantined tests to hunt")
    else:
        tests = [test]
    hunts = [_hunt_with_progress(t, runs, base_seed, seed_list, timeout) for t in tests]
    markdown = _hunt_markdown(hunts)
    if report_dir:
        _write_flaky_reports(report_dir, hunts, markdown)
        _report.append_step_summary(markdown)
    if as_json:
        click.echo(
            json.dumps(
                [h.to_dict() for h in hunts] if quarantined else hunts[0].to_dict(), indent=2
            )
        )
    else:
        table = Table("test", "verdict", "failing seeds", "detail", show_lines=False)
        for h in hunts:
            table.add_row(
                h.test, h.verdict, ", ".join(map(str, h.failing_seeds[:10])) or "-", h.detail
            )
        console.print(table)
    if quarantined:
        sys.exit(5 if any(h.verdict == "could not run" for h in hunts) else 0)
    sys.exit(hunts[0].exit_code)


def _seed_list(text: str) -> list[int]:
    """``--seeds``: distinct seeds separated by commas; an empty item is an error."""
    seeds = []
    for item in text.split(","):
        try:
            seeds.append(seeding.parse_seed(item.strip()))
        except ValueError as exc:
            raise UsageProblem(f"--seeds {text!r}: {exc}") from None
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise UsageProblem(f"--seeds {text!r} repeats {repeated}; give each seed once")
    return seeds


def _write_flaky_reports(
    report_dir: Path,
    hunts: Sequence[_flaky.Hunt],
    markdown: str,
    *,
    status: _report.RunStatus | None = None,
) -> None:
    """flaky.json and flaky.md, each atomically (an "aborted" pair first, the hunt's at the
    end: an interrupted hunt never leaves an earlier hunt's verdicts)."""
    data: object = [h.to_dict() for h in hunts]
    if status is not None:
        data = {"status": str(status), "hunts": data}
    atomic.write_text(report_dir / "flaky.json", json.dumps(data, indent=2) + "\n")
    atomic.write_text(report_dir / "flaky.md", markdown)


COMMANDS = [run_command, ci_command, flaky_command]
