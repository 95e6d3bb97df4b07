"""`harness perf`: asv benchmarks, the regression gate and the offline dashboard.

A thin front for ``harness.perf``; docs/perf.md is the guide. Exit codes of `gate` and `ci`:
0 nothing regressed (every timing benchmark unchanged or improved, with evidence), 1 a
significant regression (or a failing benchmark), 2 undecided (too noisy to tell at the
factor), nothing comparable or too few samples. Every command exits 2 for a bad argument (a
machine name that is not one, a factor that cannot fail, a ref starting with '-', a regex
that does not compile, a --json folder that does not exist, no benchmark matched), checked
before any work.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from harness import perf as lib
from harness.cli.paths import writable_json_path


def _root() -> Path:
    return Path.cwd()


def _fail(exc: lib.PerfError, code: int = lib.EXIT_NOT_COMPARABLE) -> NoReturn:
    """A problem the user has to fix: exit 2 by default, never 1 (1 means "a regression" or
    "a benchmark failed")."""
    click.echo(f"harness perf: {exc}", err=True)
    sys.exit(code)


def _checked(check: Any) -> Any:
    """A click callback running one of harness.perf's checks (None passes: the default)."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        try:
            if isinstance(value, tuple):
                return tuple(check(v, source=param.opts[0]) for v in value)
            return check(value, source=param.opts[0] if param.opts else param.name)
        except lib.PerfError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None

    return callback


def _machine(machine: str | None) -> str:
    """The machine a command uses, $HARNESS_PERF_MACHINE checked before any work (exit 2)."""
    try:
        return lib.resolve_machine(machine)
    except lib.PerfError as exc:
        _fail(exc)


def _ref(value: str, *, source: str) -> str:
    return lib.check_ref(value, source=source)


machine_option = click.option(
    "--machine",
    default=None,
    metavar="NAME",
    callback=_checked(lib.check_machine),
    help=f"asv machine name (letters, digits, '.', '_', '-'); one per runner type "
    f"[default: ${lib.MACHINE_ENV_VAR} or {lib.DEFAULT_MACHINE}]",
)

factor_option = click.option(
    "--factor",
    type=float,
    default=lib.DEFAULT_FACTOR,
    show_default=True,
    callback=_checked(lib.check_factor),
    help="A benchmark regresses when head/base reaches this (> 1, <= "
    f"{lib.MAX_FACTOR:g}) AND its confidence interval is above 1; it is unchanged only when "
    "the interval lies inside (1/FACTOR, FACTOR); otherwise undecided (exit 2).",
)

bench_option = click.option(
    "--bench",
    default=None,
    metavar="REGEX",
    callback=_checked(lib.check_regex),
    help="Only benchmarks whose name (module.Class.method) matches REGEX (re.search).",
)

passes_option_range = click.IntRange(min=1, max=lib.MAX_PASSES)

counts_option = click.option(
    "--counts",
    is_flag=True,
    help="Also count instructions per call of each CPU timing benchmark under Valgrind "
    "(callgrind): a count regression fails only when interleaved A/B pairs at "
    "1 + --counts-threshold confirm it (undecided: exit 2). Needs valgrind and a C compiler "
    "(exit 2 naming what is missing). Slow: ~50x per benchmark call (docs/perf.md).",
)
counts_threshold_option = click.option(
    "--counts-threshold",
    type=float,
    default=lib.DEFAULT_COUNT_THRESHOLD,
    show_default=True,
    metavar="FRACTION",
    callback=_checked(lib.check_threshold),
    help="A count ratio head/base at or above 1 + FRACTION is a count regression (a benchmark "
    "sets its own with `harness_counts = 0.1`).",
)
cache_sim_option = click.option(
    "--cache-sim",
    is_flag=True,
    help="With --counts: also simulate caches (callgrind --cache-sim=yes; slower); the "
    "misses are measured, the instruction count decides.",
)


@click.group(name="perf")
def perf() -> None:
    """asv benchmarks (suites/benchmarks), the regression gate and the offline dashboard.

    Typical use: `harness perf run --commit BASE --commit HEAD` (base and head measured in
    alternation), then `harness perf gate BASE HEAD`. See docs/perf.md.
    """


@perf.command()
@bench_option
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
    help="One round, 5 samples per benchmark per pass (at least 7 in all): enough for "
    "the gate's significance test.",
)
@machine_option
@click.option(
    "--commit",
    "commits",
    multiple=True,
    metavar="REF",
    callback=_checked(_ref),
    help="Benchmark this commit (HEAD: the working tree; others from git archive) and "
    "record the results under its hash. Repeat it to measure several commits "
    "in alternation (base, head, base, head). [default: HEAD]",
)
@click.option(
    "--passes",
    type=passes_option_range,
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
    machine = _machine(machine)
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
@click.argument("base", callback=_checked(_ref))
@click.argument("head", callback=_checked(_ref))
@factor_option
@machine_option
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    callback=writable_json_path,
    help="Also write the rows as JSON to this file (its folder must exist).",
)
@counts_option
@counts_threshold_option
@cache_sim_option
def gate(
    base: str,
    head: str,
    factor: float,
    machine: str | None,
    json_path: Path | None,
    counts: bool,
    counts_threshold: float,
    cache_sim: bool,
) -> None:
    """Compare the results of BASE and HEAD. Exit 0: nothing regressed; 1: a benchmark is
    significantly slower than FACTOR allows, or fails; 2: undecided (too noisy to tell at
    FACTOR: the output says what it would need), nothing comparable (missing results,
    environment-name mismatch, changed benchmark code), too few samples to see a regression,
    or a bad argument."""
    machine = _machine(machine)
    try:
        root = _root()
        if counts:
            lib.check_counts_tools()  # before any work: exit 2 naming what is missing
            _check_head_is_checkout(root, head)
        report = lib.gate(root, base, head, factor=factor, machine=machine)
        if counts:
            report, note = lib.counts_tier(
                root,
                report,
                lib.resolve_commit(root, base),
                threshold=counts_threshold,
                cache_sim=cache_sim,
                echo=click.echo,
            )
            click.echo(note)
    except lib.PerfError as exc:
        _fail(exc, lib.EXIT_NOT_COMPARABLE)
    click.echo(report.markdown())
    if json_path:
        import json

        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    sys.exit(report.exit_code)


@perf.command(name="gpu-ab")
@click.argument("base", callback=_checked(_ref))
@click.argument("names", nargs=-1, required=True)
@factor_option
@click.option(
    "--pairs",
    type=click.IntRange(10, lib.MAX_AB_PAIRS),
    default=60,
    show_default=True,
    help="Pairs before the first look (more while undecided, sequentially).",
)
@click.option(
    "--budget",
    type=click.FloatRange(1, 3600),
    default=120.0,
    show_default=True,
    help="Seconds of sampling per benchmark at most.",
)
@click.option(
    "--ncu", "with_ncu", is_flag=True, help="Also one call per side under Nsight Compute (ncu)."
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    callback=writable_json_path,
    help="Also write the results as JSON to this file (its folder must exist).",
)
def gpu_ab(
    base: str,
    names: tuple[str, ...],
    factor: float,
    pairs: int,
    budget: float,
    with_ncu: bool,
    json_path: Path | None,
) -> None:
    """Time GPU benchmarks NAMES (module.Class.time_x, with "(params)" as asv names them) of
    commit BASE against the working tree: both in one process, each call after an L2 flush,
    timed with CUDA events, in interleaved pairs until decided (docs/perf.md). Exit 0:
    unchanged or improved; 1: regressed; 2: undecided, a benchmark that could not be
    measured, no CUDA device, or a bad argument."""
    from harness.perf import gpu_ab as gab

    for name in names:
        if "." not in name.partition("(")[0] or not name.partition("(")[0].split(".")[
            -1
        ].startswith("time_"):
            _fail(lib.PerfError(f"{name!r} is not a timing benchmark name (module.Class.time_x)"))
    try:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="harness-gpu-ab-tree-") as tmp:
            base_tree, head_tree = gab.trees_for(_root(), base, Path(tmp))
            results = gab.measure_gpu_ab_trees(
                base_tree,
                head_tree,
                list(names),
                factor=factor,
                pairs=pairs,
                max_seconds=budget,
                echo=lambda line: click.echo(line, err=True),
            )
            counters = gab.ncu_counters(base_tree, head_tree, list(names)) if with_ncu else None
    except lib.PerfError as exc:
        _fail(exc)
    click.echo(gab.markdown(results, counters))
    if json_path:
        import json

        data = {"results": gab.to_json(results)}
        if counters:
            data["ncu"] = {
                n: {"ratio": c.ratios(), "kernels": c.kernels} for n, c in counters.items()
            }
        json_path.write_text(json.dumps(data, indent=2) + "\n")
    sys.exit(gab.exit_code(results))


def _check_head_is_checkout(root: Path, head: str) -> None:
    """--counts measures the working tree as head (as A/B pairs do): HEAD must name it."""
    wanted = lib.resolve_commit(root, head)
    here = lib.resolve_commit(root, "HEAD")
    if wanted != here:
        raise lib.PerfError(
            f"--counts measures the working tree as head, but HEAD argument {head!r} is "
            f"{wanted[:10]}, not this checkout's HEAD {here[:10]}: check it out first"
        )


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
    help="Exit 2 when no baseline exists (pull-request jobs) instead of 0. Either way "
    "a run without a baseline keeps its results as the baseline of the next.",
)
@click.option(
    "--measure-base",
    type=click.Choice(lib.MEASURE_BASE),
    default="never",
    show_default=True,
    help="Measure the base commit in this run (interleaved with HEAD): never (use "
    "stored results), when it has no stored results, or always (CI on shared "
    "runners).",
)
@click.option(
    "--passes",
    type=passes_option_range,
    default=1,
    show_default=True,
    help="Alternating asv passes over base and HEAD when the base is measured here.",
)
@click.option(
    "--ab-pairs",
    type=click.IntRange(min=0, max=lib.MAX_AB_PAIRS),
    default=lib.DEFAULT_PAIRS,
    show_default=True,
    help="Time timing benchmarks again in interleaved base/head sample pairs, which decide "
    "their verdict: this many first, more while undecided (every timing benchmark when the "
    "base is measured here; the undecided and regressed ones when it is stored). 0: the asv "
    "samples decide.",
)
@click.option(
    "--ab-start",
    type=click.Choice(list(lib.AB_STARTS)),
    default=lib.DEFAULT_START,
    show_default=True,
    help="How each block's fresh pair of A/B workers starts: forked from one zygote per side "
    "(imports paid once) or exec'd afresh (the design before; docs/perf.md compares them).",
)
@click.option(
    "--ab-budget",
    type=click.FloatRange(min=0, min_open=True, max=3600),
    default=lib.MAX_SECONDS_PER_BENCHMARK,
    show_default=True,
    metavar="SECONDS",
    help="At most this many seconds of A/B pairs per benchmark (one that sets harness_ab_budget "
    "takes its own); still undecided then: exit 2.",
)
@click.option(
    "--group",
    type=click.Choice(sorted(lib.GROUPS)),
    default="cpu",
    show_default=True,
    help="The benchmark group this runner measures.",
)
@bench_option
@click.option(
    "--base-ref",
    default=None,
    metavar="REF",
    callback=_checked(_ref),
    help="The default branch to take the merge-base with [default: found].",
)
@factor_option
@machine_option
@counts_option
@counts_threshold_option
@cache_sim_option
def ci(
    report_dir: Path,
    full: bool,
    require_baseline: bool,
    measure_base: lib.MeasureBase,  # one of click.Choice's, checked again by PerfStepConfig
    passes: int,
    ab_pairs: int,
    ab_start: str,
    ab_budget: float,
    group: str,
    bench: str | None,
    base_ref: str | None,
    factor: float,
    machine: str | None,
    counts: bool,
    counts_threshold: float,
    cache_sim: bool,
) -> None:
    """The perf step of `harness ci`: benchmarks for HEAD, gated against the base.
    Writes perf.md (also appended to $GITHUB_STEP_SUMMARY), perf-gate.json, perf-run.log."""
    try:
        config = lib.PerfStepConfig(
            quick=not full,
            require_baseline=require_baseline,
            measure_base=measure_base,
            passes=passes,
            ab_pairs=ab_pairs,
            ab_start=ab_start,
            ab_budget_s=ab_budget,
            group=group,
            bench=bench,
            machine=_machine(machine),
            factor=factor,
            base_ref=base_ref,
            counts=counts,
            counts_threshold=counts_threshold,
            counts_cache_sim=cache_sim,
        )
        result = lib.ci_step(_root(), report_dir, config, echo=click.echo)
    except lib.PerfError as exc:
        _fail(exc, lib.EXIT_NOT_COMPARABLE)
    click.echo(result.markdown)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(result.markdown + "\n")
    sys.exit(result.exit_code)


@perf.command()
@bench_option
@click.option(
    "--group",
    type=click.Choice(sorted(lib.GROUPS)),
    default="cpu",
    show_default=True,
    help="The benchmark group to calibrate (A/B pairs are CPU time: not the GPU group).",
)
@factor_option
@click.option(
    "--trials",
    type=click.IntRange(min=1, max=1000),
    default=lib.DEFAULT_TRIALS,
    show_default=True,
    help="Trials per level (A/A, and each slowdown); 20 resolves a 95% rate as 19 of 20.",
)
@click.option(
    "--slowdown",
    "slowdowns",
    type=float,
    multiple=True,
    metavar="FRACTION",
    help="Injected extra work per sample, repeatable "
    f"[default: {', '.join(f'{x:g}' for x in lib.DEFAULT_SLOWDOWNS)}].",
)
@click.option(
    "--ab-pairs",
    type=click.IntRange(min=1, max=lib.MAX_AB_PAIRS),
    default=lib.DEFAULT_PAIRS,
    show_default=True,
    help="A/B pairs before the first look of each trial, as the gate takes them.",
)
@click.option(
    "--ab-start",
    type=click.Choice(list(lib.AB_STARTS)),
    default=lib.DEFAULT_START,
    show_default=True,
    help="How each block's fresh pair of A/B workers starts: forked from one zygote per side "
    "(imports paid once) or exec'd afresh (the design before; docs/perf.md compares them).",
)
@click.option(
    "--ab-budget",
    type=click.FloatRange(min=0, min_open=True, max=3600),
    default=lib.MAX_SECONDS_PER_BENCHMARK,
    show_default=True,
    metavar="SECONDS",
    help="At most this many seconds of A/B pairs per benchmark and trial (one that sets "
    "harness_ab_budget takes its own).",
)
@click.option(
    "--shard",
    default=None,
    metavar="K/N",
    callback=lambda _ctx, _param, value: _shard_spec(value),
    help="Only the K-th of N shards of the matched benchmarks (every N-th in name order from "
    "the K-th, 0 <= K < N): N runs calibrate each once (the nightly job takes one a night).",
)
@machine_option
def calibrate(
    bench: str | None,
    group: str,
    factor: float,
    trials: int,
    slowdowns: tuple[float, ...],
    ab_pairs: int,
    ab_start: str,
    ab_budget: float,
    shard: str | None,
    machine: str | None,
) -> None:
    """Measure the gate on this machine now: A/A runs (the working tree against itself) and
    injected slowdowns, per timing benchmark, at FACTOR. Records the sample CV, the A/A pass
    and false-alarm rates and the smallest slowdown caught in >= 95% of trials in
    .asv/calibration/MACHINE.json; the gate then refuses a factor a benchmark cannot support.
    Long: trials x (1 + slowdowns) gate measurements per benchmark."""
    import re

    from rich.progress import Progress

    machine = _machine(machine)
    try:
        levels = lib.check_slowdowns(slowdowns or lib.DEFAULT_SLOWDOWNS)
        root = _root()
        project = lib.Project.load(root)
        if group == "gpu":
            raise lib.PerfError(
                "--group gpu cannot be calibrated with A/B pairs: they time CPU, and a CUDA "
                "kernel's CPU time is its launch (docs/perf.md)"
            )
        pattern = lib.bench_regex(group, bench)
        names = [  # never a time_info_* benchmark: the gate shows it and never gates it
            n
            for n in lib.list_timing_benchmarks(root)
            if (not pattern or re.search(pattern, n)) and not lib.INFORMATIONAL.search(n)
        ]
        if not names:
            raise lib.PerfError(f"no timing benchmark matched {bench!r} in group {group}")
        if shard is not None:
            names = lib.calibration_shard(names, shard)
            if not names:
                raise lib.PerfError(f"shard {shard} of {group} holds no timing benchmark")
        head = lib.resolve_commit(project.root, "HEAD")
        click.echo(
            f"harness perf calibrate: {len(names)} benchmark(s), {trials} trials of A/A and of "
            f"{', '.join(f'+{x:.0%}' for x in levels)} at factor {factor:g}, load "
            f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        with Progress(transient=False) as bar:
            task = bar.add_task("calibrating", total=trials * (1 + len(levels)))

            def measure(todo: Any, extra: float) -> dict[str, lib.ABResult]:
                found: dict[str, lib.ABResult] = lib.measure_ab(
                    root,
                    head,
                    todo,
                    factor=factor,
                    pairs=ab_pairs,
                    max_seconds=ab_budget,
                    extra=extra,
                    start=ab_start,
                )
                bar.advance(task)
                return found

            found = lib.calibrate(
                names,
                measure,
                factor=factor,
                trials=trials,
                slowdowns=levels,
                progress=lambda what: bar.update(task, description=what),
            )
        path = lib.calibration_save(
            project, machine, factor, found, env=lib.env_name(), slowdowns=levels
        )
    except lib.PerfError as exc:
        _fail(exc)
    for r in found:
        caught = ", ".join(f"+{float(k):.0%}: {v:.0%}" for k, v in r.caught.items())
        smallest = "none" if r.smallest_caught is None else f"+{r.smallest_caught:.0%}"
        click.echo(
            f"{r.name}: CV {_pct(r.cv)}, block CV {_pct(r.block_cv)}; A/A passed "
            f"{r.pass_rate:.0%} (false alarms {r.false_alarm_rate:.0%}, undecided "
            f"{r.undecided_rate:.0%}); caught {caught}; smallest caught in >= 95%: {smallest}"
            + (f"; {len(r.errors)} failed measurement(s): {r.errors[0]}" if r.errors else "")
        )
    click.echo(f"harness perf calibrate: recorded in {path}")


def _shard_spec(value: str | None) -> str | None:
    """--shard checked before any work (exit 2 naming the value)."""
    if value is not None:
        try:
            lib.calibration_shard([], value)
        except lib.PerfError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


@perf.command()
def publish() -> None:
    """Build the asv dashboard into .asv/html, working offline (libraries via npm pack)."""
    try:
        html = lib.publish(_root(), echo=click.echo)
    except lib.PerfError as exc:
        _fail(exc, 1)
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
        _fail(exc, 1)
    click.echo(f"serving {html} on http://{host}:{server.server_address[1]}/ (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
