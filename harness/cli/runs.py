"""`harness run` and `harness ci`: running suites and reading the results (`harness flaky`:
flaky.py beside this)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ParamSpec, TypeVar

import click
from rich.console import Console
from rich.markup import escape

from harness import extras as _extras
from harness import impact as _impact
from harness import layout as _layout
from harness import pipeline, seeding
from harness import prmode as _prmode
from harness import report as _report
from harness import selection as _selection
from harness import shards as _shards
from harness import tiers as _tiers
from harness.cli.errors import UsageProblem
from harness.pipeline import RunAborted, SuiteRun, run_suites

console = Console(stderr=False, highlight=False)

P = ParamSpec("P")
R = TypeVar("R")


def _project_root() -> Path:
    """pytest's rootdir from the current directory (harness.layout.find_rootdir: the first
    folder with a pytest configuration file, else the nearest pyproject.toml's)."""
    return _layout.find_rootdir(Path.cwd())[0]


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


def _default_tiers() -> list[str]:
    """The project's default tier selection (``Tier.default`` in its tier table)."""
    try:
        return _tiers.default_selection(_tiers.project_tiers(_project_root()))
    except _tiers.TierConfigError as exc:
        raise UsageProblem(str(exc)) from None


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


def _bad_input(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn(*args, **kwargs)``, with the library's bad-input errors turned into usage errors
    (``Error: ...``, exit status 2)."""
    try:
        return fn(*args, **kwargs)
    except ValueError as exc:
        if isinstance(exc, pipeline.ReportDirError | _tiers.TierConfigError):
            raise UsageProblem(str(exc)) from None
        raise


def _report_dir(report_dir: Path) -> Path:
    """The report folder, created (a usage error when it cannot be)."""
    return _bad_input(pipeline.make_report_dir, report_dir)


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


def _print_summary(outcome: SuiteRun) -> None:
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
    help="Tiers to run (harness.tiers: folders of the suites dir or declared paths). "
    "Default: every tier.",
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
    tiers: str | None,
    report_dir: Path,
    seed: str | None,
    deterministic: str | None,
    update_goldens: bool,
    shard: _shards.Shard | None,
    store_durations: bool,
    durations_path: Path,
    pytest_args: tuple[str, ...],
) -> None:
    """Run the suites and write JUnit XML, a JSON report and a markdown summary.

    The summary (per tier: passed / failed / skipped with reasons / quarantined, the seed and
    the environment fingerprint) is printed, written to REPORT_DIR/summary.md and appended to
    $GITHUB_STEP_SUMMARY when that is set. Exits with pytest's exit status: 0 all passed
    (quarantined failures do not gate), 1 failures or quarantine problems, 5 nothing ran.
    """
    report_dir = _report_dir(report_dir)
    try:
        names = _tier_list(tiers)
        seed = _check_seed(seed)
        args = _check_pytest_args(pytest_args)
        if shard is not None or store_durations:
            problem = _extras.missing(
                "pytest_split", "--shard" if shard is not None else "--store-durations"
            )
            if problem:
                raise UsageProblem(problem)
            try:
                _shards.check_durations(durations_path)
            except _shards.ShardError as exc:
                raise UsageProblem(str(exc)) from None
    except UsageProblem as exc:
        # The run stops before it starts: its reports say so rather than an earlier run's.
        _report.write_placeholders(
            report_dir, _report.RunStatus.ABORTED, f"usage error, nothing ran: {exc.message}"
        )
        raise
    extra: list[str] = []
    collection = report_dir / "collection.json"
    if shard is not None:
        collection.unlink(missing_ok=True)  # never read an earlier run's collection
        extra += _shards.pytest_args(shard, durations_path, collection)
    if store_durations:
        extra += _shards.store_durations_args(durations_path)
    try:
        outcome = _bad_input(
            run_suites,
            names,
            report_dir,
            seed=seed,
            deterministic=deterministic,
            update_goldens=update_goldens,
            pytest_args=[*extra, *args],
            title=f"ml-harness run ({', '.join(names) or 'all tiers'})"
            + (f", shard {shard}" if shard else ""),
        )
    except RunAborted as exc:
        console.print(f"[red bold]aborted[/]: {exc}; the reports in {report_dir} say so")
        sys.exit(RunAborted.exit_code)
    if shard is not None and outcome.report is not None:
        outcome.report = _shards.annotate_report(report_dir / "report.json", shard, collection)
    _print_summary(outcome)
    sys.exit(outcome.exit_code)


# --------------------------------------------------------------------------- ci


@click.command(
    name="ci",
    epilog="""\b
Steps, in order (each one runs even when an earlier one failed, so one run shows everything):
  1. env check      installed distributions vs the lock file
  2. cpu tiers      unit, property, integration, distributed (one pytest run); in
                    pull-request mode (the default) only the test files the change reaches;
                    on N xdist workers (--workers), the distributed tier on one of them
  3. gpu tier       when CUDA is present; otherwise reported as skipped with the reason
  4. perf gate      asv benchmarks vs the baseline (harness perf), unless --no-perf; in
                    pull-request mode only the benchmark files the change reaches
  5. report         REPORT_DIR/summary.md (+ $GITHUB_STEP_SUMMARY), per-step reports below it
Modes: --pr (default) selects from the files changed since --changed-since REF (default: the
default branch: origin/HEAD, else origin/main, origin/master, main, master) and the import
graph; a change to harness/plugin.py, a conftest.py, the configuration, the lock files or a
module no test imports selects everything. The perf gate's baseline comes from the same REF.
--full runs every test and benchmark (main and nightly). Selection details:
REPORT_DIR/selection.json and docs/harness.md.
""",
)
@click.option(
    "--report-dir", type=click.Path(path_type=Path), default=Path("reports"), show_default=True
)
@click.option(
    "--tier",
    "tiers",
    metavar="TIER[,TIER]",
    default=None,
    help="CPU tiers to run. Default: the tiers the tier table marks default (built in: unit, "
    "property, integration, distributed; see harness.tiers).",
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
    help="Base of the change in --pr mode and of the perf gate's baseline (default: "
    "origin/HEAD, else origin/main, origin/master, main, master; none: full run).",
)
@click.option(
    "--workers",
    metavar="N|auto",
    default="auto",
    show_default=True,
    help="pytest-xdist workers, in either mode (0: no xdist).",
)
@click.option(
    "--impact-map",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A test-impact map (`harness impact record`) that narrows a change inside function "
    "bodies to the test files that ran them, when recorded at the base (default: "
    ".harness/impact.json if present).",
)
def ci_command(
    report_dir: Path,
    tiers: str | None,
    lock: Path | None,
    seed: str | None,
    perf: bool,
    pr_mode: bool,
    changed_since: str | None,
    workers: str,
    impact_map: Path | None,
) -> None:
    """The main job: the same pipeline the GitHub workflow runs, locally.

    Exits 0 when every step passed or was skipped for a stated reason, 1 otherwise, 2 for a
    usage error and 130 when interrupted (Ctrl-C). From the start every report in REPORT_DIR
    says "aborted" until the step that writes it has finished.
    """
    report_dir, aborted = _bad_input(pipeline.begin_ci, report_dir)
    try:
        _check_ci_needs(pr_mode, workers, perf)
        tier_names = _tier_list(tiers) if tiers is not None else _default_tiers()
        seed = _check_seed(seed)
        plan = _prmode.Plan(
            selection=None,
            pytest_args=_prmode.xdist_args(workers),
            note="full run (--full): every test and benchmark",
            base_ref=changed_since,
        )
        if pr_mode:
            try:
                plan = _prmode.plan(
                    Path.cwd(), base_ref=changed_since, workers=workers, impact_map=impact_map
                )
            except _selection.SelectionError as exc:
                raise UsageProblem(f"--changed-since: {exc}") from None
            except _impact.ImpactError as exc:
                raise UsageProblem(f"--impact-map: {exc}") from None
    except UsageProblem as exc:
        aborted(f"usage error, nothing ran: {exc.message}")
        raise
    _prmode.write(plan, report_dir / "selection.json")
    console.print(f"[bold]{escape(plan.note)}[/]", soft_wrap=True)
    try:
        result = _bad_input(pipeline.run_ci, report_dir, tier_names, lock, seed, perf, plan)
    except RunAborted:
        console.print(f"[red bold]harness ci aborted[/]; the reports in {report_dir} say so")
        sys.exit(RunAborted.exit_code)
    console.rule("harness ci summary")
    click.echo(result.summary)
    console.print("reports: " + ", ".join(map(str, result.written)), soft_wrap=True)
    sys.exit(0 if result.ok else 1)


def _check_ci_needs(pr_mode: bool, workers: str, perf: bool) -> None:
    """What the steps will need, checked before any of them runs (exit 2 with the install
    line): a run that stopped half-way, or one that quietly left a step out, would say less."""
    if workers != "auto" and not (workers.isdigit() and workers.isascii()):
        raise UsageProblem(f"--workers {workers!r}: give a number of workers, 0 or auto")
    if pr_mode and workers != "0":
        problem = _extras.missing("xdist", f"--workers {workers}")
        if problem:
            raise UsageProblem(f"{problem}, or pass --workers 0 (no parallel workers)")
    if perf:
        problem = _extras.missing("asv", "the perf gate")
        if problem:
            raise UsageProblem(f"{problem}, or pass --no-perf")
        config = Path.cwd() / "asv.conf.json"  # where the perf step reads it
        if not config.is_file():
            raise UsageProblem(
                f"the perf gate needs an asv project ({config} not found): add one "
                '(docs/adopting.md, "Performance"), or pass --no-perf'
            )


COMMANDS = [run_command, ci_command]
