"""What the tracer costs: per call, per record, and from a stall to its report.

Run inside ranks started by ``reference_impls.collectives.launch`` (the asv benchmarks in
suites/benchmarks/bench_distributed_debug.py and ``python -m
reference_impls.distributed_debug.bench`` do)::

    python -m reference_impls.distributed_debug.bench --calls 20 --rounds 41

* :func:`per_call_times`: rounds of ``calls`` back-to-back ``dist.all_reduce`` of ``nbytes``,
  alternating three modes in one process, so all see the same machine noise: untraced (torch's
  own function, the wrapper bypassed), traced, and DETAIL (``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s
  checking: a group created at that debug level, which torch wraps in its ProcessGroupWrapper).
  A round's time is this rank's, after a tiny all-reduce lines the ranks up.
* :func:`bytes_per_record`: tracemalloc over a full ring of realistic records.
* :func:`stall_to_report`: one straggler scenario; seconds from the pending call's issue to the
  written report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import DebugLevel, TCPStore, set_debug_level

from reference_impls.distributed_debug.config import DEFAULT_RING_SIZE, TraceConfig
from reference_impls.distributed_debug.records import Record
from reference_impls.distributed_debug.tracer import install, uninstall

__all__ = [
    "bytes_per_record",
    "fix_costs",
    "per_call_times",
    "repeat_calls",
    "stall_to_report",
    "wrapper_overhead",
]

MODES = ("untraced", "traced", "detail")


def per_call_times(
    rank: int,
    world: int,
    nbytes: int,
    calls: int,
    rounds: int,
    modes: tuple[str, ...] = MODES,
    device: str = "cpu",
) -> dict[str, list[float]]:
    """Seconds per all_reduce call, one entry per round, for each mode (alternating rounds).

    The tracer is installed once; an untraced round calls torch's original function directly
    (the wrapper is bypassed entirely), a traced round goes through ``dist.all_reduce``.
    """
    from reference_impls.distributed_debug import tracer as tracer_module

    cuda = device == "cuda"
    if cuda:
        device = f"cuda:{torch.cuda.current_device()}"
    x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)  # (nbytes / 4,)
    # Wall time per call under each mode, and (key + "_cpu") the calling thread's CPU time per
    # call: CPU time does not grow when the machine is oversubscribed, so the traced - untraced
    # difference in it is the tracer's own cost even on a busy machine.
    out: dict[str, list[float]] = {k: [] for m in modes for k in (m, m + "_cpu")}
    tracer = None
    if "traced" in modes:
        config = TraceConfig(
            stall_s=60.0, report_dir=Path(tempfile.gettempdir()) / "distdebug-bench"
        )
        tracer = install(config)
    original: Callable[..., Any] = tracer_module._ORIGINALS.get("all_reduce", dist.all_reduce)
    detail_group = None
    if "detail" in modes:
        # What TORCH_DISTRIBUTED_DEBUG=DETAIL does, on a group of its own in this process: a
        # group created at that debug level is wrapped in torch's ProcessGroupWrapper (a
        # fingerprint check of every collective over an extra gloo group).
        set_debug_level(DebugLevel.DETAIL)
        detail_group = dist.new_group(backend="gloo")
        set_debug_level(DebugLevel.OFF)

    def detail(t: torch.Tensor) -> None:
        original(t, group=detail_group)

    fns: dict[str, Callable[..., Any]] = {
        "untraced": original,
        "traced": dist.all_reduce,
        "detail": detail,
    }
    for _ in range(3):  # warm-up: connections, allocator, the tracer's caches
        dist.all_reduce(x)
        if detail_group is not None:
            detail(x)
    for _ in range(rounds):
        for mode in modes:
            fn = fns[mode]
            if mode == "detail":
                set_debug_level(DebugLevel.DETAIL)
            original(torch.zeros(1, device=device))  # line the ranks up (untraced)
            if cuda:
                torch.cuda.synchronize()
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                fn(x)
            if cuda:
                torch.cuda.synchronize()
            out[mode].append((time.perf_counter() - t0) / calls)
            out[mode + "_cpu"].append((time.thread_time() - c0) / calls)
            set_debug_level(DebugLevel.OFF)
            x.fill_(1.0)  # keep the values finite across rounds
    if tracer is not None:
        uninstall(restore_functions=True)
    return out


def repeat_calls(rank: int, world: int, nbytes: int, calls: int, traced: bool) -> None:
    """``calls`` all_reduces of ``nbytes``, under the tracer or not (one asv sample's body)."""
    x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)  # (nbytes / 4,)
    if traced:
        install(
            TraceConfig(stall_s=60.0, report_dir=Path(tempfile.gettempdir()) / "distdebug-bench")
        )
    try:
        for _ in range(calls):
            dist.all_reduce(x)
    finally:
        if traced:
            uninstall()


def fix_costs(rank: int, world: int, repeats: int = 20) -> dict[str, dict[str, float]]:
    """For each fix of the seed scenario: collectives per validation pass on this rank (counted
    by the tracer), samples computed (padding included), and the median seconds per pass."""
    from reference_impls.distributed_debug import validate
    from reference_impls.distributed_debug.guards import PaddedEvenSampler
    from reference_impls.distributed_debug.tracer import trace_collectives

    config = TraceConfig(stall_s=60.0, report_dir=Path(tempfile.gettempdir()) / "distdebug-bench")
    out = {}
    for fix in validate.FIXES:
        with trace_collectives(config=config) as tracer:
            validate.validate(rank, world, fix)
        records, _ = tracer.snapshot()
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            validate.validate(rank, world, fix)
            times.append(time.perf_counter() - t0)
        samples = (
            len(PaddedEvenSampler(validate.N_VAL, world, rank))
            if fix == "pad"
            else len(validate.shard(rank, world))
        )
        out[fix] = {
            "collectives": float(len(records)),
            "samples": float(samples),
            "seconds": statistics.median(times),
        }
    return out


def wrapper_overhead(calls: int = 2000, rounds: int = 15) -> dict[str, float]:
    """Seconds per 1-element all_reduce on a 1-rank gloo group (median round), traced and untraced,
    the tracer's own CPU cost without network noise (run in a fresh process)."""
    import datetime as dt

    store = TCPStore("127.0.0.1", 0, 1, True, timeout=dt.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        got = per_call_times(0, 1, 4, calls, rounds, ("untraced", "traced"))
    finally:
        dist.destroy_process_group()
    return {m: statistics.median(v) for m, v in got.items()}


def bytes_per_record(n: int = DEFAULT_RING_SIZE) -> float:
    """Bytes held per record in a full ring (tracemalloc, records like an all_reduce's)."""
    import collections

    site = (__file__, 123, "train_step")  # interned strings, as from a code object
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ring: collections.deque[Record] = collections.deque(maxlen=n)
    for i in range(n):
        ring.append(
            Record(
                seq=i,
                op="all_reduce",
                group="0",
                shapes=((1024, 1024 + i % 3),),
                dtypes=("float32",),
                reduce_op="sum",
                peer=None,
                callsite=(site[0], site[1] + i % 5, site[2]),
                t_issue=time.time(),
                t_done=time.time(),
            )
        )
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / n


def _straggler(rank: int, world: int, stall_s: float, report_dir: str) -> None:
    from reference_impls.distributed_debug.scenarios import run_scenario

    config = TraceConfig(
        stall_s=stall_s,
        heartbeat_s=0.25,
        dead_after_s=1.0,
        collect_s=0.5,
        report_dir=Path(report_dir),
        exit_code_after_report=17,
    )
    run_scenario(rank, world, "straggler", config)


def stall_to_report(stall_s: float = 1.0) -> float:
    """Seconds from the stuck call's issue to the report, 2 gloo ranks (straggler scenario)."""
    from reference_impls.collectives import LaunchConfig, LaunchError, launch

    with tempfile.TemporaryDirectory() as d:
        # Every rank exits with code 17 after the report: the launch always ends in an error.
        with contextlib.suppress(LaunchError):
            launch(
                _straggler, stall_s, d, config=LaunchConfig(world_size=2, timeout_s=60, grace_s=10)
            )
        report = json.loads((Path(d) / "report.json").read_text())
    return float(report["reported_at"] - report["stall_began"])


def main(argv: list[str] | None = None) -> int:
    from reference_impls.collectives import LaunchConfig, launch

    p = argparse.ArgumentParser(prog="python -m reference_impls.distributed_debug.bench")
    p.add_argument("--calls", type=int, default=20, help="all_reduce calls per round (default 20)")
    p.add_argument("--rounds", type=int, default=41, help="rounds per mode (default 41)")
    p.add_argument("--sizes", default="1024,1048576", help="bytes, comma-separated")
    args = p.parse_args(argv)
    print("2 gloo ranks, rank 0's rounds, the three modes alternating round by round")
    for nbytes in (int(s) for s in args.sizes.split(",")):
        cfg = LaunchConfig(world_size=2, timeout_s=600)
        got = launch(per_call_times, nbytes, args.calls, args.rounds, config=cfg)[0]
        # On a shared machine a round is often preempted: the fastest round of each mode is the
        # best estimate of what the code itself costs; the median shows the noise.
        for stat, fn in (("min", min), ("median", statistics.median)):
            us = {m: fn(v) * 1e6 for m, v in got.items() if not m.endswith("_cpu")}
            added, detail_added = us["traced"] - us["untraced"], us["detail"] - us["untraced"]
            ratio = f"{detail_added / added:.0f}x" if added > 0 else "n/a (tracer within noise)"
            print(
                f"{nbytes:>8} B {stat:<6} untraced {us['untraced']:8.1f}  traced "
                f"{us['traced']:8.1f}  DETAIL {us['detail']:8.1f} us/call: tracer adds "
                f"{added:7.1f}, DETAIL adds {detail_added:7.1f} ({ratio})"
            )
        cpu = {m: statistics.median(got[m + "_cpu"]) * 1e6 for m in ("untraced", "traced")}
        print(
            f"{nbytes:>8} B calling thread's CPU per call (median): untraced "
            f"{cpu['untraced']:.1f} us, traced {cpu['traced']:.1f} us: the tracer adds "
            f"{cpu['traced'] - cpu['untraced']:.1f} us"
        )
    one = wrapper_overhead()
    print(
        f"1-rank gloo all_reduce, median round: wall {one['untraced'] * 1e6:.1f} -> "
        f"{one['traced'] * 1e6:.1f} us, calling thread's CPU {one['untraced_cpu'] * 1e6:.1f} -> "
        f"{one['traced_cpu'] * 1e6:.1f} us: the tracer adds "
        f"{(one['traced_cpu'] - one['untraced_cpu']) * 1e6:.1f} us of CPU per call"
    )
    fixes = launch(fix_costs, config=LaunchConfig(world_size=4, timeout_s=600))
    print("seed fixes (4 gloo ranks): collectives per validation pass, samples, median ms")
    for fix in fixes[0]:
        per_rank = [f[fix] for f in fixes]
        print(
            f"  {fix:<6} collectives {[int(p['collectives']) for p in per_rank]} samples "
            f"{[int(p['samples']) for p in per_rank]} ms "
            f"{max(p['seconds'] for p in per_rank) * 1e3:.1f}"
        )
    print(f"bytes per record: {bytes_per_record():.0f} (ring of {DEFAULT_RING_SIZE})")
    print(f"stall (1 s threshold) to report: {stall_to_report(1.0):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
