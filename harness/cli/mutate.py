"""`harness mutate`: mutation testing (mutmut) of modules against the tests that cover them."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console

from harness import mutation as _mutation
from harness.cli.errors import UsageProblem

console = Console(highlight=False)


@click.command(
    name="mutate",
    epilog=f"""\b
With no PATH: the core modules ({len(_mutation.CORE_MODULES)}, the nightly job), one after another.
Exit status: 0 every module measured (and at or above --min-score), 1 a module below
--min-score or one that could not be measured, 2 a PATH that is not a covered module.
Examples:
  harness mutate harness/tolerances.py
  harness mutate reference_impls/collectives/simulation.py --min-score 85
""",
)
@click.argument("paths", nargs=-1, metavar="[PATH]...")
@click.option(
    "--report-dir",
    type=click.Path(path_type=Path),
    default=Path("reports/mutation"),
    show_default=True,
    help="Where mutation.md and mutation.json are written.",
)
@click.option(
    "--work-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Scratch folder for mutmut (one subfolder per module; kept, so `mutmut show NAME` "
    "works there afterwards). Default: a new temporary folder, removed at the end.",
)
@click.option(
    "--jobs", type=click.IntRange(min=1), default=2, show_default=True, help="mutmut's workers."
)
@click.option(
    "--tier",
    "tiers",
    metavar="TIER[,TIER]",
    default=",".join(_mutation.DEFAULT_TIERS),
    show_default=True,
    help="Only test files of these tiers run against the mutants ('' for every tier).",
)
@click.option(
    "--min-score",
    type=click.FloatRange(0, 100),
    default=None,
    metavar="PERCENT",
    help="Fail (exit 1) when a module's score is below PERCENT. Default: report only.",
)
def mutate_command(
    paths: tuple[str, ...],
    report_dir: Path,
    work_dir: Path | None,
    jobs: int,
    tiers: str,
    min_score: float | None,
) -> None:
    """Mutation-test each PATH (a module of this project) against the test files that import
    it, and report the score per module and every mutant not killed (file:line, the change).

    Writes REPORT_DIR/mutation.md (also appended to $GITHUB_STEP_SUMMARY) and
    REPORT_DIR/mutation.json (kept per run, to track scores over time). See docs/harness.md.
    """
    root = Path.cwd()
    tier_names = [t.strip() for t in tiers.split(",") if t.strip()]
    targets = list(paths) or list(_mutation.CORE_MODULES)
    if paths:
        for path in paths:  # bad input fails before any slow work starts
            try:
                if not _mutation.covering_tests(root, Path(path).as_posix(), tier_names):
                    raise _mutation.MutationError(
                        f"{path}: no test file of the tiers {tiers or 'any'} imports it; "
                        "write a test that imports it first"
                    )
            except _mutation.MutationError as exc:
                raise UsageProblem(str(exc)) from None
    results: list[_mutation.ModuleResult] = []
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="harness-mutate-") as tmp:
        scratch = work_dir or Path(tmp)
        for i, path in enumerate(targets, 1):
            console.rule(f"[{i}/{len(targets)}] mutmut: {path}")
            work = scratch / Path(path).as_posix().replace("/", "__")
            try:
                result = _mutation.run_module(
                    root,
                    Path(path).as_posix(),
                    work,
                    jobs=jobs,
                    tiers=tier_names,
                    progress=console.print,
                )
            except (_mutation.MutationError, OSError) as exc:
                errors[path] = str(exc)
                console.print(f"[red]{path}: not measured[/]: {exc}")
                continue
            results.append(result)
            score = "-" if result.score is None else f"{100 * result.score:.1f}%"
            console.print(
                f"{path}: score {score} ({result.killed}/{result.total} killed, "
                f"{len(result.survivors)} not killed) in {result.seconds:.0f} s"
            )
    written = _mutation.write_reports(report_dir, results, errors)
    markdown = written[1].read_text()
    from harness import report as _report

    _report.append_step_summary(markdown)
    click.echo(markdown)
    console.print("reports: " + ", ".join(map(str, written)))
    low = [
        r
        for r in results
        if min_score is not None and (r.score is None or 100 * r.score < min_score)
    ]
    for r in low:
        console.print(f"[red]{r.path}: score below --min-score {min_score:g}%[/]")
    sys.exit(1 if errors or low else 0)
