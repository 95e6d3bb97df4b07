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
from typing import Any

import torch
import torch.distributed as dist

from reference_impls.collectives.ring import RingConfig, RingGraph, capture_graph, ring_all_reduce
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
    trace_calls: int = 0
    """CUDA only: after timing, profile this many calls per (size, impl) with torch.profiler and
    keep every rank's GPU timeline (kernels and copies: name, stream, start, duration, grid)
    in :attr:`Measurement.timelines`. 0: no profiling."""

    def __post_init__(self) -> None:
        for size in self.sizes:
            if size < 4 or size % 4:
                raise ValueError(
                    f"sizes are float32 buffers: multiples of 4 bytes >= 4, got {size}"
                )
        for impl in self.impls:
            parse_impl(impl)  # raises on a malformed one
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.trace_calls < 0 or (self.trace_calls and self.device != "cuda"):
            raise ValueError(f"trace_calls must be >= 0, and 0 off CUDA; got {self.trace_calls}")
        if self.rounds < 1 or self.warmup < 1 or self.max_iters < 1 or not self.round_s > 0:
            raise ValueError(
                f"rounds, warmup and max_iters must be >= 1 and round_s > 0; got rounds="
                f"{self.rounds}, warmup={self.warmup}, max_iters={self.max_iters}, "
                f"round_s={self.round_s}"
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
    timelines: tuple[tuple[dict[str, object], ...], ...] = ()
    """Per rank, the GPU events of ``trace_calls`` profiled calls (empty unless traced)."""

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
    """An impl string -> a maker of in-place all-reduces.

    Impl strings: ``"all_reduce[:graph=1]"`` or
    ``"ring[:segments=N][:check=0|1][:ctas=N][:graph=1]"``.

    ``maker(x)`` prepares an in-place all-reduce of ``x`` and returns the call to time
    (``graph=1`` captures the all-reduce of ``x`` in a CUDA graph there, collectively: a
    :class:`RingGraph` for the ring, ``dist.all_reduce`` for NCCL's own, so that replays are
    compared like for like; ``ctas=N``: :attr:`RingConfig.combine_ctas`).
    """
    name, *settings = impl.split(":")
    usage = "expected 'all_reduce[:graph=1]' or 'ring[:segments=N][:check=0|1][:ctas=N][:graph=1]'"
    if name not in ("all_reduce", "ring"):
        raise ValueError(f"unknown impl {impl!r}: {usage}")
    kwargs: dict[str, Any] = {}
    graph = False
    for setting in settings:
        key, _, value = setting.partition("=")
        if key == "graph" and value in ("0", "1"):
            graph = value == "1"
        elif name == "ring" and key == "segments" and value.isdigit():
            kwargs["segments"] = int(value)
        elif name == "ring" and key == "check" and value in ("0", "1"):
            kwargs["check_metadata"] = value == "1"
        elif name == "ring" and key == "ctas" and value.isdigit():
            kwargs["combine_ctas"] = int(value)
        else:
            raise ValueError(f"impl {impl!r}: unknown setting {setting!r}; {usage}")
    if name == "all_reduce":
        return _all_reduce_graph if graph else (lambda x: lambda: dist.all_reduce(x))
    config = RingConfig(**kwargs)
    if graph:
        return lambda x: RingGraph(x, config=config).replay
    return lambda x: lambda: ring_all_reduce(x, config=config)


def _all_reduce_graph(x: torch.Tensor) -> Callable[[], object]:
    """``dist.all_reduce(x)`` captured in a CUDA graph (warmed up on a copy of ``x``)."""
    if x.device.type != "cuda":
        raise ValueError(f"all_reduce:graph=1 captures CUDA work; got a tensor on {x.device}")
    probe = x.clone()
    return capture_graph(lambda: dist.all_reduce(probe), lambda: dist.all_reduce(x)).replay


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


def _timeline(call: Callable[[], object], calls: int) -> tuple[dict[str, object], ...]:
    """GPU kernels and copies of ``calls`` calls: name, stream, start (us from the first), dur."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    _line_up("cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:  # written by name: read it back the same way
            events = json.load(trace).get("traceEvents", [])
    gpu = [
        e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e
    ]
    if not gpu:
        return ()
    t0 = min(e["ts"] for e in gpu)
    return tuple(
        {
            "name": str(e.get("name", ""))[:90],
            "stream": e.get("args", {}).get("stream"),
            "start_us": round(e["ts"] - t0, 1),
            "dur_us": round(e["dur"], 1),
            "grid": e.get("args", {}).get("grid"),
        }
        for e in sorted(gpu, key=lambda e: e["ts"])
    )


def measure(rank: int, world_size: int, spec: BenchSpec) -> list[Measurement] | None:
    """Time every (size, impl) of ``spec``; rank 0 returns the measurements, others None."""
    dev = _device() if spec.device == "cuda" else torch.device("cpu")
    makers = {impl: parse_impl(impl) for impl in spec.impls}
    # Growth per in-place sum is x world_size: keep world_size ** iters <= 2 ** 120.
    iters_cap = max(1, min(spec.max_iters, int(120 / math.log2(max(world_size, 2)))))
    local: list[tuple[int, str, int, list[float], bool, tuple[Any, ...]]] = []
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
        for call in calls.values():  # warm-up, and a time estimate for iters
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
        traces = {
            impl: _timeline(calls[impl], spec.trace_calls) if spec.trace_calls else ()
            for impl in spec.impls
        }
        for impl in spec.impls:
            local.append((nbytes, impl, iters, times[impl], correct[impl], traces[impl]))
        del x, small, calls
    gathered: list[object] = [None] * world_size
    dist.all_gather_object(gathered, local)
    if rank != 0:
        return None
    measurements = []
    for i, (nbytes, impl, iters, *_) in enumerate(local):
        per_rank = [g[i] for g in gathered]  # type: ignore[index]
        rounds = tuple(max(p[3][k] for p in per_rank) for k in range(spec.rounds))
        ok = all(p[4] for p in per_rank)
        timelines = tuple(p[5] for p in per_rank) if spec.trace_calls else ()
        measurements.append(
            Measurement(world_size, spec.device, impl, nbytes, iters, rounds, ok, timelines)
        )
    return measurements


def repeat_calls(rank: int, world_size: int, impl: str, nbytes: int, calls: int) -> float:
    """Run ``calls`` in-place all-reduces of ``nbytes`` (float32) with ``impl``; this rank's
    seconds.

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
