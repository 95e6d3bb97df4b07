"""harness.assert_close beside torch.testing.assert_close on the same float32 tensors.

Interleaved in one process (harness, torch, harness, torch, ...), so both see the same load;
medians of the rounds. On CUDA each call is bracketed by torch.cuda.synchronize(). The asv
classes AssertCloseBesideTorch / GpuAssertCloseBesideTorch (suites/benchmarks/bench_harness.py)
are the tracked form; this is the quick side-by-side for docs/benchmarks/harness.md.

    .venv/bin/python docs/tools/assert_close_beside_torch.py --device cpu --rounds 15
    python3 docs/tools/assert_close_beside_torch.py --device cuda --rounds 21
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

import harness


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    parser.add_argument("--sizes", default="1000000,16000000", help="comma-separated sizes")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    gen = torch.Generator(device=args.device).manual_seed(0)
    for size in (int(s) for s in args.sizes.split(",")):
        expected = torch.randn(size, device=args.device, generator=gen)
        # 1e-8 relative: inside float32's default tolerance, so both walk the whole comparison.
        actual = expected * (1 + 1e-8 * torch.randn(size, device=args.device, generator=gen))
        calls = {
            "harness": functools.partial(harness.assert_close, actual, expected),
            "torch.testing": functools.partial(torch.testing.assert_close, actual, expected),
        }
        for call in calls.values():  # warm-up: first-call costs are not the claim
            call()
        seconds: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                sync()
                start = time.perf_counter()
                call()
                sync()
                seconds[name].append(time.perf_counter() - start)
        ours, theirs = (statistics.median(seconds[n]) for n in ("harness", "torch.testing"))
        print(
            f"{args.device} size {size:,}: harness {ours * 1e3:.3f} ms, "
            f"torch.testing {theirs * 1e3:.3f} ms, ratio {ours / theirs:.2f}"
        )


if __name__ == "__main__":
    main()
