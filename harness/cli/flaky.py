"""`harness flaky`: rerun one test (or every quarantined one) and classify why it flakes.

The command line of :mod:`harness.flaky`: it checks its input (exit 2 for a bad test id, seed,
seed list or timeout), shows a progress bar per hunt, and writes flaky.json and flaky.md.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness import atomic, pipeline, seeding
from harness import flaky as _flaky
from harness import report as _report
from harness.cli.errors import UsageProblem

console = Console(stderr=False, highlight=False)


def _report_dir(report_dir: Path) -> Path:
    """The report folder, created (a usage error when it cannot be)."""
    try:
        return pipeline.make_report_dir(report_dir)
    except pipeline.ReportDirError as exc:
        raise UsageProblem(str(exc)) from None


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
    test: str | None,
    runs: int,
    seed: str | None,
    seeds: str | None,
    quarantined: bool,
    quarantine_file: Path,
    timeout: float,
    report_dir: Path | None,
    as_json: bool,
) -> None:
    """Rerun one test in fresh processes under one seed and under new seeds, and classify it.

    Never a retry: the point is to learn why a test flakes, not to make it pass.
    """
    from harness import quarantine as _quarantine

    if quarantined == bool(test):
        raise UsageProblem(
            "give either a TEST node id or --quarantined (e.g. harness flaky --quarantined)"
        )
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
        report_dir = _report_dir(report_dir)
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
        assert test is not None  # checked above: exactly one of TEST and --quarantined
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
        could_not_run = any(h.verdict is _flaky.Verdict.COULD_NOT_RUN for h in hunts)
        sys.exit(_flaky.EXIT_CODES[_flaky.Verdict.COULD_NOT_RUN] if could_not_run else 0)
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
