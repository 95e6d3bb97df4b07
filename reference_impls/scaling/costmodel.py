"""A step-time model for data parallelism: measured compute plus the ring all-reduce's
alpha-beta cost, projected to world sizes this machine does not have (8, 64, 512 GPUs).

The all-reduce of S gradient bytes in ``k`` buckets over N ranks, ring algorithm (the cost
model of :func:`reference_impls.collectives.ring_cost`: 2(N - 1) messages per worker, each about
S / N bytes per bucket)::

    T_comm(N) = k * 2(N - 1) * alpha  +  2(N - 1)/N * S / beta

alpha: seconds per message (launch + link latency of one ring step); beta: bytes per second
each link sustains (nccl-tests' *bus bandwidth*). The bandwidth term barely grows with N
(2(N - 1)/N -> 2); the latency term grows linearly, and the compute per rank shrinks under
strong scaling, so the communication *share* grows with N even on a fixed interconnect. Past
``gpus_per_node`` the ring crosses the network: alpha and beta become the network's (the ring
runs at its slowest link).

Compute per rank at per-rank batch b: ``fixed + per_sample * b`` (the fixed part -- optimizer
over all parameters, launches -- does not shrink with data parallelism). Backward is
``backward_fraction`` of compute; with overlap, bucket i's all-reduce may start when backward
has produced i/k of the gradients, and buckets go one after another; what remains after
backward ends is *exposed*. Without overlap all of T_comm is exposed.

Assumptions (stated in every report): one ring (no tree, no NVLS/SHARP), buckets of equal size,
gradients produced at an even rate over backward, the links' alpha and beta independent of N,
no straggler and no data wait (measure those; the model does not predict them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from reference_impls.collectives.schedule import bus_bandwidth_factor

__all__ = [
    "ASSUMPTIONS",
    "MAX_WORLD",
    "Interconnect",
    "Prediction",
    "Workload",
    "fit_alpha_beta",
    "fit_compute",
    "project",
    "ring_allreduce_s",
    "seeds_example",
]

ASSUMPTIONS = (
    "ring all-reduce (no tree, NVLS or in-network reduction)",
    "alpha (s per ring step) and beta (bus bytes/s) do not depend on the world size; past "
    "gpus_per_node the ring runs at the network's alpha and beta",
    "gradients in equal buckets, produced at an even rate over backward; buckets all-reduced "
    "one after another",
    "compute per rank = fixed + per_sample x per-rank batch, the same on every rank",
    "no stragglers, no data wait, no contention beyond the link model (measure those)",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Interconnect:
    """Link parameters; ``inter_*`` apply once a ring spans more than one node."""

    name: str = "interconnect"
    alpha_s: float
    """Seconds per ring step (message) inside a node."""
    beta_Bps: float
    """Bus bandwidth inside a node, bytes/s."""
    gpus_per_node: int = 1 << 30
    """Ranks per node; the default (huge) means one fixed interconnect at every size."""
    inter_alpha_s: float | None = None
    inter_beta_Bps: float | None = None

    def __post_init__(self) -> None:
        # Infinite bandwidth or latency would turn every projection into 0 or inf without a
        # word; they are typos, not link numbers.
        for name in ("alpha_s", "inter_alpha_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of s >= 0, got {value!r}")
        for name in ("beta_Bps", "inter_beta_Bps"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number of bytes/s > 0, got {value!r}")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if (self.inter_alpha_s is None) != (self.inter_beta_Bps is None):
            raise ValueError("give both inter_alpha_s and inter_beta_Bps, or neither")

    def link(self, world: int) -> tuple[float, float]:
        """(alpha, beta) of a ring over ``world`` ranks."""
        if world <= self.gpus_per_node or self.inter_alpha_s is None:
            return self.alpha_s, self.beta_Bps
        assert self.inter_beta_Bps is not None
        return max(self.alpha_s, self.inter_alpha_s), min(self.beta_Bps, self.inter_beta_Bps)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """What one rank computes and communicates per step."""

    fixed_s: float
    """Compute per step that does not depend on the batch (optimizer, launches)."""
    per_sample_s: float
    grad_bytes: int
    buckets: int = 1
    backward_fraction: float = 0.6
    """Share of compute that is backward (the window communication can hide behind)."""
    scaling: Literal["strong", "weak"] = "strong"
    batch: int
    """Global batch (strong scaling) or per-rank batch (weak scaling)."""

    def __post_init__(self) -> None:
        # NaN compares False with everything, so "< 0" alone let it through into a NaN table.
        if not all(math.isfinite(v) and v >= 0 for v in (self.fixed_s, self.per_sample_s)):
            raise ValueError(
                "fixed_s and per_sample_s must be finite and >= 0, got "
                f"{self.fixed_s}, {self.per_sample_s}"
            )
        if self.grad_bytes < 0 or self.buckets < 1 or self.batch < 1:
            raise ValueError(
                f"grad_bytes >= 0, buckets >= 1, batch >= 1 expected; got {self.grad_bytes}, "
                f"{self.buckets}, {self.batch}"
            )
        if not 0 <= self.backward_fraction <= 1:  # False for NaN too
            raise ValueError(f"backward_fraction must be in [0, 1], got {self.backward_fraction}")
        if self.scaling not in ("strong", "weak"):
            raise ValueError(f"scaling must be 'strong' or 'weak', got {self.scaling!r}")

    def local_batch(self, world: int) -> float:
        return self.batch / world if self.scaling == "strong" else float(self.batch)

    def compute_s(self, world: int) -> float:
        return self.fixed_s + self.per_sample_s * self.local_batch(world)


MAX_WORLD = 2**53
"""The largest world size projected: counts stay exact as floats up to here, and every formula
below is closed form, so a projection to any world size costs the same (no per-rank arrays)."""


def _check_world(world: object) -> int:
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_WORLD:
        raise ValueError(f"world sizes must be >= 1 (integers, at most 2**53), got {world!r}")
    return world


def ring_allreduce_s(
    world: int, nbytes: int, *, alpha_s: float, beta_Bps: float, buckets: int = 1
) -> float:
    """T_comm of the module docstring (0 for one rank); O(1) in ``world``."""
    _check_world(world)
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be an integer >= 0, got {nbytes!r}")
    if not (math.isfinite(alpha_s) and alpha_s >= 0):
        raise ValueError(f"alpha_s must be a finite number of s >= 0, got {alpha_s!r}")
    if not (math.isfinite(beta_Bps) and beta_Bps > 0):
        raise ValueError(f"beta_Bps must be a finite number of bytes/s > 0, got {beta_Bps!r}")
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
        raise ValueError(f"buckets must be an integer >= 1, got {buckets!r}")
    if world == 1 or nbytes == 0:
        return 0.0
    # ring_cost(world, ...).messages_per_worker, without its per-rank chunk arrays (which
    # cost memory linear in the world size: 7 TiB at 10**12 ranks).
    messages = 2 * (world - 1)
    return buckets * messages * alpha_s + bus_bandwidth_factor(world) * nbytes / beta_Bps


def _exposed(comm_s: float, backward_s: float, buckets: int, overlap: bool) -> float:
    if not overlap or comm_s == 0:
        return comm_s
    # Bucket i is ready at backward_s * i / k and takes comm_s / k after the previous one: the
    # last finishes at max over i of (ready_i + (k - i + 1) * per), a linear function of i,
    # so at i = 1 or i = k (closed form: a loop over buckets costs O(k) for any k given).
    per = comm_s / buckets
    finish = max(backward_s / buckets + comm_s, backward_s + per)
    # Clipped to [0, comm_s]: finish - backward_s loses the low bits when backward dwarfs comm.
    return min(comm_s, max(0.0, finish - backward_s))


@dataclasses.dataclass(frozen=True)
class Prediction:
    world: int
    local_batch: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    step_s: float
    comm_share: float
    """Exposed communication over the step."""
    throughput: float
    """Samples per second, all ranks."""
    speedup: float
    """Throughput over one rank's (strong: same global batch; weak: same per-rank batch)."""
    efficiency: float
    """speedup / world."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def project(
    workload: Workload,
    link: Interconnect,
    worlds: Sequence[int] = (1, 2, 8, 64, 512),
    *,
    overlap: bool = True,
) -> list[Prediction]:
    """Predict step time, exposed communication share and efficiency at each world size."""
    if not worlds:
        raise ValueError("no world sizes to project")
    for w in worlds:
        _check_world(w)
    base = workload.local_batch(1) / workload.compute_s(1) if workload.compute_s(1) > 0 else 0.0
    out = []
    for n in worlds:
        alpha, beta = link.link(n)
        compute = workload.compute_s(n)
        comm = ring_allreduce_s(
            n, workload.grad_bytes, alpha_s=alpha, beta_Bps=beta, buckets=workload.buckets
        )
        exposed = _exposed(comm, workload.backward_fraction * compute, workload.buckets, overlap)
        step = compute + exposed
        if not math.isfinite(step):
            raise ValueError(
                f"the step time at {n} ranks is {step} s: the link or workload numbers are "
                "out of range (a bandwidth near 0, a size near 1e308)"
            )
        thr = n * workload.local_batch(n) / step if step > 0 else 0.0
        speedup = thr / base if base > 0 else 0.0
        out.append(
            Prediction(
                world=n,
                local_batch=workload.local_batch(n),
                compute_s=compute,
                comm_s=comm,
                exposed_comm_s=exposed,
                step_s=step,
                comm_share=exposed / step if step > 0 else 0.0,
                throughput=thr,
                speedup=speedup,
                efficiency=speedup / n,
            )
        )
    return out


def fit_alpha_beta(
    world: int, sizes: Sequence[int], seconds: Sequence[float]
) -> tuple[float, float]:
    """Least-squares (alpha, beta) from solo all-reduce times of ``sizes`` bytes on ``world`` ranks.

    Needs at least two distinct sizes. Raises ValueError when the fit is not physical (a
    negative latency or bandwidth: the times did not grow with the size).
    """
    if world < 2:
        raise ValueError(f"fitting alpha and beta needs >= 2 ranks, got {world}")
    if len(sizes) != len(seconds) or len(set(sizes)) < 2:
        raise ValueError(
            f"need >= 2 distinct sizes with one time each, got {list(sizes)}, {list(seconds)}"
        )
    steps = 2 * (world - 1)
    a = np.array([[steps, bus_bandwidth_factor(world) * s] for s in sizes], dtype=np.float64)
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.asarray(seconds, dtype=np.float64), rcond=None)
    if inv_beta <= 0:
        raise ValueError(
            f"all-reduce times {list(seconds)} do not grow with the sizes {list(sizes)}: "
            "no bandwidth can be fitted (measure larger sizes)"
        )
    return max(0.0, float(alpha)), float(1 / inv_beta)


def fit_compute(batches: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """(fixed_s, per_sample_s) from compute times at >= 2 distinct per-rank batches (least
    squares, clipped at 0)."""
    if len(batches) != len(seconds) or len(set(batches)) < 2:
        raise ValueError(f"need compute times at >= 2 distinct batches, got {list(batches)}")
    a = np.array([[1.0, b] for b in batches])
    (fixed, per), *_ = np.linalg.lstsq(a, np.asarray(seconds, dtype=np.float64), rcond=None)
    if per < 0:
        fixed, per = float(np.mean(seconds)), 0.0
    return max(0.0, float(fixed)), max(0.0, float(per))


def seeds_example() -> tuple[Workload, Interconnect]:
    """Parameters for which 8 -> 64 GPUs gives 2x instead of 8x, the communication share growing
    from ~10% to ~60% on one fixed interconnect (strong scaling, no overlap).

    A 268M-parameter model (1 GiB of float32 gradients) in 40 buckets of ~25 MiB (DDP's default
    bucket size), 1 s of compute per step at 8 GPUs of which 0.1 s does not shrink with the
    batch (optimizer), global batch 1024; a network of 23 GB/s bus bandwidth (~200 Gb/s per GPU)
    and 42 us per ring step. Derivation: docs/benchmarks/scaling.md.
    """
    work = Workload(
        fixed_s=0.1,
        per_sample_s=0.8 / 128,  # 0.8 s at 128 samples per GPU (8 GPUs x 128 = 1024)
        grad_bytes=2**30,
        buckets=40,
        backward_fraction=0.6,
        scaling="strong",
        batch=1024,
    )
    link = Interconnect(name="fixed 23 GB/s network", alpha_s=42e-6, beta_Bps=23e9)
    return work, link
