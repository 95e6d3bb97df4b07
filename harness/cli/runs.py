"""`harness run`, `harness ci` and `harness flaky`: running suites and reading the results."""

from __future__ import annotations

import json
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

from harness import flaky as _flaky
from harness import report as _report
from harness import selection as _selection
from harness import shards as _shards
from harness.cli import pr as _pr

console = Console(stderr=False, highlight=False)

CPU_TIERS = ("unit", "property", "integration", "distributed")


def _tier_list(value: str | None) -> list[str]:
    return [t.strip() for t in (value or "").split(",") if t.strip()]


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
    summary.md to ``report_dir``; print the summary; append it to $GITHUB_STEP_SUMMARY."""
    report_dir.mkdir(parents=True, exist_ok=True)
    json_path = report_dir / "report.json"
    json_path.unlink(missing_ok=True)  # a stale report must never be read as this run's
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        f"--junitxml={report_dir / 'junit.xml'}",
        f"--harness-json={json_path}",
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
    console.print(f"[bold]$ python {' '.join(cmd[1:])}[/bold]", soft_wrap=True)
    # pytest's own progress line streams straight to the terminal.
    code = subprocess.call(cmd)
    if not json_path.exists():
        message = (
            f"## {title or 'ml-harness run'}: ❌ pytest stopped before writing a report "
            f"(exit status {code}); see its output"
        )
        (report_dir / "summary.md").write_text(message + "\n")
        if step_summary:
            _report.append_step_summary(message)
        return RunOutcome(code or 1, None, message, report_dir)
    data = _report.load(json_path)
    markdown = _report.render_markdown(
        data, title=title or f"ml-harness run ({', '.join(tiers) or 'all tiers'})"
    )
    (report_dir / "summary.md").write_text(markdown + "\n")
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


def _parse_shard(value: str | None) -> _shards.Shard | None:
    if value is None:
        return None
    try:
        return _shards.Shard.parse(value)
    except _shards.ShardError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command(
    name="run",
    context_settings={"ignore_unknown_options": True},
    epilog="""\b
Examples:
  harness run --tier unit                      # one tier, reports in reports/
  harness run --tier unit,property --seed 42   # replay a seed
  harness run -- -k quarantine -x              # anything after -- goes to pytest
  harness run --tier unit --shard 1/2 --seed 7 --report-dir reports/shard-1
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
@click.option(
    "--shard",
    metavar="K/N",
    default=None,
    callback=lambda _ctx, _param, value: _parse_shard(value),
    help="Run shard K of N (split by the durations in .test_durations); merge the shards' "
    "reports with `harness report merge`. Pass every shard the same --seed.",
)
@click.option(
    "--store-durations",
    is_flag=True,
    help="Record this run's test durations into the durations file (what --shard splits by).",
)
@click.option(
    "--durations-path",
    type=click.Path(path_type=Path),
    default=Path(_shards.DURATIONS_FILE),
    show_default=True,
    help="pytest-split's durations file (JSON: node id -> seconds).",
)
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def run_command(
    tiers,
    report_dir,
    seed,
    deterministic,
    update_goldens,
    shard,
    store_durations,
    durations_path,
    pytest_args,
) -> None:
    """Run the suites and write JUnit XML, a JSON report and a markdown summary.

    The summary (per tier: passed / failed / skipped with reasons / quarantined, the seed and
    the environment fingerprint) is printed, written to REPORT_DIR/summary.md and appended to
    $GITHUB_STEP_SUMMARY when that is set. Exits with pytest's exit status: 0 all passed
    (quarantined failures do not gate), 1 failures or quarantine problems, 5 nothing ran.
    """
    extra: list[str] = []
    collection = report_dir / "collection.json"
    if shard is not None:
        collection.unlink(missing_ok=True)  # never read an earlier run's collection
        extra += _shards.pytest_args(shard, durations_path, collection)
    if store_durations:
        extra += _shards.store_durations_args(durations_path)
    tier_list = _tier_list(tiers)
    outcome = run_suites(
        tier_list,
        report_dir,
        seed=seed,
        deterministic=deterministic,
        update_goldens=update_goldens,
        pytest_args=[*extra, *pytest_args],
        title=f"ml-harness run ({', '.join(tier_list) or 'all tiers'})"
        + (f", shard {shard}" if shard else ""),
    )
    if shard is not None and outcome.report is not None:
        outcome.report = _shards.annotate_report(report_dir / "report.json", shard, collection)
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


def _perf_step(report_dir: Path, bench: str | None = None) -> Step:
    try:
        from harness import perf
    except ImportError as exc:  # pragma: no cover - perf ships with the harness
        return Step("perf gate", "failed", f"harness.perf unavailable: {exc}")
    result = perf.ci_step(Path.cwd(), report_dir, bench=bench)
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
  2. cpu tiers      unit, property, integration, distributed (one pytest run); in
                    pull-request mode (the default) only the test files the change reaches,
                    on N xdist workers, integration and distributed on one of them
  3. gpu tier       when CUDA is present; otherwise reported as skipped with the reason
  4. perf gate      asv benchmarks vs the baseline (harness perf), unless --no-perf; in
                    pull-request mode only the benchmark files the change reaches
  5. report         REPORT_DIR/summary.md (+ $GITHUB_STEP_SUMMARY), per-step reports below it
Modes: --pr (default) selects from the files changed since --changed-since REF (default
origin/main, else main) and the import graph; a change to harness/, a conftest.py, the lock
files or pyproject.toml selects everything. --full runs every test and benchmark (main and
nightly). Selection details: REPORT_DIR/selection.json and docs/harness.md.
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
@click.option(
    "--pr/--full",
    "pr_mode",
    default=True,
    show_default=True,
    help="--pr: only the tests and benchmarks the change reaches, in parallel; --full: all.",
)
@click.option(
    "--changed-since",
    "changed_since",
    metavar="REF",
    default=None,
    help="Base of the change in --pr mode (default: origin/main, else main; none: full run).",
)
@click.option(
    "--workers",
    metavar="N|auto",
    default="auto",
    show_default=True,
    help="pytest-xdist workers in --pr mode (0: no xdist).",
)
def ci_command(
    report_dir: Path,
    tiers: str,
    lock: Path | None,
    seed: str | None,
    perf: bool,
    pr_mode: bool,
    changed_since: str | None,
    workers: str,
) -> None:
    """The main job: the same pipeline the GitHub workflow runs, locally.

    Exits 0 when every step passed or was skipped for a stated reason, 1 otherwise.
    """
    report_dir.mkdir(parents=True, exist_ok=True)
    steps: list[Step] = []
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
    plan = _pr.Plan(selection=None, note="full run (--full): every test and benchmark")
    if pr_mode:
        try:
            plan = _pr.plan(Path.cwd(), base_ref=changed_since, workers=workers)
        except _selection.SelectionError as exc:
            raise click.BadParameter(str(exc), param_hint="--changed-since") from None
    _pr.write(plan, report_dir / "selection.json")
    console.print(f"[bold]{plan.note}[/]", soft_wrap=True)
    console.rule(f"[1/{total}] env check")
    # A GPU runner's venv sees the image's torch, triton and CUDA libraries
    # (--system-site-packages): check it against the GPU profile, extras allowed.
    if lock is None and cuda:
        lock = Path("requirements/gpu.lock")
    timed(_env_step, lock, cuda)

    def tests_step(name: str, tier_names: list[str], subdir: str) -> Step:
        outcome = run_suites(
            tier_names,
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
        return Step(name, "passed" if outcome.exit_code == 0 else "failed", detail)

    console.rule(f"[2/{total}] cpu tiers: {tiers}")
    if plan.skip_tests:
        steps.append(Step("cpu tiers", "skipped", plan.skip_tests))
        console.print(f"[yellow]cpu tiers: skipped[/] ({plan.skip_tests})")
    else:
        timed(tests_step, "cpu tiers", _tier_list(tiers), "cpu")
    console.rule(f"[3/{total}] gpu tier")
    if cuda:
        timed(tests_step, "gpu tier", ["gpu"], "gpu")
    else:
        steps.append(Step("gpu tier", "skipped", "no CUDA device visible to torch on this machine"))
        console.print(
            "[yellow]gpu tier: skipped[/] (no CUDA device visible to torch on this machine)"
        )
    # The perf gate plugs in here: harness.perf.ci_step runs the benchmarks and gates them.
    if perf:
        console.rule(f"[4/{total}] perf gate")
        if plan.skip_perf:
            steps.append(Step("perf gate", "skipped", plan.skip_perf))
            console.print(f"[yellow]perf gate: skipped[/] ({plan.skip_perf})")
        else:
            timed(_perf_step, report_dir / "perf", plan.bench)
    ok = all(s.status != "failed" for s in steps)
    summary = _steps_markdown(steps, ok) + f"\n{plan.note}\n\n" + "\n".join(markdowns)
    (report_dir / "summary.md").write_text(summary)
    _report.append_step_summary(summary)
    console.rule("harness ci summary")
    click.echo(summary)
    written = [
        report_dir / "summary.md",
        *(d for d in (report_dir / n for n in ("cpu", "gpu", "perf")) if d.is_dir()),
    ]
    console.print("reports: " + ", ".join(map(str, written)), soft_wrap=True)
    sys.exit(0 if ok else 1)


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
@click.option("--seed", type=int, default=None, help="The fixed base seed (default: random).")
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
    help="Seconds per run before it counts as a failure.",
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
    seed_list = None
    if seeds:
        try:
            seed_list = [int(s) for s in seeds.split(",") if s.strip()]
        except ValueError:
            raise click.BadParameter(
                f"expected comma-separated integers, got {seeds!r}", param_hint="--seeds"
            ) from None
    if quarantined:
        try:
            tests = [e.test for e in _quarantine.load(quarantine_file)]
        except _quarantine.QuarantineError as exc:
            raise click.ClickException(str(exc)) from None
        if not tests:
            console.print(f"{quarantine_file}: no quarantined tests to hunt")
    else:
        tests = [test]
    hunts = [_hunt_with_progress(t, runs, seed, seed_list, timeout) for t in tests]
    markdown = _hunt_markdown(hunts)
    if report_dir:
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "flaky.json").write_text(
            json.dumps([h.to_dict() for h in hunts], indent=2) + "\n"
        )
        (report_dir / "flaky.md").write_text(markdown)
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


COMMANDS = [run_command, ci_command, flaky_command]
