"""`harness impact`: record which test files run which functions, for pull-request mode."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console

from harness import impact as _impact
from harness import prmode as _prmode
from harness.cli.errors import UsageProblem

console = Console(highlight=False)


@click.group(name="impact")
def impact() -> None:
    """Test-impact selection: per-test coverage, folded into which test files ran which
    functions; `harness ci` reads it to narrow a change inside function bodies
    (docs/harness.md, "Test-impact selection")."""


def _top(path: Path) -> Path:
    top = _prmode.git_top(path)
    if top is None:
        raise UsageProblem(
            f"{path.resolve()} is not inside a git repository: the map is per commit"
        )
    return top


@impact.command(
    name="record",
    epilog="""\b
Exit status: 0 the map was written; 1 the tests did not all pass (no map is written: a run
that stopped early has not run what its tests run); 2 bad input.
Examples:
  harness impact record                     # every CPU test, on every core
  harness impact record --workers 0 -- suites/unit
  harness impact record --no-benchmarks     # tests only
The map records the commit; `harness ci` uses it only for a change whose base is that
commit, recorded from a tree without uncommitted Python changes. With an asv.conf.json, every
asv benchmark is then run once (set up, called once, torn down) under coverage too, so that a
change inside a function re-times only the benchmarks that ran it.""",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help=f"Where to write the map (default: {_impact.DEFAULT_MAP} at the repository's top).",
)
@click.option(
    "--workers", metavar="N|auto", default="auto", show_default=True, help="pytest-xdist workers."
)
@click.option(
    "--benchmarks/--no-benchmarks",
    default=True,
    show_default=True,
    help="Also run each asv benchmark once under coverage (when the project has an "
    "asv.conf.json); without it pull-request mode selects benchmark files on the import graph.",
)
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def record_command(
    out: Path | None, workers: str, benchmarks: bool, pytest_args: tuple[str, ...]
) -> None:
    """Run the tests once under coverage.py (every process they start) and write the map."""
    if workers != "auto" and not (workers.isdigit() and workers.isascii()):
        raise UsageProblem(f"--workers {workers!r}: give a number of workers, 0 or auto")
    root = _top(Path.cwd())
    out = out if out is not None else root / _impact.DEFAULT_MAP
    if out.exists() and out.is_dir():
        raise UsageProblem(f"--out {out}: is a folder; name the map's file")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="harness-impact-") as tmp:
        data_dir = Path(tmp)
        rcfile = data_dir / "coveragerc"
        rcfile.write_text(_impact.rcfile_text(root, data_dir / "cov"))
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "harness.impact.recorder",
            *_prmode.xdist_args(workers),
            *pytest_args,
        ]
        console.print(f"[bold]recording[/]: {' '.join(cmd[1:])} (coverage in every process)")
        rc = subprocess.run(cmd, cwd=root, env=_impact.environment(rcfile), check=False).returncode
        if rc != 0:
            console.print(
                f"[red]pytest exited {rc}: no map written[/] (a failing or interrupted run "
                "may have stopped before code its tests run)"
            )
            sys.exit(1 if rc != 4 else 2)
        bench_side = _record_benchmarks(root, data_dir, rcfile) if benchmarks else None
        parts = sum(1 for p in data_dir.iterdir() if p.name.startswith("cov."))
        console.print(f"combining {parts} coverage data file(s)...")
        try:
            payload = _impact.build(root, data_dir, bench_side)
        except _impact.ImpactError as exc:
            raise UsageProblem(str(exc)) from None
    try:
        _impact.write(payload, out)
    except OSError as exc:
        raise UsageProblem(f"--out {out}: cannot write the map ({exc.strerror})") from None
    files = payload["files"]
    n_units = sum(len(f["units"]) for f in files.values())
    if "benchmarks" in payload:
        ran = sum(1 for b in payload["benchmarks"].values() if b["ran"])
        console.print(f"benchmarks: {ran} of {len(payload['benchmarks'])} ran once under coverage")
    console.print(
        f"[green]wrote {out}[/]: {len(files)} files, {n_units} functions run, "
        f"{len(payload['test_files'])} test files, commit {payload['commit'][:10]}"
        f"{'' if payload['clean'] else ' (uncommitted changes: not usable by harness ci)'}; "
        f"{time.monotonic() - started:.0f} s"
    )


def _record_benchmarks(root: Path, data_dir: Path, rcfile: Path) -> dict[str, object] | None:
    """Run every asv benchmark once under coverage (harness.impact.bench_recorder); None,
    saying why, when the project has no asv configuration or the run failed (the map then
    has no benchmark table: benchmark files are selected on the import graph)."""
    from harness.perf import PerfError, Project
    from harness.perf._common import _load_json

    try:
        project = Project.load(root)
    except PerfError:
        return None  # no asv.conf.json: a project without benchmarks
    if not project.benchmark_dir.is_dir():
        console.print(
            f"[yellow]no benchmarks recorded[/]: {project.config_path.name}'s benchmark_dir "
            f"{project.benchmark_dir} is not a folder"
        )
        return None
    try:  # asv's own reading of its configuration (comments allowed)
        conf = _load_json(project.config_path)
        timeout = float(conf.get("default_benchmark_timeout", 60))
    except Exception:  # noqa: BLE001 - asv's loader raises its own types; its default then
        timeout = 60.0
    out = data_dir / "benchmarks.json"
    cmd = [
        sys.executable,
        "-m",
        "harness.impact.bench_recorder",
        str(root),
        str(project.benchmark_dir),
        str(out),
        str(timeout),
    ]
    console.print(f"[bold]recording benchmarks[/]: each of {project.benchmark_dir} once")
    rc = subprocess.run(cmd, cwd=root, env=_impact.environment(rcfile), check=False).returncode
    try:
        side = json.loads(out.read_text()) if rc == 0 else None
    except (OSError, json.JSONDecodeError):
        side = None
    if not isinstance(side, dict):
        console.print(
            f"[yellow]the benchmark recording exited {rc} without its results[/]: the map "
            "has no benchmark table, and pull-request mode selects benchmark files on the "
            "import graph"
        )
        return None
    return side
