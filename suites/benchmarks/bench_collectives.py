"""Benchmarks of reference_impls.collectives: the NumPy ring simulation and the CPU ring.

* ``Simulation``: ``simulate_ring_allreduce`` on 8 and 64 workers x 1M float32 (the size
  the requirements name), time and peak memory, plus its float error against a float64 sum.
* ``CpuRingAllReduce``: one sample = one ``launch`` of 2 gloo processes (forkserver, warm)
  that run 20 in-place all-reduces of 1 or 16 MiB with ``ring_all_reduce`` or
  ``dist.all_reduce``: the ring and gloo side by side in one asv run. ``CpuLaunch`` times the
  launch alone (about 0.1 s on the 2-core CI machine), the fixed part of every sample.
* ``CpuRingBusBandwidth.track_info_*``: the ring's time over gloo's, measured inside the
  ranks by the nccl-tests-style harness (reference_impls.collectives.busbw); informational,
  it is a ratio of two noisy times.

The GPU numbers (NCCL, 2 x H200) come from ``python -m reference_impls.collectives.bench``,
which needs two GPUs; docs/benchmarks/allreduce.md has them with their commands.
"""

from __future__ import annotations

import numpy as np

from reference_impls.collectives import LaunchConfig, launch, simulate_ring_allreduce
from reference_impls.collectives.busbw import BenchSpec, measure, repeat_calls

MiB = 1 << 20

# Inputs shared by the simulation benchmarks, built once per process, only appended to.
_ARRAYS: dict[tuple[int, int], list[np.ndarray]] = {}


def _arrays(workers: int, length: int) -> list[np.ndarray]:
    key = (workers, length)
    if key not in _ARRAYS:
        rng = np.random.default_rng(20261130 + workers)
        _ARRAYS[key] = [rng.standard_normal(length).astype(np.float32) for _ in range(workers)]
    return _ARRAYS[key]


class _Simulation:
    """simulate_ring_allreduce, sum over float32 workers: what both ring sizes share."""

    # Pure CPU, but one side ran past 300 s under Valgrind (docs/perf.md, "Instruction counts").
    harness_counts = False
    param_names = ["workers", "length"]
    timeout = 300

    def setup(self, workers, length):
        self.arrays = _arrays(workers, length)

    def peakmem_simulate_sum(self, workers, length):
        simulate_ring_allreduce(self.arrays, "sum")

    def track_max_relative_error_vs_float64(self, workers, length):
        # Deterministic (fixed inputs): a change of summation order shows up here.
        result = simulate_ring_allreduce(self.arrays, "sum")[0].astype(np.float64)
        exact = np.sum(np.stack(self.arrays).astype(np.float64), axis=0)
        scale = np.abs(np.stack(self.arrays)).astype(np.float64).sum(0)
        return float(np.max(np.abs(result - exact) / scale))

    track_max_relative_error_vs_float64.unit = "relative error"


class Simulation(_Simulation):
    """The 8-worker ring, timed and gated: the same code as the 64-worker one below."""

    params = ([8], [1 << 20])

    def time_simulate_sum(self, workers, length):
        simulate_ring_allreduce(self.arrays, "sum")


class SimulationWide(_Simulation):
    """The 64-worker ring (256 MB of arrays), timed for the dashboard, not gated (time_info_).

    ~1.6 s per sample, 3.3 s per A/B pair with two busy loops. Its A/A pairs could not decide at
    factor 1.2 on the loaded 2-core VM: 36 pairs in 120 s, then 131 in 360 s (1.03 [0.86,
    1.23]), then 266 in 720 s (1.06 [0.94, 1.22], 2026-12-03): its blocks vary with what else
    uses the memory bus, so no pull-request budget settles it there (docs/perf.md). The gate
    sees a change of simulate_ring_allreduce through Simulation (8 workers)."""

    params = ([64], [1 << 20])

    def time_info_simulate_sum(self, workers, length):
        simulate_ring_allreduce(self.arrays, "sum")


_LAUNCH = LaunchConfig(world_size=2, timeout_s=300)
_WARM: list[bool] = []


def _warm_forkserver() -> None:
    """The first launch in a process starts the forkserver (imports torch, ~1.5 s): keep it
    out of the samples."""
    if not _WARM:
        launch(repeat_calls, "all_reduce", 4096, 1, config=_LAUNCH)
        _WARM.append(True)


class CpuLaunch:
    """launch() of 2 gloo processes that do nothing: the fixed cost in CpuRingAllReduce."""

    harness_counts = False  # starts processes: not an instruction count (README.md, 9)

    number = 1
    repeat = (7, 10, 60.0)
    rounds = 1
    warmup_time = 0.0

    def setup(self):
        _warm_forkserver()

    def time_launch_2_gloo_processes(self):
        launch(repeat_calls, "all_reduce", 4096, 0, config=_LAUNCH)


class CpuRingAllReduce:
    """One launch of 2 gloo processes running 20 in-place all-reduces of float32."""

    harness_counts = False  # starts processes: not an instruction count (README.md, 9)

    params = (["ring", "all_reduce"], [1 * MiB, 16 * MiB])
    param_names = ["impl", "nbytes"]
    calls = 20
    number = 1
    repeat = (7, 10, 120.0)
    rounds = 1
    warmup_time = 0.0
    timeout = 600

    def setup(self, impl, nbytes):
        _warm_forkserver()

    def time_launch_and_20_calls(self, impl, nbytes):
        launch(repeat_calls, impl, nbytes, self.calls, config=_LAUNCH)


class CpuRingBusBandwidth:
    """ring_all_reduce time / dist.all_reduce time at 16 MiB on 2 gloo processes (in-rank)."""

    unit = "ring time / gloo time"
    timeout = 600

    def setup(self):
        _warm_forkserver()

    def track_info_ring_over_gloo_time_16MiB(self):
        spec = BenchSpec(sizes=(16 * MiB,), impls=("all_reduce", "ring"), rounds=5, round_s=0.2)
        by_impl = {m.impl: m.time_s for m in launch(measure, spec, config=_LAUNCH)[0]}
        return by_impl["ring"] / by_impl["all_reduce"]
