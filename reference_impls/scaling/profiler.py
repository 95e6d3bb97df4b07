"""Cheap per-phase timers for a training step: a context manager per phase for any loop, a DDP
communication hook for gradient all-reduces, and a callback for the project's ``Trainer``.

    prof = StepProfiler(rank=rank, sink=open("rank0.jsonl", "w"))
    prof.attach_ddp(ddp_model)              # optional: times DDP's bucket all-reduces
    for _ in range(steps):
        with prof.step():
            with prof.phase("data"):
                x, y = next(batches)
            with prof.phase("forward"):
                loss = loss_fn(ddp_model(x), y)
            with prof.phase("backward"):
                loss.backward()             # DDP's all-reduces run in here
            with prof.phase("optimizer"):
                opt.step()
            with prof.phase("comm"):        # a collective of the loop's own: all exposed
                dist.all_reduce(metric)

Clocks: ``time.perf_counter`` on the CPU; on CUDA, events recorded on the current stream
(a host clock would time the kernel launches, not the kernels). CUDA steps are resolved
lazily, once their last event has completed, so the profiler never adds a synchronization
(:meth:`StepProfiler.flush` waits for the rest at the end).

Communication inside ``backward`` (DDP's buckets) is split by the hook's timestamps: a bucket's
all-reduce starts when the bucket is ready and ends when its future completes. The last
bucket becomes ready when the backward's last gradient is computed, so ``backward`` compute
ends there; what remains of the phase is *exposed* communication, and communication before that
point is *overlapped*. Each step yields one :class:`~reference_impls.scaling.breakdown.StepRecord`
(one ~200-byte JSON line written to ``sink``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO, Any

import torch

from reference_impls.scaling.breakdown import StepRecord

__all__ = ["PHASES", "StepProfiler", "TrainerBreakdown"]

PHASES = ("data", "forward", "backward", "optimizer", "comm")


class _CpuClock:
    """Host monotonic clock: a mark is a float (seconds)."""

    def now(self) -> Any:
        return time.perf_counter()

    def ready(self, mark: Any) -> bool:
        return True

    def seconds(self, origin: Any, mark: Any) -> float:
        return float(mark - origin)

    def wait(self, mark: Any) -> None:
        pass


class _CudaClock:
    """CUDA events on the current stream: a mark is an event; differences via elapsed_time."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def now(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ready(self, mark: Any) -> bool:
        return bool(mark.query())

    def seconds(self, origin: Any, mark: Any) -> float:
        return float(origin.elapsed_time(mark)) / 1e3

    def wait(self, mark: Any) -> None:
        mark.synchronize()


class _Step:
    __slots__ = ("comm", "host_start", "index", "marks", "start", "end", "comm_bytes")

    def __init__(self, index: int, start: Any, host_start: float) -> None:
        self.index = index
        self.start = start
        self.host_start = host_start
        self.end: Any = None
        self.marks: list[tuple[str, Any, Any]] = []  # (phase, start mark, end mark)
        self.comm: list[list[Any]] = []  # [ready mark, done mark or None]
        self.comm_bytes = 0


class StepProfiler:
    """Times the phases of each step on one rank; see the module docstring.

    Args:
        rank: written into every record.
        device: a CUDA device selects CUDA-event timing; anything else the host clock.
        sink: a text file; each finished step is written as one JSON line (and flushed at
            :meth:`flush`).
        keep: keep the records in :attr:`records` (tests, reports); off for long runs.
        enabled: False makes every call a no-op (the same loop, untimed: for overhead runs).
    """

    def __init__(
        self,
        *,
        rank: int = 0,
        device: torch.device | str | None = None,
        sink: IO[str] | None = None,
        keep: bool = True,
        enabled: bool = True,
    ) -> None:
        dev = torch.device(device) if device is not None else torch.device("cpu")
        self.rank = rank
        self.enabled = enabled
        self.clock: _CpuClock | _CudaClock = _CudaClock(dev) if dev.type == "cuda" else _CpuClock()
        self.sink = sink
        self.keep = keep
        self.records: list[StepRecord] = []
        self._pending: deque[_Step] = deque()
        self._current: _Step | None = None
        self._count = 0
        self._lock = threading.Lock()  # comm-hook callbacks may run on a backend's thread
        self.phase_now: str | None = None
        """The phase running now (a hang report can name it)."""
        # Context managers are plain classes made once: a generator-based one costs ~4 us a
        # use, which over five phases is most of the profiler's per-step cost.
        self._step_cm = _StepContext(self)
        self._phase_cms = {name: _PhaseContext(self, name) for name in PHASES}

    # ------------------------------------------------------------------ step and phases

    def begin_step(self) -> None:
        if not self.enabled:
            return
        if self._current is not None:
            raise RuntimeError("begin_step() inside a step: end_step() first")
        self._current = _Step(self._count, self.clock.now(), time.perf_counter())
        self._count += 1

    def end_step(self) -> StepRecord | None:
        """Close the step; returns its record when it could be resolved already (always on
        the CPU; on CUDA once its events completed, else later through :meth:`flush`)."""
        if not self.enabled:
            return None
        step = self._current
        if step is None:
            raise RuntimeError("end_step() without begin_step()")
        step.end = self.clock.now()
        self._current = None
        self.phase_now = None
        self._pending.append(step)
        return self._drain(block=False)

    def step(self) -> _StepContext:
        """``with prof.step():`` begins and ends a step (the step ends even on an exception)."""
        return self._step_cm

    def phase(self, name: str) -> _PhaseContext:
        """``with prof.phase(name):`` times ``name`` (one of :data:`PHASES`) in the current step."""
        cm = self._phase_cms.get(name)
        if cm is None:
            raise ValueError(f"phase must be one of {', '.join(PHASES)}; got {name!r}")
        return cm

    def mark(self, name: str, start: Any, end: Any) -> None:
        """Record a phase from two marks taken with ``self.clock.now()`` (hooks use this)."""
        if self.enabled and self._current is not None:
            self._current.marks.append((name, start, end))

    # ------------------------------------------------------------------ communication

    def comm_started(self, nbytes: int) -> list[Any] | None:
        """A collective of ``nbytes`` starts now; returns a handle for :meth:`comm_done`."""
        if not self.enabled or self._current is None:
            return None
        entry = [self.clock.now(), None]
        with self._lock:
            self._current.comm.append(entry)
            self._current.comm_bytes += nbytes
        return entry

    def comm_done(self, handle: list[Any] | None) -> None:
        if handle is not None:
            handle[1] = self.clock.now()

    def attach_ddp(self, ddp: torch.nn.parallel.DistributedDataParallel) -> None:
        """Register a communication hook that does what DDP's default does (average the
        bucket over ranks with one all-reduce) and times it."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        # No annotations: DDP compares them with dist.GradBucket, and postponed annotations
        # are strings.
        def hook(state, bucket):
            handle = self.comm_started(bucket.buffer().numel() * bucket.buffer().element_size())
            fut = allreduce_hook(state, bucket)

            def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
                self.comm_done(handle)
                return f.value()

            return fut.then(done)

        ddp.register_comm_hook(None, hook)

    # ------------------------------------------------------------------ records

    def flush(self) -> list[StepRecord]:
        """Resolve every pending step (waits for CUDA work) and flush the sink."""
        out = []
        while self._pending:
            rec = self._drain(block=True)
            if rec is not None:
                out.append(rec)
        if self.sink is not None:
            self.sink.flush()
        return out

    def _drain(self, *, block: bool) -> StepRecord | None:
        last = None
        while self._pending:
            step = self._pending[0]
            if not block and not self.clock.ready(step.end):
                break
            if block:
                self.clock.wait(step.end)
            self._pending.popleft()
            last = self._resolve(step)
            if self.keep:
                self.records.append(last)
            if self.sink is not None:
                self.sink.write(last.to_json() + "\n")
            if block:
                break
        return last

    def _resolve(self, step: _Step) -> StepRecord:
        sec = self.clock.seconds
        origin = step.start
        wall = sec(origin, step.end)
        totals = dict.fromkeys(PHASES, 0.0)
        backward: tuple[float, float] | None = None
        for name, a, b in step.marks:
            t0 = sec(origin, a)
            t1 = sec(origin, b)
            if t1 > t0:
                totals[name] += t1 - t0
            if name == "backward":
                backward = (t0, t1)
        exposed = overlapped = 0.0
        if step.comm and backward is not None:
            with self._lock:
                done = [(a, b) for a, b in step.comm if b is not None]
            for _, b in done:  # CUDA: recorded on the hook's stream, not the step's
                if not self.clock.ready(b):
                    self.clock.wait(b)
            comm = [(sec(origin, a), sec(origin, b)) for a, b in done]
            if comm:
                # DDP: the last bucket is ready when backward's compute ends; after that point
                # the phase only waits for all-reduces (exposed), before it they hide behind
                # compute.
                b0, b1 = backward
                compute_end = min(max(max(a for a, _ in comm), b0), b1)
                exposed = b1 - compute_end
                overlapped = _union_length(
                    [(a, min(b, compute_end)) for a, b in comm if a < compute_end]
                )
                totals["backward"] -= exposed
        return StepRecord(
            step=step.index,
            rank=self.rank,
            wall=wall,
            data=totals["data"],
            forward=totals["forward"],
            backward=max(0.0, totals["backward"]),
            optimizer=totals["optimizer"],
            comm=totals["comm"] + exposed,
            comm_overlapped=overlapped,
            comm_bytes=step.comm_bytes,
            start=step.host_start,
        )


class _StepContext:
    __slots__ = ("prof",)

    def __init__(self, prof: StepProfiler) -> None:
        self.prof = prof

    def __enter__(self) -> None:
        self.prof.begin_step()

    def __exit__(self, *exc: object) -> None:
        if self.prof._current is not None:  # noqa: SLF001
            self.prof.end_step()


class _PhaseContext:
    __slots__ = ("name", "prof", "start")

    def __init__(self, prof: StepProfiler, name: str) -> None:
        self.prof, self.name, self.start = prof, name, None

    def __enter__(self) -> None:
        prof = self.prof
        if not prof.enabled:
            return
        if prof._current is None:  # noqa: SLF001
            raise RuntimeError(f"phase({self.name!r}) outside a step: wrap the step in prof.step()")
        prof.phase_now = self.name
        self.start = prof.clock.now()

    def __exit__(self, *exc: object) -> None:
        prof = self.prof
        if prof.enabled and prof._current is not None and self.start is not None:  # noqa: SLF001
            prof._current.marks.append((self.name, self.start, prof.clock.now()))  # noqa: SLF001
        self.start = None


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


class TrainerBreakdown:
    """A ``Trainer`` callback that times each step's phases with hooks (no change to the loop).

    The Trainer calls ``on_step_end`` after every optimizer step; at the first call this
    installs a forward pre-hook and hook on the trainer's network, optimizer step pre- and
    post-hooks, and (under DDP) the timed communication hook. From then on a step runs from
    one ``on_step_end`` to the next: ``data`` is the time until the forward starts (batch
    gather and copy, ``zero_grad``), ``backward`` runs from the forward's end to the
    optimizer (loss, backward, DDP's all-reduces), the rest (scheduler, the logged loss's
    all-reduce, metrics row) is ``other``. The first step is not timed.

    Subclassing ``Callback`` is left to the caller's import of the training package:
    ``Trainer`` only calls the methods by name.
    """

    def __init__(
        self, profiler: StepProfiler, *, on_record: Callable[[StepRecord], None] | None = None
    ):
        self.profiler = profiler
        self.on_record = on_record
        self._installed = False
        self._fwd0: Any = None
        self._fwd1: Any = None
        self._opt0: Any = None

    def _install(self, trainer: Any) -> None:
        clock = self.profiler.clock
        net, opt = trainer.net, trainer.optimizer

        def fwd_pre(module: Any, args: Any) -> None:
            self._fwd0 = clock.now()
            self.profiler.phase_now = "forward"

        def fwd_post(module: Any, args: Any, out: Any) -> None:
            self._fwd1 = clock.now()
            self.profiler.phase_now = "backward"

        def opt_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
            self._opt0 = clock.now()
            self.profiler.phase_now = "optimizer"

        def opt_post(optimizer: Any, args: Any, kwargs: Any) -> None:
            p, end = self.profiler, clock.now()
            p.mark("data", p._current.start if p._current else end, self._fwd0)  # noqa: SLF001
            p.mark("forward", self._fwd0, self._fwd1)
            p.mark("backward", self._fwd1, self._opt0)
            p.mark("optimizer", self._opt0, end)

        self._handles = [
            net.register_forward_pre_hook(fwd_pre),
            net.register_forward_hook(fwd_post),
            opt.register_step_pre_hook(opt_pre),
            opt.register_step_post_hook(opt_post),
        ]
        if isinstance(net, torch.nn.parallel.DistributedDataParallel):
            self.profiler.attach_ddp(net)
        self._installed = True

    def on_step_end(self, trainer: Any) -> None:
        p = self.profiler
        if p._current is not None:  # noqa: SLF001
            rec = p.end_step()
            if rec is not None and self.on_record is not None:
                self.on_record(rec)
        if not self._installed:
            self._install(trainer)
        p.begin_step()

    def on_checkpoint(self, trainer: Any, *, best: bool) -> None:
        """Validation and checkpoints are not steps: the step that contains them is dropped."""
        p = self.profiler
        if p._current is not None:  # noqa: SLF001
            p._current = None  # noqa: SLF001
            p.begin_step()

    def close(self) -> list[StepRecord]:
        """Drop the unfinished step, remove the hooks, resolve what is pending."""
        self.profiler._current = None  # noqa: SLF001
        for h in getattr(self, "_handles", []):
            h.remove()
        return self.profiler.flush()
