"""`harness tolerances propose`: bounds for numeric checks from their errors over many seeds."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness import extras as _extras
from harness.cli.errors import UsageProblem
from harness.cli.paths import writable_json_path

console = Console(highlight=False)
if not console.is_terminal:  # a log or a pipe: wide enough that the table stays readable
    console = Console(highlight=False, width=200)


@click.group(name="tolerances")
def tolerances() -> None:
    """Tolerances from evidence: fit each numeric check's error over seeds (docs/harness.md,
    "Tolerances from evidence")."""


def _target(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not (0 < value < 1):
        raise click.BadParameter(f"{value!r} is not a probability in (0, 1)")
    return value


@tolerances.command(
    name="propose",
    epilog="""\b
Exit status: 0 the proposals were made (whatever the verdicts), 2 bad input (a node id pytest
cannot run, a records file that cannot be read, a --json path that cannot be written, a
held-out recording that shares seeds with the fit, a bad option).
Examples:
  harness tolerances propose suites/unit/attention/test_attention_interpreter.py --runs 60
  harness tolerances propose --records reports/tolerances/records.jsonl --write
  # a held-out check split over processes or machines, then merged:
  harness tolerances propose NODEID --runs 100 --records fit.jsonl
  harness tolerances propose NODEID --runs 1 --holdout-runs 500 --seed 1 --holdout-records h1.jsonl
  harness tolerances propose NODEID --runs 1 --holdout-runs 500 --seed 2 --holdout-records h2.jsonl
  cat h1.jsonl h2.jsonl > held.jsonl
  harness tolerances propose --records fit.jsonl --holdout-records held.jsonl
""",
)
@click.argument("nodeids", nargs=-1, metavar="[NODEID]...")
@click.option(
    "--runs", type=click.IntRange(min=1), default=50, show_default=True, help="Seeds per test."
)
@click.option(
    "--per-process",
    type=click.IntRange(min=1),
    default=25,
    show_default=True,
    help="Runs per pytest process (--harness-repeat); 1 for tests whose module-scoped "
    "fixtures would otherwise be shared by the runs.",
)
@click.option(
    "--target-failure",
    type=float,
    default=1e-4,
    show_default=True,
    callback=_target,
    help="Failure probability per run the proposed bound is set at.",
)
@click.option(
    "--records",
    "records_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="With NODEIDs: where the sweep's errors are written (default a temporary file). "
    "Without: a --harness-record-errors file to judge instead of running anything.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of the base seeds drawn for the sweep and of the bootstrap.",
)
@click.option(
    "--bootstrap",
    type=click.IntRange(min=0),
    default=100,
    show_default=True,
    help="Bootstrap resamples for each proposal's interval.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    callback=writable_json_path,
    help="Write every site's numbers as JSON to this file (its folder must exist; checked "
    "before any work).",
)
@click.option(
    "--write",
    is_flag=True,
    help="Print a unified diff setting the proposed "
    "bounds where they are literals at the call (nothing is edited).",
)
@click.option(
    "--holdout-runs",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="After proposing, run this many fresh seeds (the held-out stream of --seed, which "
    "no --seed's fit stream shares) and count the runs that exceed each proposed bound (the "
    "held-out check; sites with no proposal: the current bound).",
)
@click.option(
    "--holdout-records",
    "holdout_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="With NODEIDs and --holdout-runs: where the held-out errors are written (default a "
    "temporary file). Without NODEIDs: a held-out recording (several merged with cat) to check "
    "the proposals from --records against, running nothing.",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="pytest processes at a time (each with OMP_NUM_THREADS=1 unless set); also "
    "mutmut's workers with --mutants.",
)
@click.option(
    "--mutants",
    is_flag=True,
    help="Mutation-test --module (harness mutate) against the NODEIDs' test files (without "
    "NODEIDs: the files of the tests in --records) twice: "
    "with the current bounds and with the proposed ones in force "
    "($HARNESS_TOLERANCE_OVERRIDES), and report the mutants each kills.",
)
@click.option(
    "--module",
    "module",
    default=None,
    metavar="PATH",
    help="The module under test for --mutants.",
)
@click.option(
    "--overrides-out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the proposals as a $HARNESS_TOLERANCE_OVERRIDES file (to run any test "
    "command with them in force).",
)
def propose_command(
    nodeids: tuple[str, ...],
    runs: int,
    per_process: int,
    target_failure: float,
    records_path: Path | None,
    seed: int,
    bootstrap: int,
    json_path: Path | None,
    write: bool,
    holdout_runs: int,
    holdout_path: Path | None,
    jobs: int,
    mutants: bool,
    module: str | None,
    overrides_out: Path | None,
) -> None:
    """Run NODEIDs (test functions: all their parametrizations run) over RUNS seeds with
    --harness-record-errors, fit the tail of each call site's share of its bound used
    (peaks over threshold, generalized Pareto, bootstrap interval) and print, per check, the
    current bound, the observed maximum, the proposed bound at the target failure rate with
    its interval, and a verdict."""
    problem = _extras.missing("scipy", "harness tolerances propose")
    if problem:
        raise UsageProblem(problem)
    from harness.tolerances_evidence import propose as _propose

    root = Path.cwd()
    if not nodeids and records_path is None:
        raise UsageProblem("give NODEIDs to run, or --records FILE to judge")
    if not nodeids and holdout_runs:
        raise UsageProblem("--holdout-runs runs the tests: give their NODEIDs")
    if holdout_path is not None and nodeids and not holdout_runs:
        raise UsageProblem("--holdout-records with NODEIDs needs --holdout-runs N")
    if mutants and module is None:
        raise UsageProblem("--mutants needs --module PATH, the module the tests check")
    if mutants:
        problem = _extras.missing("mutmut", "harness tolerances propose --mutants")
        if problem:
            raise UsageProblem(problem)
    with tempfile.TemporaryDirectory(prefix="harness-tolerances-") as tmp:
        try:
            if nodeids:
                path = records_path or Path(tmp) / "records.jsonl"
                path = path if path.is_absolute() else root / path
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("")
                _sweep(root, nodeids, path, runs, per_process, seed, "runs", jobs=jobs)
            else:
                assert records_path is not None
                path = records_path
            records = _propose.load_records(path)
            if not records:
                raise _propose.ProposeError(
                    f"{path}: no check was recorded (do the tests call assert_close, "
                    "assert_within or golden.check?)"
                )
            reports = _propose.analyse(records, target_failure, bootstrap=bootstrap, seed=seed)
            holdout: dict[str, Any] = {}
            fresh: Path | None = None
            if holdout_runs:
                fresh = holdout_path or Path(tmp) / "holdout.jsonl"
                fresh = fresh if fresh.is_absolute() else root / fresh
                fresh.parent.mkdir(parents=True, exist_ok=True)
                fresh.write_text("")
                _sweep(root, nodeids, fresh, holdout_runs, per_process, seed, "held-out", jobs=jobs)
            elif holdout_path is not None:
                fresh = holdout_path
            if fresh is not None:
                holdout, notes = _propose.holdout_check(
                    reports, _propose.load_records(fresh), target_failure, fitted=records
                )
                for note in notes:
                    console.print(f"[yellow]held-out: {note}[/]")
        except (_propose.ProposeError, OSError) as exc:
            raise UsageProblem(str(exc)) from None
    _print(reports, target_failure, holdout)
    if write:
        for report in reports:
            if report.proposed_rtol is None:
                continue
            diff, note = _propose.patch_for(root, report)
            if diff is None:
                console.print(f"[yellow]{report.site}: cannot write: {note}[/]")
            else:
                click.echo(diff, nl=False)
    overrides = _propose.overrides_for(reports)
    if overrides_out is not None:
        overrides_out.parent.mkdir(parents=True, exist_ok=True)
        overrides_out.write_text(json.dumps(overrides, indent=2) + "\n")
        console.print(f"wrote {overrides_out} ({len(overrides)} sites)")
    killed: dict[str, Any] = {}
    if mutants:
        assert module is not None
        # Without NODEIDs: the test files of the recorded tests (--records).
        tests = nodeids or tuple(sorted({str(r["test"]) for r in records}))
        killed = _mutants(root, module, tests, overrides, jobs, seed)
    if json_path is not None:
        data = {
            "target_failure": target_failure,
            "mutants": killed,
            "sites": [
                {
                    **r.to_json(),
                    **({"holdout": holdout[r.site].to_json()} if r.site in holdout else {}),
                }
                for r in reports
            ],
        }
        json_path.write_text(json.dumps(data, indent=2, allow_nan=True) + "\n")
        console.print(f"wrote {json_path}")


def _mutants(
    root: Path,
    module: str,
    nodeids: tuple[str, ...],
    overrides: dict[str, Any],
    jobs: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """Mutants of ``module`` killed by the NODEIDs' test files under the current bounds and
    under the proposed ones. A tighter bound must kill at least as many.

    Both passes run under one ``$HARNESS_SEED`` (``seed``, unless set): the tests, hypothesis
    included, draw the same inputs in both, so a mutant killed in one pass and not the other
    is the bound's doing, not the draw's (with a random seed per pass, 10 of the ring
    simulation's 286 mutants changed fate both ways between two passes)."""
    from harness import mutation as _mutation

    tests = sorted({n.split("::", 1)[0] for n in nodeids})
    out: dict[str, Any] = {"module": module, "tests": tests}
    with tempfile.TemporaryDirectory(prefix="harness-tolerances-mutants-") as tmp:
        file = Path(tmp) / "overrides.json"
        file.write_text(json.dumps(overrides))
        saved_seed = os.environ.get("HARNESS_SEED")
        out["harness_seed"] = saved_seed or str(seed)
        for label, env in (("current", ""), ("proposed", str(file))):
            console.rule(f"mutants of {module} with the {label} bounds")
            saved = os.environ.get("HARNESS_TOLERANCE_OVERRIDES")
            os.environ["HARNESS_TOLERANCE_OVERRIDES"] = env
            os.environ["HARNESS_SEED"] = out["harness_seed"]
            try:
                result = _mutation.run_module(
                    root,
                    module,
                    Path(tmp) / label,
                    jobs=max(jobs, 2),
                    tests=tests,
                    progress=console.print,
                )
            except _mutation.MutationError as exc:
                raise UsageProblem(f"--mutants: {exc}") from None
            finally:
                if saved is None:
                    os.environ.pop("HARNESS_TOLERANCE_OVERRIDES", None)
                else:
                    os.environ["HARNESS_TOLERANCE_OVERRIDES"] = saved
                if saved_seed is None:
                    os.environ.pop("HARNESS_SEED", None)
                else:
                    os.environ["HARNESS_SEED"] = saved_seed
            out[label] = {
                "killed": result.killed,
                "total": result.total,
                "survivors": [_survivor(s) for s in result.survivors],
            }
            console.print(f"{label} bounds: {result.killed} of {result.total} mutants killed")
    if out["proposed"]["killed"] < out["current"]["killed"]:
        console.print("[yellow]the proposed bounds kill fewer mutants: they let more through[/]")
    current = {s["name"]: s for s in out["current"]["survivors"]}
    proposed = {s["name"]: s for s in out["proposed"]["survivors"]}
    # What one bound kills and the other lets through (a looser proposal: what it would let
    # through; a tighter one: what it catches that the current bound missed).
    out["only_current_kills"] = [proposed[n] for n in sorted(set(proposed) - set(current))]
    out["only_proposed_kills"] = [current[n] for n in sorted(set(current) - set(proposed))]
    for label, which in (("current", "only_current_kills"), ("proposed", "only_proposed_kills")):
        for s in out[which]:
            console.print(f"killed by the {label} bounds alone: {s['where']}: {s['change']}")
    return out


def _survivor(s: Any) -> dict[str, str]:
    return {
        "name": str(s.name),
        "status": str(getattr(s.status, "value", s.status)),
        "where": f"{s.path}:{s.line}",
        "change": f"{s.before.strip()} -> {s.after.strip()}",
    }


def _sweep(
    root: Path,
    nodeids: tuple[str, ...],
    path: Path,
    runs: int,
    per_process: int,
    seed: int,
    what: str,
    *,
    jobs: int = 1,
) -> None:
    from harness.tolerances_evidence import propose as _propose

    with Progress(
        TextColumn(f"[bold]{what}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task(what, total=runs)
        _, failed = _propose.run_sweep(
            root,
            nodeids,
            path,
            runs=runs,
            per_process=per_process,
            seed=seed,
            holdout=what == "held-out",
            jobs=jobs,
            on_process=lambda _i, done: bar.update(task, completed=done),
            extra_env={"HARNESS_TOLERANCE_OVERRIDES": ""}
            if os.environ.get("HARNESS_TOLERANCE_OVERRIDES")
            else None,
        )
    for base in failed:
        console.print(
            f"[yellow]{what}: a test failed under --harness-seed={base} (rerun it to see why: "
            "a check over its bound shows in the table, any other failure does not)[/]"
        )


def _bound_text(r: Any, rtol: float | None = None, atol: float | None = None) -> str:
    rtol = r.rtol if rtol is None else rtol
    atol = r.atol if atol is None else atol
    if r.kind == "within":
        return f"bound {atol:.3g}" + (" (varies)" if r.bounds_vary else "")
    text = f"rtol={rtol:.3g} atol={atol:.3g}"
    if r.bound and r.bound != "given":
        text += f" ({r.bound})"
    if r.bounds_vary:
        text += " (varies)"
    return text


def _print(reports: list[Any], target: float, holdout: dict[str, Any]) -> None:
    table = Table(title=f"proposed bounds at a failure rate of {target:g} per run")
    for col in ("site", "runs", "current bound", "observed max", "proposed", "verdict"):
        table.add_column(col, overflow="fold")
    if holdout:
        table.add_column("held-out")
    for r in reports:
        observed = f"{r.max_used:.3g} of the bound (|err| {r.max_abs:.3g})"
        if r.factor is not None:
            if r.kind == "within":
                proposed = f"bound {r.proposed_atol:.2g}"
            else:
                proposed = _bound_text(r, r.proposed_rtol, r.proposed_atol)
            interval = f"[{r.low:.3g}, {r.high:.3g}]" if r.low is not None else ""
            proposed += f"\nx{r.factor:.3g} (fit {r.estimate:.3g} {interval})"
            if r.shape_floored:
                proposed += f"\nshape {r.shape:.2f}: extrapolated as exponential"
        else:
            proposed = "-"
        row = [
            f"{r.site}\n{r.function}",
            str(r.runs),
            _bound_text(r),
            observed,
            proposed,
            r.verdict,
        ]
        if holdout:
            if r.site in holdout:
                h = holdout[r.site]
                text = f"{h.over}/{h.runs} over the {h.bound} bound (expected {h.expected:.2g}"
                text += f"; p {h.p:.2g})" if h.over else ")"
                row.append(text)
            else:
                row.append("-")
        table.add_row(*row)
    console.print(table)
    fails = [r for r in reports if r.failures]
    for r in fails:
        console.print(f"[red]{r.site}: failed in {r.failures} of {r.runs} runs[/]")
    if any(math.isfinite(r.max_used) and r.status == "fitted" for r in reports):
        console.print(
            "proposed = current bound x F, F the upper end of the 90% bootstrap interval of the "
            "share of the bound exceeded with the target probability (docs/harness.md); a "
            "fitted shape below 0 (a tail with an end) is extrapolated as exponential"
        )
