"""`harness perf`: asv benchmarks, the regression gate and the offline dashboard.

A thin front for ``harness.perf``; docs/perf.md is the guide. Exit codes of `gate` and `ci`:
0 nothing regressed, 1 a significant regression (or a failing benchmark), 2 nothing comparable.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import click

from harness import perf as lib


def _root() -> Path:
    return Path.cwd()


def _fail(exc: lib.PerfError, code: int = 1) -> NoReturn:
    click.echo(f"harness perf: {exc}", err=True)
    sys.exit(code)


machine_option = click.option(
    "--machine",
    default=None,
    metavar="NAME",
    help=f"asv machine name; one per runner type [default: ${lib.MACHINE_ENV_VAR} or "
    f"{lib.DEFAULT_MACHINE}]",
)


@click.group(name="perf")
def perf() -> None:
    """asv benchmarks (suites/benchmarks), the regression gate and the offline dashboard.

    Typical use: `harness perf run --commit BASE --commit HEAD` (base and head measured in
    alternation), then `harness perf gate BASE HEAD`. See docs/perf.md.
    """


@perf.command()
@click.option("--bench", default=None, metavar="REGEX", help="Only benchmarks matching REGEX.")
@click.option(
    "--group",
    type=click.Choice(sorted(lib.GROUPS)),
    default="all",
    show_default=True,
    help="gpu: classes named Gpu*/*GPU; cpu: all others (suites/benchmarks/README.md).",
)
@click.option(
    "--quick",
    is_flag=True,
    help="One round and 7 samples per benchmark in all: the fewest the gate's "
    "significance test can use.",
)
@machine_option
@click.option(
    "--commit",
    "commits",
    multiple=True,
    metavar="REF",
    help="Benchmark this commit (HEAD: the working tree; others from git archive) and "
    "record the results under its hash. Repeat it to measure several commits "
    "in alternation (base, head, base, head). [default: HEAD]",
)
@click.option(
    "--passes",
    type=click.IntRange(min=1),
    default=None,
    help="Alternating passes over the commits, samples appended [default: 1 for one "
    "commit, 2 for several].",
)
def run(
    bench: str | None,
    group: str,
    quick: bool,
    machine: str | None,
    commits: tuple[str, ...],
    passes: int | None,
) -> None:
    """Run the benchmarks in this Python environment and record them (asv --record-samples)."""
    commits = commits or ("HEAD",)
    passes = passes or (1 if len(commits) == 1 else 2)
    try:
        outcomes = lib.run_interleaved(
            _root(),
            commits,
            passes=passes,
            bench=bench,
            group=group,
            quick=quick,
            machine=machine,
            echo=click.echo,
        )
    except lib.PerfError as exc:
        _fail(exc)
    worst = max(o.exit_code for o in outcomes)
    for outcome in outcomes[-len(commits) :]:
        click.echo(
            f"harness perf run: results for {outcome.commit[:10]} on machine "
            f"{outcome.machine!r}, env {outcome.env_name!r}"
        )
    click.echo(
        "harness perf run: "
        + ("ok" if worst == 0 else "FAILED: a benchmark failed or asv erred (see above)")
    )
    sys.exit(worst)


@perf.command()
@click.argument("base")
@click.argument("head")
@click.option(
    "--factor",
    type=float,
    default=lib.DEFAULT_FACTOR,
    show_default=True,
    help="A benchmark regresses when head/base exceeds this AND asv's test finds "
    "the difference significant.",
)
@machine_option
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the rows as JSON to this file.",
)
def gate(base: str, head: str, factor: float, machine: str | None, json_path: Path | None) -> None:
    """Compare the results of BASE and HEAD. Exit 0: nothing regressed; 1: a benchmark is
    significantly slower than FACTOR allows, or fails; 2: nothing comparable (missing results,
    environment-name mismatch, changed benchmark code)."""
    try:
        report = lib.gate(_root(), base, head, factor=factor, machine=machine)
    except lib.PerfError as exc:
        _fail(exc, lib.EXIT_NOT_COMPARABLE)
    click.echo(report.markdown())
    if json_path:
        import json

        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    sys.exit(report.exit_code)


@perf.command()
@click.option(
    "--report-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("reports"),
    show_default=True,
)
@click.option("--full", is_flag=True, help="asv's default sampling instead of --quick's.")
@click.option(
    "--require-baseline",
    is_flag=True,
    help="Exit 2 when no baseline exists (pull-request jobs) instead of 0.",
)
@click.option(
    "--measure-base",
    type=click.Choice(["never", "missing", "always"]),
    default="never",
    show_default=True,
    help="Measure the base commit in this run (interleaved with HEAD): never (use "
    "stored results), when it has no stored results, or always (CI on shared "
    "runners).",
)
@click.option(
    "--passes",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Alternating passes over base and HEAD when the base is measured here.",
)
@click.option(
    "--group",
    type=click.Choice(sorted(lib.GROUPS)),
    default="cpu",
    show_default=True,
    help="The benchmark group this runner measures.",
)
@click.option("--bench", default=None, metavar="REGEX", help="Only benchmarks matching REGEX.")
@click.option(
    "--base-ref",
    default=None,
    metavar="REF",
    help="The default branch to take the merge-base with [default: found].",
)
@click.option("--factor", type=float, default=lib.DEFAULT_FACTOR, show_default=True)
@machine_option
def ci(
    report_dir: Path,
    full: bool,
    require_baseline: bool,
    measure_base: str,
    passes: int,
    group: str,
    bench: str | None,
    base_ref: str | None,
    factor: float,
    machine: str | None,
) -> None:
    """The perf step of `harness ci`: benchmarks for HEAD, gated against the base.
    Writes perf.md (also appended to $GITHUB_STEP_SUMMARY), perf-gate.json, perf-run.log."""
    try:
        result = lib.ci_step(
            _root(),
            report_dir,
            quick=not full,
            require_baseline=require_baseline,
            measure_base=measure_base,
            passes=passes,
            group=group,
            bench=bench,
            machine=machine,
            factor=factor,
            base_ref=base_ref,
            echo=click.echo,
        )
    except lib.PerfError as exc:
        _fail(exc, lib.EXIT_NOT_COMPARABLE)
    click.echo(result.markdown)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(result.markdown + "\n")
    sys.exit(result.exit_code)


@perf.command()
def publish() -> None:
    """Build the asv dashboard into .asv/html, working offline (libraries via npm pack)."""
    try:
        html = lib.publish(_root(), echo=click.echo)
    except lib.PerfError as exc:
        _fail(exc)
    click.echo(f"open it with: harness perf preview   (or serve {html} over HTTP)")


@perf.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8080, show_default=True)
@click.option("--no-publish", is_flag=True, help="Serve the existing .asv/html as it is.")
def preview(host: str, port: int, no_publish: bool) -> None:
    """Publish (unless --no-publish) and serve the dashboard on http://HOST:PORT/."""
    try:
        html = (
            lib.Project.load(_root()).html_dir
            if no_publish
            else lib.publish(_root(), echo=click.echo)
        )
        server = lib.dashboard_server(html, host=host, port=port)
    except lib.PerfError as exc:
        _fail(exc)
    click.echo(f"serving {html} on http://{host}:{server.server_address[1]}/ (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
