"""Bus bandwidth of ``ring_all_reduce`` vs ``dist.all_reduce``, nccl-tests style, in one run.

CPU (gloo), spawning the ranks itself, 2 to 4 processes::

    python -m reference_impls.collectives.bench --device cpu --world-sizes 2,3,4 --max-size 64M

GPU (NCCL), one process per GPU, spawned or under torchrun::

    python -m reference_impls.collectives.bench --device cuda --world-sizes 2 --max-size 1G
    torchrun --nproc-per-node 2 -m reference_impls.collectives.bench --device cuda

Prints a markdown table per world size (time per call, busbw in GB/s = 1e9 B/s, the ratio of
each ring variant's busbw to ``dist.all_reduce``'s, and whether every result matched
``dist.all_reduce`` exactly); ``--json PATH`` also writes every round's time. Methodology in
:mod:`reference_impls.collectives.busbw`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import sys

from reference_impls.collectives.busbw import BenchSpec, Measurement, measure
from reference_impls.collectives.launcher import LaunchConfig, apply_nccl_defaults, launch

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``"1K"`` -> 1024, ``"64M"``, ``"1G"``, ``"4096"`` (bytes, binary units)."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1] if text and text[-1] in _UNITS else ""
    number = text[: len(text) - len(unit)]
    if not number.isdigit():
        raise argparse.ArgumentTypeError(f"size must look like 4096, 1K, 64M or 1G; got {text!r}")
    return int(number) * _UNITS[unit]


def format_size(nbytes: int) -> str:
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]} {unit}iB"
    return f"{nbytes} B"


def sizes_between(low: int, high: int, factor: int) -> tuple[int, ...]:
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= factor
    return tuple(sizes)


def table(measurements: list[Measurement]) -> str:
    """One markdown table: a row per size, time and busbw per impl, ratios to all_reduce."""
    impls = list(dict.fromkeys(m.impl for m in measurements))
    by = {(m.nbytes, m.impl): m for m in measurements}
    base = "all_reduce" if "all_reduce" in impls else None
    head = ["size"]
    for impl in impls:
        head += [f"{impl} us", f"{impl} busbw"]
    head += [f"{impl} / {base}" for impl in impls if base and impl != base]
    head += ["iters", "correct"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for nbytes in sorted({m.nbytes for m in measurements}):
        row = [format_size(nbytes)]
        for impl in impls:
            m = by[(nbytes, impl)]
            row += [f"{m.time_s * 1e6:.1f}", f"{m.busbw_gbs:.3g}"]
        for impl in impls:
            if base and impl != base:
                row.append(f"{by[(nbytes, impl)].busbw_gbs / by[(nbytes, base)].busbw_gbs:.2f}")
        row.append(str(by[(nbytes, impls[0])].iters))
        row.append("yes" if all(by[(nbytes, i)].correct for i in impls) else "**NO**")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def environment(device: str) -> dict[str, str]:
    import torch

    env = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": str(os.cpu_count()),
        "host": platform.machine(),
    }
    if device == "cuda" and torch.cuda.is_available():
        env["gpu"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        tuned = sorted(k for k in os.environ if k.startswith(("NCCL_", "TORCH_NCCL_")))
        env["nccl env"] = " ".join(f"{k}={os.environ[k]}" for k in tuned) or "none"
    return env


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m reference_impls.collectives.bench", description=__doc__.split("\n")[0]
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--world-sizes",
        default="2",
        help="comma-separated process counts (default 2; ignored under torchrun)",
    )
    p.add_argument(
        "--min-size", type=parse_size, default=parse_size("1K"), help="smallest buffer (default 1K)"
    )
    p.add_argument(
        "--max-size",
        type=parse_size,
        default=parse_size("64M"),
        help="largest buffer (default 64M)",
    )
    p.add_argument("--factor", type=int, default=4, help="size step (default 4)")
    p.add_argument(
        "--impl",
        action="append",
        dest="impls",
        help=(
            "repeatable: all_reduce[:graph=1], ring[:segments=N][:check=0][:ctas=N][:graph=1] "
            "(default: all_reduce and ring)"
        ),
    )
    p.add_argument(
        "--rounds", type=int, default=5, help="timed rounds per size and impl (default 5)"
    )
    p.add_argument(
        "--round-s",
        type=float,
        default=None,
        help="target seconds per round (default 0.02 GPU, 0.2 CPU)",
    )
    p.add_argument(
        "--timeout-s", type=float, default=1800.0, help="limit per launch (default 1800)"
    )
    p.add_argument("--json", default=None, help="also write every measurement to this file")
    p.add_argument(
        "--trace-calls",
        type=int,
        default=0,
        help=(
            "CUDA: profile this many calls per size and impl; "
            "each rank's GPU timeline goes to --json"
        ),
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.device == "cuda":
        apply_nccl_defaults()  # also under torchrun
    spec = BenchSpec(
        sizes=sizes_between(args.min_size, args.max_size, args.factor),
        impls=tuple(args.impls or ("all_reduce", "ring")),
        device=args.device,
        rounds=args.rounds,
        round_s=args.round_s or (0.02 if args.device == "cuda" else 0.2),
        trace_calls=args.trace_calls,
    )
    backend = "cpu:gloo,cuda:nccl" if args.device == "cuda" else "gloo"
    runs: list[list[Measurement]] = []
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        import torch
        import torch.distributed as dist

        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group(backend)
        result = measure(rank, world, spec)
        dist.destroy_process_group()
        if result is None:
            return 0
        runs.append(result)
    else:
        for world in (int(w) for w in args.world_sizes.split(",")):
            config = LaunchConfig(world_size=world, backend=backend, timeout_s=args.timeout_s)
            runs.append(launch(measure, spec, config=config)[0])
    env = environment(args.device)
    shown = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: python -m reference_impls.collectives.bench {shown}")
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    for result in runs:
        print(f"\n{result[0].world_size} processes, {result[0].device}, float32, busbw in GB/s:\n")
        print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "environment": env,
                    "measurements": [
                        dataclasses.asdict(m) | {"time_s": m.time_s, "busbw_gbs": m.busbw_gbs}
                        for result in runs
                        for m in result
                    ],
                },
                f,
                indent=1,
            )
    bad = [m for result in runs for m in result if not m.correct]
    if bad:
        print(f"\n{len(bad)} measurement(s) did not match dist.all_reduce", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
