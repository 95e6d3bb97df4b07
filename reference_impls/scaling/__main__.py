"""Why N GPUs do not give N times the speed: investigate, project, transport, ddp.

    python -m reference_impls.scaling investigate --world-sizes 1,2 --out DIR [--device cpu]
    python -m reference_impls.scaling project --fixed-ms 100 --per-sample-us 6250 \\
        --grad-bytes 1073741824 --buckets 40 --batch 1024 --alpha-us 42 --beta-GBps 23
    python -m reference_impls.scaling project --seeds-example
    python -m reference_impls.scaling transport nccl.log [--expect-nvlink]
    python -m reference_impls.scaling ddp --out DIR ...   (the DDP step-timing driver)

Exit status: 0 done; 1 a world size failed or a transport warning; 2 bad input (a transport
log with no NCCL lines at all is bad input, not a warning).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def _ints(text: str) -> tuple[int, ...]:
    """Comma-separated integers; an empty item (``1,,2``, a trailing comma) is a typo, not a
    request for fewer values, so it is an error rather than silently dropped."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 1,2,4 with no empty items; got {text!r}"
        )
    try:
        return tuple(int(t) for t in items)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 1,2,4; got {text!r}"
        ) from None


def _words(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _investigate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "investigate",
        help="run the same training at each world size; report breakdown, efficiency, "
        "verdict, projection",
        description="Run the training loop's model under DDP at each world size (strong and weak "
        "scaling), break every rank's steps down, and write report.md, scaling.json and PNG plots.",
    )
    p.add_argument(
        "--world-sizes",
        type=_ints,
        default=(1, 2),
        help="e.g. 1,2 (default) or 1,2,4,8; must include 1",
    )
    p.add_argument(
        "--out", required=True, help="directory for report.md, scaling.json, *.png, records/"
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: gloo; cuda: NCCL, one GPU per rank",
    )
    p.add_argument(
        "--modes", type=_words, default=("strong", "weak"), help="strong,weak (default both)"
    )
    p.add_argument(
        "--global-batch", type=int, default=64, help="strong scaling global batch (default 64)"
    )
    p.add_argument(
        "--per-rank-batch", type=int, default=64, help="weak scaling per-rank batch (default 64)"
    )
    p.add_argument("--in-features", type=int, default=64)
    p.add_argument(
        "--hidden", type=_ints, default=(256, 256), help="hidden widths (default 256,256)"
    )
    p.add_argument("--steps", type=int, default=20, help="timed steps per case (default 20)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--overhead-blocks", type=int, default=1, help="profiler off/on block pairs (0: skip)"
    )
    p.add_argument(
        "--loader-sleep-ms", type=float, default=0.0, help="inject: sleep per batch in the loader"
    )
    p.add_argument(
        "--loader-fail-at", type=int, default=None, help="inject: the loader raises at this batch"
    )
    p.add_argument(
        "--slow-rank", type=int, default=None, help="inject: this rank sleeps --slow-ms per step"
    )
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument(
        "--hang-at-step", type=int, default=None, help="inject: the last rank blocks forever here"
    )
    p.add_argument("--timeout-s", type=float, default=180.0, help="per world size (default 180)")
    p.add_argument("--project-worlds", type=_ints, default=(8, 64, 512))
    p.add_argument(
        "--link-alpha-us", type=float, default=None, help="projection: given latency per ring step"
    )
    p.add_argument(
        "--link-beta-GBps", type=float, default=None, help="projection: given bus bandwidth"
    )
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument(
        "--inter-alpha-us", type=float, default=None, help="network latency past one node"
    )
    p.add_argument(
        "--inter-beta-GBps", type=float, default=None, help="network bus bandwidth past one node"
    )
    p.add_argument("--no-nccl-debug", dest="nccl_debug", action="store_false")
    p.add_argument("--seed", type=int, default=0)


def _project_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "project", help="the cost model alone: step time, comm share, efficiency at N ranks"
    )
    p.add_argument(
        "--seeds-example", action="store_true", help="the 8 -> 64 GPUs, 2x instead of 8x example"
    )
    p.add_argument("--fixed-ms", type=float, default=0.0)
    p.add_argument("--per-sample-us", type=float, default=None)
    p.add_argument("--grad-bytes", type=int, default=None)
    p.add_argument("--buckets", type=int, default=1)
    p.add_argument("--backward-fraction", type=float, default=0.6)
    p.add_argument("--scaling", choices=("strong", "weak"), default="strong")
    p.add_argument(
        "--batch", type=int, default=None, help="global (strong) or per-rank (weak) batch"
    )
    p.add_argument("--alpha-us", type=float, default=None)
    p.add_argument("--beta-GBps", type=float, default=None)
    p.add_argument("--gpus-per-node", type=int, default=1 << 30)
    p.add_argument("--inter-alpha-us", type=float, default=None)
    p.add_argument("--inter-beta-GBps", type=float, default=None)
    p.add_argument("--worlds", type=_ints, default=(1, 8, 64, 512))
    p.add_argument("--no-overlap", dest="overlap", action="store_false")
    p.add_argument("--json", action="store_true", help="JSON instead of a table")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference_impls.scaling", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _investigate_parser(sub)
    _project_parser(sub)
    t = sub.add_parser(
        "transport", help="parse NCCL_DEBUG=INFO output: which transport NCCL picked"
    )
    t.add_argument("logs", nargs="+", help="log files (NCCL_DEBUG_FILE output or captured stderr)")
    t.add_argument(
        "--expect-nvlink", action="store_true", help="warn when the intra-node link is not NVLink"
    )
    sub.add_parser(
        "ddp",
        help="the DDP step-timing driver (python -m reference_impls.scaling.ddp --help)",
        add_help=False,
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "ddp":
        from reference_impls.scaling.ddp import main as ddp_main

        return ddp_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "investigate":
        return _investigate(args)
    if args.command == "project":
        return _project(args, parser)
    return _transport(args)


def _investigate(args: argparse.Namespace) -> int:
    from reference_impls.scaling.investigate import (
        InvestigateConfig,
        InvestigationError,
        investigate,
    )

    us = 1e-6
    try:
        cfg = InvestigateConfig(
            world_sizes=args.world_sizes,
            device=args.device,
            modes=args.modes,
            global_batch=args.global_batch,
            per_rank_batch=args.per_rank_batch,
            in_features=args.in_features,
            hidden=args.hidden,
            steps=args.steps,
            warmup=args.warmup,
            overhead_blocks=args.overhead_blocks,
            loader_sleep_ms=args.loader_sleep_ms,
            loader_fail_at=args.loader_fail_at,
            slow_rank=args.slow_rank,
            slow_ms=args.slow_ms,
            hang_at_step=args.hang_at_step,
            timeout_s=args.timeout_s,
            project_worlds=args.project_worlds,
            link_alpha_s=None if args.link_alpha_us is None else args.link_alpha_us * us,
            link_beta_Bps=None if args.link_beta_GBps is None else args.link_beta_GBps * 1e9,
            gpus_per_node=args.gpus_per_node,
            inter_alpha_s=None if args.inter_alpha_us is None else args.inter_alpha_us * us,
            inter_beta_Bps=None if args.inter_beta_GBps is None else args.inter_beta_GBps * 1e9,
            nccl_debug=args.nccl_debug,
            seed=args.seed,
        )
        report = investigate(cfg, Path(args.out))
    except InvestigationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for mode in report.get("verdict", {}).get("modes", {}).values():
        print("verdict: " + mode["text"])
    for w, f in report.get("failures", {}).items():
        print(f"world {w} failed: {f['summary']}", file=sys.stderr)
    return 0 if report["ok"] else 1


def _project(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from reference_impls.scaling import costmodel

    if args.seeds_example:
        work, link = costmodel.seeds_example()
    else:
        missing = [
            n
            for n in ("per_sample_us", "grad_bytes", "batch", "alpha_us", "beta_GBps")
            if getattr(args, n) is None
        ]
        if missing:
            print(
                "error: project needs --"
                + ", --".join(m.replace("_", "-") for m in missing)
                + " (or --seeds-example)",
                file=sys.stderr,
            )
            return 2
        try:
            work = costmodel.Workload(
                fixed_s=args.fixed_ms / 1e3,
                per_sample_s=args.per_sample_us / 1e6,
                grad_bytes=args.grad_bytes,
                buckets=args.buckets,
                backward_fraction=args.backward_fraction,
                scaling=args.scaling,
                batch=args.batch,
            )
            link = costmodel.Interconnect(
                alpha_s=args.alpha_us / 1e6,
                beta_Bps=args.beta_GBps * 1e9,
                gpus_per_node=args.gpus_per_node,
                inter_alpha_s=None if args.inter_alpha_us is None else args.inter_alpha_us / 1e6,
                inter_beta_Bps=None if args.inter_beta_GBps is None else args.inter_beta_GBps * 1e9,
            )
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    try:
        preds = costmodel.project(work, link, args.worlds, overlap=args.overlap)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([p.to_dict() for p in preds], indent=1))
        return 0
    print(f"{work}\n{link}\noverlap: {args.overlap}")
    print("| ranks | step ms | compute ms | comm ms | exposed comm share | speedup | efficiency |")
    print("|---|---|---|---|---|---|---|")
    for p in preds:
        print(
            f"| {p.world} | {1e3 * p.step_s:.2f} | {1e3 * p.compute_s:.2f} | "
            f"{1e3 * p.comm_s:.2f} | "
            f"{p.comm_share:.0%} | {p.speedup:.2f} | {p.efficiency:.0%} |"
        )
    print("assumptions: " + "; ".join(costmodel.ASSUMPTIONS))
    return 0


def _transport(args: argparse.Namespace) -> int:
    from reference_impls.scaling.transport import parse_nccl_log

    lines: list[str] = []
    for name in args.logs:
        path = Path(name)
        if not path.is_file():
            what = "a directory, not a log file" if path.is_dir() else "no such log file"
            print(f"error: {name}: {what}; pass the NCCL_DEBUG_FILE output", file=sys.stderr)
            return 2
        text = path.read_text(errors="replace").splitlines()
        if not any("NCCL" in line for line in text):
            # Nothing of NCCL's at all is the wrong file (or a job run without NCCL_DEBUG), not
            # a transport finding: usage error, so it cannot be mistaken for a warning.
            print(
                f"error: {name} has no NCCL lines ({'empty' if not text else 'not NCCL output'}):"
                " pass the log of a job run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET",
                file=sys.stderr,
            )
            return 2
        lines += text
    report = parse_nccl_log(lines, expect_nvlink=args.expect_nvlink)
    print(report.summary)
    for w in report.warnings:
        print(f"warning: {w}")
    return 1 if report.warnings or not report.connections else 0


if __name__ == "__main__":
    sys.exit(main())
