"""Self-check: ``ring_all_reduce`` against ``dist.all_reduce`` on every op, dtype and odd size.

Under torchrun (one process per GPU when CUDA is present, else gloo on CPU)::

    torchrun --nproc-per-node 2 -m reference_impls.collectives

Without torchrun it starts gloo processes itself::

    python -m reference_impls.collectives --world-size 3

Exits 0 when every rank's result matched ``dist.all_reduce`` bit for bit (integer-valued
inputs: see :mod:`.checks`) and every mismatched call raised on every rank; 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from reference_impls.collectives.checks import Case, compare_with_all_reduce, mismatch_errors
from reference_impls.collectives.launcher import apply_nccl_defaults

SIZES = (1, 2, 3, 7, 1000, 65_537)
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8")


def default_cases() -> list[Case]:
    cases = []
    for dtype in DTYPES:
        ops = (
            ("sum", "mean", "max", "min")
            if not dtype.startswith(("int", "uint"))
            else ("sum", "max", "min")
        )
        for op in ops:
            for numel in SIZES:
                cases.append(Case(numel=numel, dtype=dtype, op=op))
    cases.append(Case(numel=1 << 20, op="sum", segments=3))  # pipelined lanes, uneven pieces
    cases.append(Case(numel=3 * 5 * 7, op="max", shape=(3, 5, 7)))
    return cases


def check_rank(rank: int, world_size: int, device: str) -> list[str]:
    """Every problem this rank saw, as text (empty: all good)."""
    problems = []
    for r in compare_with_all_reduce(rank, world_size, default_cases(), device):
        if not r.equal:
            problems.append(
                f"rank {rank}: {r.case} differs from dist.all_reduce in {r.mismatched} elements "
                f"(max |diff| {r.max_abs_diff})"
            )
    errors = mismatch_errors(rank, world_size, device)
    for name, value in errors.items():
        if name != "after" and value[0] not in ("RingMismatchError", "ValueError"):
            problems.append(f"rank {rank}: mismatched {name} did not raise, got {value}")
    if not np.array_equal(
        errors["after"], np.full(10, world_size * (world_size + 1) / 2, np.float32)
    ):
        problems.append(f"rank {rank}: the call after the mismatches returned {errors['after']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m reference_impls.collectives", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--world-size", type=int, default=3, help="processes to start without torchrun (default 3)"
    )
    args = p.parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        import torch
        import torch.distributed as dist

        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda":
            apply_nccl_defaults()
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group("cpu:gloo,cuda:nccl" if device == "cuda" else "gloo")
        problems = check_rank(rank, world, device)
        gathered: list[object] = [None] * world
        dist.all_gather_object(gathered, problems)
        dist.destroy_process_group()
        if rank != 0:
            return 0
        problems = [p for g in gathered for p in g]  # type: ignore[attr-defined]
        where = f"{world} ranks, {device}, torchrun"
    else:
        from reference_impls.collectives.launcher import LaunchConfig, launch

        results = launch(check_rank, "cpu", config=LaunchConfig(world_size=args.world_size))
        problems = [p for r in results for p in r]
        where = f"{args.world_size} gloo processes"
    n_cases = len(default_cases())
    if problems:
        print(f"ring_all_reduce self-check FAILED ({where}):\n" + "\n".join(problems))
        return 1
    print(
        f"ring_all_reduce self-check passed ({where}): {n_cases} cases equal to "
        "dist.all_reduce, 5 mismatches raised on every rank"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
