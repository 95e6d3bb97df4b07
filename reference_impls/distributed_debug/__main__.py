"""Command line: analyse dumped records offline, or run the demo under torchrun.

    python -m reference_impls.distributed_debug analyze DIR [--json]
    torchrun --nproc-per-node 4 -m reference_impls.distributed_debug demo --scenario seed

``analyze`` reads ``DIR/rank*.json`` (what the reporter writes under ``report_dir/records``, or
``Tracer.dump_to``), prints the report and exits 0 when nothing is wrong, 1 when it names a
problem, 2 on unusable input. ``demo`` runs a scenario on every rank over gloo on CPU: traced,
the stall report appears within ``--stall-s`` plus about a second and every rank exits with
code 3; with ``--no-trace`` it hangs until the process group timeout (``--pg-timeout-s``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
from pathlib import Path

DEMO_EXIT_CODE = 3


def _analyze(args: argparse.Namespace) -> int:
    from reference_impls.distributed_debug.analysis import Kind, analyze, format_report
    from reference_impls.distributed_debug.records import RecordsError, load_dumps

    try:
        dumps = load_dumps(Path(args.dir))
        report = analyze(dumps, reason=f"offline analysis of {args.dir}")
    except RecordsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=2) if args.json else format_report(report))
    return 0 if report.primary.kind is Kind.NONE else 1


def _demo(args: argparse.Namespace) -> int:
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print(
            "error: demo runs one process per rank under torchrun, e.g.\n"
            "  torchrun --nproc-per-node 4 -m reference_impls.distributed_debug demo "
            "--scenario seed",
            file=sys.stderr,
        )
        return 2
    import torch
    import torch.distributed as dist

    from reference_impls.distributed_debug.config import TraceConfig
    from reference_impls.distributed_debug.scenarios import SCENARIOS, run_scenario

    if args.fix and args.scenario != "seed":
        print(
            f"error: --fix applies to the seed scenario only, not {args.scenario!r}",
            file=sys.stderr,
        )
        return 2
    if args.scenario not in SCENARIOS:
        print(
            f"error: unknown scenario {args.scenario!r}; known: {', '.join(SCENARIOS)}",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=args.pg_timeout_s))
    config = TraceConfig(
        stall_s=args.stall_s,
        report_dir=Path(args.report_dir),
        exit_code_after_report=DEMO_EXIT_CODE,
        heartbeat_s=0.5,
        dead_after_s=2.0,
    )
    if rank == 0:
        mode = (
            "traced"
            if args.trace
            else f"NOT traced: a hang lasts the group timeout ({args.pg_timeout_s:g} s)"
        )
        print(
            f"demo: scenario {args.scenario!r} on {world} gloo ranks, {mode}",
            file=sys.stderr,
            flush=True,
        )
    try:
        if args.fix:
            from reference_impls.distributed_debug import validate
            from reference_impls.distributed_debug.tracer import trace_collectives

            with trace_collectives(config=config) if args.trace else contextlib.nullcontext():
                result = validate.run(rank, world, fix=args.fix)
        else:
            result = run_scenario(rank, world, args.scenario, config, trace=args.trace)
    except RuntimeError as exc:
        print(f"rank {rank}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr, flush=True)
        os._exit(1)  # a group whose peer failed can hang in teardown
    print(f"rank {rank}: finished: {result}", flush=True)
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m reference_impls.distributed_debug", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyze", help="analyse a directory of rank*.json dumps")
    a.add_argument("dir", help="directory holding rank0.json, rank1.json, ...")
    a.add_argument("--json", action="store_true", help="print the report as JSON")
    d = sub.add_parser("demo", help="run a desync scenario on every rank (under torchrun)")
    d.add_argument(
        "--scenario",
        default="seed",
        help="seed (default), op_mismatch, argument_mismatch, skipped, straggler, dead_rank, "
        "unmatched_p2p, healthy",
    )
    d.add_argument(
        "--no-trace",
        dest="trace",
        action="store_false",
        help="run without the tracer (the hang lasts the group timeout)",
    )
    d.add_argument(
        "--fix",
        choices=("pad", "join", "hoist"),
        help="seed only: run it with one of the three fixes",
    )
    d.add_argument(
        "--stall-s", type=float, default=2.0, help="stall threshold in seconds (default 2)"
    )
    d.add_argument(
        "--pg-timeout-s",
        type=float,
        default=60.0,
        help="process group timeout in seconds (default 60)",
    )
    d.add_argument(
        "--report-dir",
        default="distributed_debug",
        help="where the report goes (default ./distributed_debug)",
    )
    args = p.parse_args(argv)
    if args.command == "analyze":
        return _analyze(args)
    return _demo(args)


if __name__ == "__main__":
    sys.exit(main())
