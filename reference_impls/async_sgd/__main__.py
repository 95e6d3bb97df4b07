"""Command line: ``python -m reference_impls.async_sgd {train,simulate,analyze,bench} ...``.

* ``train``: the real parameter server on gloo. Under ``torchrun`` (rank 0 serves, the other
  ranks work)::

      torchrun --nproc-per-node 5 -m reference_impls.async_sgd train --policy inverse --stragglers 1

  or without torchrun, ``--workers N`` starts 1 + N gloo processes on this machine.
* ``simulate``: the same server logic on a simulated clock, replayable from ``--seed``;
  ``--control`` also writes the same run without stragglers to OUT/control.
* ``analyze RUN_DIR [--control DIR]``: staleness vs loss correlation with a bootstrap
  interval, plots into RUN_DIR.
* ``bench``: async parameter server vs DistributedDataParallel on gloo (updates/s, time to a
  target loss with one worker 3x slower).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
from pathlib import Path

from reference_impls.async_sgd.policies import Bound, PolicyError, StalenessPolicy, make_policy
from reference_impls.async_sgd.problem import ProblemConfig


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _add_policy(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("policy")
    g.add_argument(
        "--policy",
        default="inverse",
        choices=("inverse", "alpha-over-s", "constant"),
        help="learning-rate factor of staleness s: 1/(1+s) (default), alpha/s, or 1",
    )
    g.add_argument("--alpha", type=float, default=None, help="alpha of --policy alpha-over-s")
    g.add_argument(
        "--bound",
        default="none",
        choices=[b.value for b in Bound],
        help="bounded staleness: ssp (a worker more than --s-max clocks ahead of the slowest "
        "blocks) or reject (the server rejects updates with s > --s-max); default none",
    )
    g.add_argument("--s-max", type=int, default=None, help="the bound of --bound (>= 0)")
    g.add_argument("--momentum", type=float, default=0.0, help="momentum mu (default 0)")
    g.add_argument(
        "--momentum-correction",
        action="store_true",
        help="lower the explicit momentum by the implicit 1 - 1/N_eff asynchrony adds",
    )


def _add_problem(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("problem (synthetic)")
    g.add_argument("--problem", default="logreg", choices=("logreg", "mlp"))
    g.add_argument("--samples", type=_positive_int, default=1024)
    g.add_argument("--dim", type=_positive_int, default=16)
    g.add_argument("--hidden", type=_positive_int, default=32, help="MLP hidden width")
    g.add_argument("--batch-size", type=_positive_int, default=16)
    g.add_argument("--seed", type=int, default=0)


def _policy(args: argparse.Namespace) -> StalenessPolicy:
    return make_policy(
        args.policy,
        bound=args.bound,
        s_max=args.s_max,
        alpha=args.alpha,
        momentum=args.momentum,
        momentum_correction=args.momentum_correction,
    )


def _problem(args: argparse.Namespace) -> ProblemConfig:
    return ProblemConfig(
        kind=args.problem,
        samples=args.samples,
        dim=args.dim,
        hidden=args.hidden,
        batch_size=args.batch_size,
        seed=args.seed,
    )


def _default_out(kind: str) -> str:
    return str(Path("reports") / "async_sgd" / f"{kind}-{dt.datetime.now():%Y%m%d-%H%M%S}")


def _writable_dir(path: str | Path, flag: str) -> Path:
    """``path`` as a run directory, created now: a file in its place (or a parent that is a
    file, or no permission) is refused before any work, not after the run it would lose."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"cannot use {flag} {path} as a directory ({exc.strerror}): pass a new or existing "
            "directory you can write to"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path} is not writable: pass a directory you can write to")
    return path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m reference_impls.async_sgd",
        description="Asynchronous SGD with bounded staleness: parameter server, simulator, "
        "analysis.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="real parameter server on gloo (torchrun or --workers)")
    _add_policy(t)
    _add_problem(t)
    t.add_argument(
        "--workers",
        type=_positive_int,
        default=4,
        help="without torchrun: worker processes to start (default 4)",
    )
    t.add_argument("--updates", type=_positive_int, default=300, help="applied updates (300)")
    t.add_argument("--lr", type=float, default=0.5)
    t.add_argument(
        "--stragglers",
        type=int,
        default=0,
        help="the last K workers are --slowdown times slower (default 0)",
    )
    t.add_argument("--slowdown", type=float, default=3.0)
    t.add_argument(
        "--out", default=None, help="run directory (default reports/async_sgd/train-TIME)"
    )
    t.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="server checkpoint every N updates (0: at the end only)",
    )
    t.add_argument("--resume", default=None, help="server checkpoint to resume from")
    t.add_argument(
        "--dead-after",
        type=float,
        default=5.0,
        help="seconds without heartbeat before a worker is declared dead (5)",
    )
    t.add_argument("--max-time", type=float, default=300.0, help="stop after this many seconds")
    t.add_argument(
        "--eval-every", type=int, default=1, help="full-data loss every N updates (0: never)"
    )

    s = sub.add_parser("simulate", help="deterministic discrete-event simulation")
    _add_policy(s)
    _add_problem(s)
    s.add_argument("--workers", type=_positive_int, default=8)
    s.add_argument("--updates", type=_positive_int, default=600)
    s.add_argument("--lr", type=float, default=1.0)
    s.add_argument("--stragglers", type=int, default=0)
    s.add_argument("--slowdown", type=float, default=3.0)
    s.add_argument(
        "--stall-every-ms",
        type=float,
        default=None,
        help="stragglers stall every this many simulated ms",
    )
    s.add_argument("--stall-ms", type=float, default=100.0, help="length of a stall (100)")
    s.add_argument("--dies", type=int, default=None, help="worker that dies")
    s.add_argument("--dies-at-ms", type=float, default=None)
    s.add_argument("--out", default=None, help="run directory (default reports/async_sgd/sim-TIME)")
    s.add_argument(
        "--control",
        action="store_true",
        help="also run without stragglers/stalls/deaths into OUT/control",
    )

    a = sub.add_parser("analyze", help="staleness vs loss correlation and plots of a run")
    a.add_argument("run_dir")
    a.add_argument("--control", default=None, help="control run directory (no stragglers)")
    a.add_argument("--window", type=int, default=20, help="updates per window (20)")
    a.add_argument(
        "--contrast",
        type=float,
        default=1.5,
        help="top/bottom quarter staleness ratio that counts as high-staleness windows",
    )
    a.add_argument("--no-plots", action="store_true")

    b = sub.add_parser("bench", help="async vs DDP on gloo (see docs/benchmarks/async_sgd.md)")
    b.add_argument("--workers", type=_positive_int, default=4)
    b.add_argument("--seconds", type=float, default=10.0, help="length of each throughput run")
    b.add_argument(
        "--repeat",
        type=_positive_int,
        default=3,
        help="time-to-target runs per mode (medians reported; default 3)",
    )
    b.add_argument("--json", default=None, help="also write the results here")
    return p


def _cmd_train(args: argparse.Namespace) -> int:
    from reference_impls.async_sgd.distributed import ServerReport, TrainConfig, run_rank

    out = args.out or _default_out("train")
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else args.workers + 1
    if not 0 <= args.stragglers < world:
        raise ValueError(f"--stragglers must be in [0, {world - 1}], got {args.stragglers}")
    if args.samples < world - 1:
        raise ValueError(
            f"samples must be >= workers ({world - 1}): each worker draws from its own shard "
            f"of the samples, got samples={args.samples}"
        )
    config = TrainConfig(
        policy=_policy(args),
        problem=_problem(args),
        lr=args.lr,
        updates=args.updates,
        out_dir=out,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        stragglers=tuple(range(world - args.stragglers, world)),
        slowdown=args.slowdown,
        dead_after_s=args.dead_after,
        max_time_s=args.max_time,
        eval_every=args.eval_every,
        progress_every=max(1, args.updates // 10),
    )
    # After the config is made (and so checked): a refused option creates no directory.
    if os.environ.get("RANK", "0") == "0":  # the server writes; the workers need not look
        _writable_dir(out, "--out")
    if under_torchrun:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        report = run_rank(rank, world, config)
        if rank != 0:
            dist.destroy_process_group()
            return 0
    else:
        from reference_impls.collectives.launcher import LaunchConfig, launch

        report = launch(
            run_rank, config, config=LaunchConfig(world_size=world, timeout_s=args.max_time + 60)
        )[0]
    assert isinstance(report, ServerReport)  # rank 0 serves
    print(
        f"async SGD ({world - 1} workers, policy {args.policy}, bound {args.bound}): "
        f"version {report.version} in {report.wall_s:.1f} s, final loss {report.final_loss:.4f}, "
        f"counts {report.counts}, stop: {report.stop_reason}"
    )
    for d in report.deaths:
        print(
            f"  worker {d['worker']} died: declared at t={d['time_s']:.1f}s, "
            f"version {d['version']}, last push {d['last_seq']} ({d['reason']})"
        )
    print(f"run directory: {out} (analyze it: python -m reference_impls.async_sgd analyze {out})")
    if report.error:
        print(f"error: {report.error}", file=sys.stderr)
    sys.stdout.flush()
    if under_torchrun and report.deaths:
        os._exit(0 if not report.error else 1)  # a group with a dead peer can hang in teardown
    return 1 if report.error else 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from reference_impls.async_sgd.problem import Problem
    from reference_impls.async_sgd.runlog import write_run
    from reference_impls.async_sgd.simulator import SimConfig, simulate, speed_profile

    out = Path(args.out or _default_out("sim"))
    policy = _policy(args)
    problem_cfg = _problem(args)
    problem = Problem(problem_cfg)
    runs = [
        (
            out,
            {
                "stragglers": args.stragglers,
                "slowdown": args.slowdown,
                "stall_every_ms": args.stall_every_ms,
                "stall_ms": args.stall_ms,
                "dies": args.dies,
                "dies_at_ms": args.dies_at_ms,
            },
        )
    ]
    if args.control:
        runs.append((out / "control", {}))
    # Every config is made (and so checked) before the run directory exists: a refused
    # option leaves nothing behind.
    configs = [
        SimConfig(
            policy=policy,
            problem=problem_cfg,
            speeds=speed_profile(args.workers, **kw),
            updates=args.updates,
            lr=args.lr,
            seed=args.seed,
        )
        for _, kw in runs
    ]
    _writable_dir(out, "--out")
    for (run_dir, _), config in zip(runs, configs, strict=True):
        result = simulate(config, problem)
        write_run(run_dir, result.log, result.summary(config, problem))
        applied = [r.staleness for r in result.log if r.status.value == "applied"]
        print(
            f"{run_dir}: {len(applied)} updates in {result.sim_time_ms:.0f} simulated ms "
            f"({result.wall_s:.2f} s wall), max staleness {max(applied)}, "
            f"final loss {problem.full_loss(result.params):.4f}, counts {result.counts}"
        )
        for d in result.deaths:
            print(
                f"  worker {d.worker} declared dead at {d.time_s * 1000:.0f} ms "
                f"(version {d.version})"
            )
    return 0


def _cmd_analyze(args: argparse.Namespace) -> int:
    from reference_impls.async_sgd.analysis import analyze_run

    if args.control and Path(args.control).resolve() == Path(args.run_dir).resolve():
        raise ValueError(
            f"--control {args.control} is the run itself: a control is a separate run of the "
            "same setup without stragglers (simulate --control writes one to OUT/control)"
        )
    results = [
        (
            "run",
            analyze_run(
                args.run_dir, window=args.window, contrast=args.contrast, plots=not args.no_plots
            ),
        )
    ]
    if args.control:
        results.append(
            (
                "control",
                analyze_run(
                    args.control,
                    window=args.window,
                    contrast=args.contrast,
                    plots=not args.no_plots,
                ),
            )
        )
    for label, r in results:
        print(
            f"{label}: {r['run_dir']} ({r['windows']} windows of {r['window']} updates, "
            f"{r['loss_source']}, mean staleness {r['mean_staleness']:.2f}, "
            f"staleness contrast {r['staleness_contrast']:.2f})"
        )
        for key in ("staleness_vs_slowdown", "staleness_vs_spread"):
            c = r[key]
            print(
                f"  {key}: r = {c['r']:+.3f}, {c['confidence']:.0%} CI [{c['low']:+.3f}, "
                f"{c['high']:+.3f}] -> {'FOUND' if c['found'] else 'not found'}"
            )
        for plot in r.get("plots", []):
            print(f"  plot: {plot}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from reference_impls.async_sgd.bench import run_all

    if not (math.isfinite(args.seconds) and args.seconds > 0):
        raise ValueError(f"--seconds must be a finite number > 0, got {args.seconds}")
    if args.json:
        _writable_dir(Path(args.json).parent, "the directory of --json")
        if Path(args.json).is_dir():
            raise ValueError(f"--json {args.json} is a directory: pass a file name")
    results = run_all(workers=args.workers, seconds=args.seconds, repeat=args.repeat)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands = {
        "train": _cmd_train,
        "simulate": _cmd_simulate,
        "analyze": _cmd_analyze,
        "bench": _cmd_bench,
    }
    try:
        return commands[args.command](args)
    except (PolicyError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
