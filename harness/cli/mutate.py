"""`harness mutate`: mutation testing (mutmut) of modules against the tests that cover them."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console

from harness import extras as _extras
from harness import mutation as _mutation
from harness.cli.errors import UsageProblem

console = Console(highlight=False)


@click.command(
    name="mutate",
    epilog=f"""\b
With no PATH: the core modules ({len(_mutation.CORE_MODULES)}, the nightly job), one after another,
  harness/tolerances.py against its own test files (as with --tests).
Exit status: 0 every module measured (and at or above --min-score), 1 a module below
--min-score or one that could not be measured (mutmut failed, stopped at --timeout, printed
what cannot be read, made no mutant), 2 a PATH that is not a covered module or a bad --tests.
The reports are written in every case, each module not measured named with the reason.
Examples:
  harness mutate harness/tolerances.py --tests 'suites/*/harness/test_tolerances*.py'
  harness mutate reference_impls/collectives/simulation.py --min-score 85
  harness mutate reference_impls/attention/kernel.py --function reference_attention \
      --tests suites/unit/attention/test_attention_interpreter.py::test_reference_matches_torch_sdpa
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
    "--tests",
    "test_patterns",
    multiple=True,
    metavar="PATH",
    help="Run these test files (repeatable; a quoted glob works) against the mutants instead "
    "of every test file that imports the module: for a module imported by hundreds of tests. "
    "FILE::TEST runs that test alone.",
)
@click.option(
    "--function",
    "functions",
    multiple=True,
    metavar="NAME",
    help="Only the mutants of this function of PATH (repeatable; Class.method for a method): "
    "the functions a check exercises, out of a large module. Needs exactly one PATH.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=3600,
    show_default=True,
    metavar="SECONDS",
    help="Stop `mutmut run` on a module after this long; that module is then an error.",
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
    test_patterns: tuple[str, ...],
    functions: tuple[str, ...],
    timeout_s: float,
    min_score: float | None,
) -> None:
    """Mutation-test each PATH (a module of this project) against the test files that import
    it, and report the score per module and every mutant not killed (file:line, the change).

    Writes REPORT_DIR/mutation.md (also appended to $GITHUB_STEP_SUMMARY) and
    REPORT_DIR/mutation.json (kept per run, to track scores over time). See docs/harness.md.
    """
    problem = _extras.missing("mutmut", "harness mutate")
    if problem:
        raise UsageProblem(problem)
    root = Path.cwd()
    tier_names = [t.strip() for t in tiers.split(",") if t.strip()]
    targets = list(paths) or list(_mutation.CORE_MODULES)
    tests: list[str] | None = None
    try:
        if test_patterns:
            tests = _mutation.named_tests(root, test_patterns)
        if functions and len(paths) != 1:
            raise _mutation.MutationError(
                f"--function needs exactly one PATH, the module that defines it (got {len(paths)})"
            )
        for path in paths:  # bad input fails before any slow work starts
            posix = Path(path).as_posix()
            if tests is not None and _mutation.is_test_file(root, posix):
                raise _mutation.MutationError(
                    f"{path}: a test file given as a module; an unquoted --tests glob? "
                    "Quote it (--tests 'suites/.../test_x*.py') or repeat --tests per file"
                )
            if tests is None and not _mutation.covering_tests(root, posix, tier_names):
                raise _mutation.MutationError(
                    f"{path}: no test file of the tiers {tiers or 'any'} imports it; "
                    "write a test that imports it first"
                )
            if tests is not None and not (root / posix).is_file():
                raise _mutation.MutationError(f"{path}: no such file under {root}")
            if functions:
                _mutation.function_patterns(root, posix, functions)
    except _mutation.MutationError as exc:
        raise UsageProblem(str(exc)) from None
    # With no PATH (the nightly job), a core module may name its own tests.
    tests_for: dict[str, list[str] | None] = dict.fromkeys(targets, tests)
    results: list[_mutation.ModuleResult] = []
    errors: dict[str, str] = {}
    if not paths and tests is None:
        for path, patterns in _mutation.CORE_MODULE_TESTS.items():
            try:
                tests_for[path] = _mutation.named_tests(root, patterns)
            except _mutation.MutationError as exc:  # never hours of the import graph instead
                errors[path] = f"its own tests ({', '.join(patterns)}) are gone: {exc}"
    try:
        with tempfile.TemporaryDirectory(prefix="harness-mutate-") as tmp:
            scratch = work_dir or Path(tmp)
            for i, path in enumerate(targets, 1):
                console.rule(f"[{i}/{len(targets)}] mutmut: {path}")
                if path in errors:
                    console.print(f"[red]{path}: not measured[/]: {errors[path]}")
                    continue
                work = scratch / Path(path).as_posix().replace("/", "__")
                try:
                    result = _mutation.run_module(
                        root,
                        Path(path).as_posix(),
                        work,
                        jobs=jobs,
                        tiers=tier_names,
                        tests=tests_for.get(path, tests),
                        timeout_s=timeout_s,
                        progress=console.print,
                        functions=functions,
                    )
                except Exception as exc:  # one module's failure must not lose the others'
                    reason = str(exc)
                    if not isinstance(exc, (_mutation.MutationError, OSError)):
                        reason = f"crashed: {type(exc).__name__}: {exc}"
                    errors[path] = reason
                    console.print(f"[red]{path}: not measured[/]: {reason}")
                    continue
                results.append(result)
                score = "-" if result.score is None else f"{100 * result.score:.1f}%"
                console.print(
                    f"{path}: score {score} ({result.killed}/{result.total} killed, "
                    f"{len(result.survivors)} not killed) in {result.seconds:.0f} s"
                )
    except KeyboardInterrupt:
        done = {r.path for r in results} | set(errors)
        for path in targets:
            if Path(path).as_posix() not in done and path not in done:
                errors[path] = "interrupted (Ctrl-C)"
        _write(report_dir, results, errors)
        raise
    _write(report_dir, results, errors)
    low = [
        r
        for r in results
        if min_score is not None and (r.score is None or 100 * r.score < min_score)
    ]
    for r in low:
        console.print(f"[red]{r.path}: score below --min-score {min_score:g}%[/]")
    sys.exit(1 if errors or low else 0)


def _write(report_dir: Path, results: list[_mutation.ModuleResult], errors: dict[str, str]) -> None:
    """Both reports, the markdown also to the job summary and the terminal; every module not
    measured is listed again, red, last, so it cannot scroll by unseen."""
    from harness import report as _report

    written = _mutation.write_reports(report_dir, results, errors)
    markdown = written[1].read_text()
    _report.append_step_summary(markdown)
    click.echo(markdown)
    console.print("reports: " + ", ".join(map(str, written)))
    for path, reason in errors.items():
        console.print(f"[red]error: {path}: not measured[/]: {' '.join(reason.split())[:400]}")
