"""Benchmarks of reference_impls.distributed_debug: what tracing costs, and how fast it reports.

* ``CpuTracerCalls``: one sample = one ``launch`` of 2 gloo processes (forkserver, warm) that
  run 200 ``dist.all_reduce`` of 1 KiB or 1 MiB untraced, traced, or with
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (set before the group starts): the three side by side in
  one asv run. The launch itself (~0.1 s, ``CpuLaunch`` in bench_collectives) is in every
  sample.
* ``CpuTracerCostPerCall``: the per-call cost measured inside the ranks (untraced, traced and
  DETAIL rounds alternating in one process); informational: differences of noisy times (the
  calling thread's CPU time included, which at 2 ranks holds gloo's spinning for the peer).
* ``TracerOwnCost.track_cpu_us_per_call``: the tracer's own CPU time per call on a 1-rank
  gloo group (no peer to wait for): the number to gate.
* ``TracerMemory``: bytes per record and for the default ring (tracemalloc; deterministic).
* ``StallReport``: seconds from a stuck call's issue to the written report (stall threshold
  1 s, 2 gloo ranks), informational; ``time_analyze_4_full_rings``: the analysis of 4 ranks'
  full rings (2,048 records each) with a divergence at the end.

The NCCL cost comes from the gpu tier (suites/gpu/distributed_debug); the numbers and commands
are in docs/benchmarks/distributed_debug.md.
"""

from __future__ import annotations

import statistics

from reference_impls.collectives import LaunchConfig, launch
from reference_impls.distributed_debug import (
    DEFAULT_RING_SIZE,
    RankDump,
    RankState,
    Record,
    analyze,
)
from reference_impls.distributed_debug.bench import (
    bytes_per_record,
    per_call_times,
    repeat_calls,
    stall_to_report,
    wrapper_overhead,
)

KiB, MiB = 1 << 10, 1 << 20
_LAUNCH = LaunchConfig(world_size=2, timeout_s=300)
_DETAIL = LaunchConfig(world_size=2, timeout_s=300, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
_WARM: list[bool] = []


def _warm_forkserver() -> None:
    """The first launch in a process starts the forkserver (imports torch): keep it out."""
    if not _WARM:
        launch(repeat_calls, 4096, 1, False, config=_LAUNCH)
        _WARM.append(True)


class CpuTracerCalls:
    """One launch of 2 gloo processes running 200 all_reduces, per mode."""

    harness_counts = False  # starts processes: not an instruction count (README.md, 9)

    params = (["untraced", "traced", "detail"], [1 * KiB, 1 * MiB])
    param_names = ["mode", "nbytes"]
    calls = 200
    number = 1
    repeat = (7, 10, 120.0)
    rounds = 1
    warmup_time = 0.0
    timeout = 600

    def setup(self, mode, nbytes):
        _warm_forkserver()

    def time_launch_and_200_calls(self, mode, nbytes):
        config = _DETAIL if mode == "detail" else _LAUNCH
        launch(repeat_calls, nbytes, self.calls, mode == "traced", config=config)


# Per-call costs measured once per process (both modes alternate inside the ranks).
_COST: dict[int, dict[str, float]] = {}


def _costs(nbytes: int) -> dict[str, float]:
    if nbytes not in _COST:
        _warm_forkserver()
        got = launch(per_call_times, nbytes, 50, 21, config=_LAUNCH)[0]
        med = {m: statistics.median(v) * 1e6 for m, v in got.items()}
        _COST[nbytes] = med
    return _COST[nbytes]


class CpuTracerCostPerCall:
    """Microseconds per all_reduce at 2 gloo ranks, measured inside the ranks."""

    params = [1 * KiB, 1 * MiB]
    param_names = ["nbytes"]
    timeout = 900

    def setup(self, nbytes):
        _costs(nbytes)

    def track_info_tracer_cpu_us(self, nbytes):
        # The calling thread's CPU time per call, traced minus untraced. At 2 ranks it also
        # holds time gloo spins waiting for the peer (traced too), hence informational; the
        # tracer's own cost is TracerOwnCost below.
        c = _costs(nbytes)
        return c["traced_cpu"] - c["untraced_cpu"]

    track_info_tracer_cpu_us.unit = "us of CPU per call"

    def track_info_tracer_added_us(self, nbytes):
        c = _costs(nbytes)
        return c["traced"] - c["untraced"]

    track_info_tracer_added_us.unit = "us per call"

    def track_info_detail_added_us(self, nbytes):
        c = _costs(nbytes)
        return c["detail"] - c["untraced"]

    track_info_detail_added_us.unit = "us per call"

    def track_info_tracer_over_detail_added(self, nbytes):
        c = _costs(nbytes)
        return (c["traced"] - c["untraced"]) / max(c["detail"] - c["untraced"], 1e-9)

    track_info_tracer_over_detail_added.unit = "tracer's added us / DETAIL's"


class TracerOwnCost:
    """The tracer's own CPU cost per call: a 1-element all_reduce on a 1-rank gloo group (no
    peer to wait for), traced minus untraced, in the calling thread's CPU time (which does not
    grow while the process waits for a core: stable on a busy machine)."""

    timeout = 300

    def track_cpu_us_per_call(self):
        got = wrapper_overhead()
        return (got["traced_cpu"] - got["untraced_cpu"]) * 1e6

    track_cpu_us_per_call.unit = "us of CPU per call"


class TracerMemory:
    """What the ring holds."""

    def track_bytes_per_record(self):
        return bytes_per_record(DEFAULT_RING_SIZE)

    track_bytes_per_record.unit = "bytes"

    def track_default_ring_bytes(self):
        return bytes_per_record(DEFAULT_RING_SIZE) * DEFAULT_RING_SIZE

    track_default_ring_bytes.unit = "bytes"


def _full_rings(world: int = 4, n: int = DEFAULT_RING_SIZE) -> list[RankDump]:
    dumps = []
    for rank in range(world):
        recs = []
        for seq in range(n):
            # Rank 3 skips the last per-batch call (line 85): its epoch call (87) comes early.
            last = n - 2 if rank == world - 1 else n - 1
            line = 87 if seq == last else 85
            recs.append(
                Record(
                    seq=seq,
                    op="all_reduce",
                    group="0",
                    shapes=((2,),),
                    dtypes=("float64",),
                    reduce_op="sum",
                    peer=None,
                    callsite=("/job/validate.py", line, "validate"),
                    t_issue=1000.0 + seq,
                    t_done=None if seq == n - 1 else 1000.5 + seq,
                )
            )
        dumps.append(
            RankDump(
                run_id="bench",
                rank=rank,
                world_size=world,
                state=RankState.ALIVE,
                published_at=5000.0,
                groups={"0": list(range(world))},
                records=recs,
            )
        )
    return dumps


class StallReport:
    """From a stall to the report."""

    timeout = 300

    def setup(self):
        self.dumps = _full_rings()

    def time_analyze_4_full_rings(self):
        analyze(self.dumps)

    def track_info_stall_to_report_s(self):
        _warm_forkserver()
        return stall_to_report(1.0)

    track_info_stall_to_report_s.unit = "s (threshold 1 s)"
