"""Bus bandwidth of ``ring_all_reduce`` against ``dist.all_reduce``, measured in one run.

Conventions of nccl-tests (``doc/PERFORMANCE.md``): for an all-reduce of S bytes taking t
seconds, algbw = S / t and busbw = algbw * 2(n - 1)/n, the rate each link had to sustain; a
size is the bytes of the buffer (float32 elements x 4). Each rank times ``iters`` back-to-back
in-place calls (CUDA events on the GPU, the host clock on the CPU), after a small collective
that lines the ranks up; a round's time is the slowest rank's; the reported time is the
median over rounds. Implementations alternate round by round, so drift hits all of them.

Before timing a size, every implementation reduces the same integer-valued input and must
match ``dist.all_reduce`` bit for bit (``correct``). The timed data are small floats of
magnitude 2^-60 to 2^-59, refreshed before each round, with ``iters`` capped so that
``n ** iters`` growth under repeated in-place sums stays far from overflow (no inf, no
denormals, never zeros).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from reference_impls.collectives.ring import RingConfig, RingGraph, ring_all_reduce
from reference_impls.collectives.schedule import bus_bandwidth_factor

__all__ = ["BenchSpec", "Measurement", "measure", "parse_impl", "repeat_calls"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchSpec:
    """What :func:`measure` times on every rank."""

    sizes: tuple[int, ...]
    """Buffer sizes in bytes (multiples of 4: float32 elements)."""
    impls: tuple[str, ...] = ("all_reduce", "ring")
    """``"all_reduce"`` (dist.all_reduce) or ``"ring"`` with optional ``:key=value`` settings:
    ``ring:segments=2``, ``ring:check=0`` (no metadata exchange), ``ring:segments=1:check=0``."""
    device: str = "cpu"
    rounds: int = 5
    round_s: float = 0.02
    """Target seconds per round; ``iters`` is derived from the warm-up time of each size."""
    max_iters: int = 200
    warmup: int = 3

    def __post_init__(self) -> None:
        for size in self.sizes:
            if size < 4 or size % 4:
                raise ValueError(f"sizes are float32 buffers: multiples of 4 bytes >= 4, got {size}")
        for impl in self.impls:
            parse_impl(impl)  # raises on a malformed one
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.rounds < 1 or self.warmup < 1 or self.max_iters < 1 or not self.round_s > 0:
            raise ValueError(
                f"rounds, warmup and max_iters must be >= 1 and round_s > 0; got rounds="
                f"{self.rounds}, warmup={self.warmup}, max_iters={self.max_iters}, round_s={self.round_s}"
            )


@dataclasses.dataclass(frozen=True)
class Measurement:
    world_size: int
    device: str
    impl: str
    nbytes: int
    iters: int
    round_times_s: tuple[float, ...]
    """Per-call seconds of each round (the slowest rank's)."""
    correct: bool

    @property
    def time_s(self) -> float:
        return statistics.median(self.round_times_s)

    @property
    def algbw_gbs(self) -> float:
        return self.nbytes / self.time_s / 1e9

    @property
    def busbw_gbs(self) -> float:
        return self.algbw_gbs * bus_bandwidth_factor(self.world_size)


def parse_impl(impl: str) -> Callable[[torch.Tensor], Callable[[], object]]:
    """``"all_reduce"`` or ``"ring[:segments=N][:check=0|1][:graph=1]"`` -> a maker.

    ``maker(x)`` prepares an in-place all-reduce of ``x`` and returns the call to time
    (``graph=1`` captures a :class:`RingGraph` of ``x`` there, collectively).
    """
    name, *settings = impl.split(":")
    if name == "all_reduce" and not settings:
        return lambda x: (lambda: dist.all_reduce(x))
    if name != "ring":
        raise ValueError(
            f"unknown impl {impl!r}: expected 'all_reduce' or 'ring[:segments=N][:check=0][:graph=1]'"
        )
    kwargs: dict[str, object] = {}
    graph = False
    for setting in settings:
        key, _, value = setting.partition("=")
        if key == "segments" and value.isdigit():
            kwargs["segments"] = int(value)
        elif key == "check" and value in ("0", "1"):
            kwargs["check_metadata"] = value == "1"
        elif key == "graph" and value in ("0", "1"):
            graph = value == "1"
        else:
            raise ValueError(
                f"impl {impl!r}: unknown setting {setting!r}; use segments=N, check=0|1 or graph=0|1"
            )
    config = RingConfig(**kwargs)
    if graph:
        return lambda x: RingGraph(x, config=config).replay
    return lambda x: (lambda: ring_all_reduce(x, config=config))


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _line_up(device: str) -> None:
    """A small collective so that every rank starts its timer together."""
    if device == "cuda":
        dist.all_reduce(torch.ones(1, device=_device()))
    else:
        dist.barrier()


def _time_calls(call: Callable[[], object], iters: int, device: str) -> float:
    """Seconds per call of ``iters`` back-to-back calls, on this rank."""
    _line_up(device)
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def measure(rank: int, world_size: int, spec: BenchSpec) -> list[Measurement] | None:
    """Time every (size, impl) of ``spec``; rank 0 returns the measurements, others None."""
    dev = _device() if spec.device == "cuda" else torch.device("cpu")
    makers = {impl: parse_impl(impl) for impl in spec.impls}
    # Growth per in-place sum is x world_size: keep world_size ** iters <= 2 ** 120.
    iters_cap = max(1, min(spec.max_iters, int(120 / math.log2(max(world_size, 2)))))
    local: list[tuple[int, str, int, list[float], bool]] = []
    for nbytes in spec.sizes:
        numel = nbytes // 4
        g = torch.Generator(device=dev).manual_seed(20261130 + 31 * rank + numel)
        exact = torch.randint(-50, 51, (numel,), generator=g, device=dev).float()  # (numel,)
        small = torch.rand(numel, generator=g, device=dev).add_(1)  # (numel,) in [1, 2)
        sign = torch.rand(numel, generator=g, device=dev) < 0.5
        small.mul_(torch.where(sign, -(2.0**-60), 2.0**-60))  # +-[1, 2) * 2^-60
        del sign
        reference = exact.clone()
        dist.all_reduce(reference)
        correct = {}
        for impl, make in makers.items():
            out = exact.clone()
            make(out)()
            correct[impl] = bool(torch.equal(out, reference))
            del out
        del exact, reference
        x = small.clone()
        calls = {impl: make(x) for impl, make in makers.items()}
        est = []
        for impl, call in calls.items():  # warm-up, and a time estimate for iters
            est.append(_time_calls(call, spec.warmup, spec.device))
            x.copy_(small)
        iters = max(1, min(iters_cap, int(spec.round_s / max(max(est), 1e-7))))
        iters_t = torch.tensor([iters], device=dev)
        dist.broadcast(iters_t, src=0)  # every rank must run the same number of calls: rank 0's
        iters = int(iters_t.item())
        times: dict[str, list[float]] = {impl: [] for impl in spec.impls}
        for r in range(spec.rounds):
            order = list(spec.impls) if r % 2 == 0 else list(reversed(spec.impls))
            for impl in order:
                x.copy_(small)
                times[impl].append(_time_calls(calls[impl], iters, spec.device))
        for impl in spec.impls:
            local.append((nbytes, impl, iters, times[impl], correct[impl]))
        del x, small, calls
    gathered: list[object] = [None] * world_size
    dist.all_gather_object(gathered, local)
    if rank != 0:
        return None
    out = []
    for i, (nbytes, impl, iters, _, _) in enumerate(local):
        per_rank = [g[i] for g in gathered]  # type: ignore[index]
        rounds = tuple(max(p[3][k] for p in per_rank) for k in range(spec.rounds))
        ok = all(p[4] for p in per_rank)
        out.append(Measurement(world_size, spec.device, impl, nbytes, iters, rounds, ok))
    return out


def repeat_calls(rank: int, world_size: int, impl: str, nbytes: int, calls: int) -> float:
    """Run ``calls`` in-place all-reduces of ``nbytes`` (float32) with ``impl``; this rank's seconds.

    The body of the asv benchmarks: one launch, fixed work, so a sample is launch + calls.
    """
    g = torch.Generator().manual_seed(20261130 + rank)
    x = (1 + torch.rand(nbytes // 4, generator=g)) * 2.0**-60  # (numel,)
    call = parse_impl(impl)(x)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    return time.perf_counter() - t0
