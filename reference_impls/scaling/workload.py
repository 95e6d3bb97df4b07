"""What one rank of an investigation runs: the training loop's model under DDP, fed by a
DataLoader, every step timed by :class:`~reference_impls.scaling.profiler.StepProfiler`.

:func:`run_rank` is the function :func:`reference_impls.collectives.launch` starts on every
rank. For each case (strong and weak scaling batch sizes) it runs warm-up steps, then timed
steps; then, on the same model, the same steps with the profiler off and on in alternating
blocks (the profiler's overhead, same run); the loader alone (its throughput, no model); then
``dist.all_reduce`` alone at the gradient size and 1/8 of it, timed by
:func:`reference_impls.collectives.busbw.measure` (the interconnect baseline, and the cost
model's alpha and beta). Records stream to ``<records_dir>/w<N>-<case>-rank<r>.jsonl`` as they
are made, and ``faulthandler`` dumps the stacks every few seconds: a rank killed for a timeout
leaves where it stopped.

Fault injection (for tests and demonstrations): ``slow_rank``/``slow_ms`` sleeps in that rank's
forward phase (a slower GPU or CPU), ``loader_sleep_ms`` in every batch the loader produces (a
slow input pipeline), ``loader_fail_at`` raises in the loader at that batch, ``hang_at_step``
blocks the last rank forever at that step (counted over warm-up and timed steps of all cases).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from reference_impls.collectives.busbw import BenchSpec, measure
from reference_impls.scaling.profiler import StepProfiler
from reference_impls.scaling.stragglers import host_facts
from reference_impls.seeds import mix_seed
from reference_impls.training.config import ModelConfig, OptimizerConfig, OptimizerName
from reference_impls.training.model import build_model, build_optimizer

__all__ = ["LoaderError", "RankConfig", "SyntheticBatches", "run_rank"]


class LoaderError(RuntimeError):
    """The (injected) loader failure."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankConfig:
    """Everything a rank needs (picklable: it crosses the process boundary)."""

    device: str = "cpu"
    in_features: int = 64
    hidden: tuple[int, ...] = (256, 256)
    batches: tuple[tuple[str, int], ...] = (("strong", 64),)
    """(case name, per-rank batch) pairs run one after another in the same group."""
    optimizer: OptimizerName = "adam"
    """``adam`` (the training loop's default) or ``sgd`` (no momentum: one pass over the
    weights, the least compute per byte of gradient)."""
    lr: float = 1e-4
    steps: int = 20
    warmup: int = 3
    overhead_blocks: int = 2
    """Alternating untimed/timed blocks of ``steps // 2`` steps for the overhead (0: skip)."""
    loader_steps: int = 20
    loader_sleep_ms: float = 0.0
    loader_fail_at: int | None = None
    slow_rank: int | None = None
    slow_ms: float = 0.0
    hang_at_step: int | None = None
    comm_sizes: tuple[int, ...] = ()
    """Solo all-reduce sizes in bytes for the baseline (empty: the gradient size and 1/8 of it)."""
    comm_reps: int = 5
    records_dir: str | None = None
    stack_dump_every_s: float | None = None
    """Dump every thread's stack (faulthandler) every this many seconds into the records
    directory: when the rank is killed for a timeout, the last dump says where it was."""
    seed: int = 0


class SyntheticBatches(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random regression batches, generated per batch (like a loader that decodes), with an
    optional sleep per batch (a slow pipeline) and an optional failure."""

    def __init__(
        self,
        batch: int,
        in_features: int,
        *,
        seed: int,
        sleep_ms: float = 0.0,
        fail_at: int | None = None,
    ):
        self.batch, self.in_features, self.seed = batch, in_features, seed
        self.sleep_s, self.fail_at = sleep_ms / 1e3, fail_at

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(self.seed)
        i = 0
        while True:
            if self.fail_at is not None and i == self.fail_at:
                raise LoaderError(f"injected loader failure at batch {i}")
            if self.sleep_s:
                time.sleep(self.sleep_s)
            x = torch.randn(self.batch, self.in_features, generator=g)  # (B, in)
            y = torch.randn(self.batch, 1, generator=g)  # (B, 1)
            yield x, y
            i += 1


def _loader(
    cfg: RankConfig, batch: int, rank: int
) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
    data = SyntheticBatches(
        batch,
        cfg.in_features,
        seed=mix_seed(cfg.seed, "loader", rank),
        sleep_ms=cfg.loader_sleep_ms,
        fail_at=cfg.loader_fail_at,
    )
    return DataLoader(data, batch_size=None, num_workers=0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_rank(rank: int, world: int, cfg: RankConfig) -> dict[str, Any]:
    """One rank's investigation (module docstring); returns JSON-ready results."""
    if cfg.stack_dump_every_s and cfg.records_dir:
        stack = open(Path(cfg.records_dir) / f"stack-w{world}-rank{rank}.txt", "w")  # noqa: SIM115
        faulthandler.dump_traceback_later(cfg.stack_dump_every_s, repeat=True, file=stack)
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if cfg.device == "cuda"
        else torch.device("cpu")
    )
    torch.manual_seed(cfg.seed)
    with device:
        model = build_model(
            ModelConfig(in_features=cfg.in_features, hidden=cfg.hidden, out_features=1)
        )
    n_params = sum(p.numel() for p in model.parameters())
    # Plain SGD (no momentum) when asked: one pass over the weights.
    opt = build_optimizer(OptimizerConfig(name=cfg.optimizer, lr=cfg.lr, momentum=0.0), model)
    out: dict[str, Any] = {
        "rank": rank,
        "world": world,
        "facts": host_facts(
            rank, local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)), device=cfg.device
        ),
        "params": n_params,
        "grad_bytes": 4 * n_params,
        "cases": {},
    }
    runner = _Runner(cfg, rank, world, device, model, opt)
    for case, batch in cfg.batches:
        out["cases"][case] = runner.run_case(case, batch)
    if world > 1:
        out["solo_allreduce"] = _solo_allreduce(cfg, out["grad_bytes"], device)
    if cfg.stack_dump_every_s:
        faulthandler.cancel_dump_traceback_later()
    return out


class _Runner:
    """The steps of one rank, case after case, on one model."""

    def __init__(
        self,
        cfg: RankConfig,
        rank: int,
        world: int,
        device: torch.device,
        model: nn.Module,
        opt: torch.optim.Optimizer,
    ) -> None:
        self.cfg, self.rank, self.world, self.device = cfg, rank, world, device
        self.model, self.opt = model, opt
        self.global_step = 0

    def _wrap(self) -> nn.Module:
        if self.world == 1:
            return self.model
        ids = [self.device.index] if self.device.type == "cuda" else None
        # A new wrapper per case: DDP takes one communication hook, and each case has its
        # own profiler.
        return nn.parallel.DistributedDataParallel(self.model, device_ids=ids)

    def _step(self, prof: StepProfiler, net: nn.Module, batches: Iterator[Any]) -> None:
        cfg, rank = self.cfg, self.rank
        if self.global_step == cfg.hang_at_step and rank == self.world - 1:
            time.sleep(10**6)  # never arrives: the others block in the all-reduce
        self.global_step += 1
        with prof.phase("data"):
            x, y = next(batches)  # (B, in), (B, 1)
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
        self.opt.zero_grad(set_to_none=True)
        with prof.phase("forward"):
            if rank == cfg.slow_rank and cfg.slow_ms:
                time.sleep(cfg.slow_ms / 1e3)  # a slower device: more time in its own compute
            loss = F.mse_loss(net(x), y)
        with prof.phase("backward"):
            loss.backward()  # DDP's all-reduces run in here
        with prof.phase("optimizer"):
            self.opt.step()

    def run_case(self, case: str, batch: int) -> dict[str, Any]:
        cfg, device = self.cfg, self.device
        net = self._wrap()
        sink = None
        if cfg.records_dir:
            path = Path(cfg.records_dir) / f"w{self.world}-{case}-rank{self.rank}.jsonl"
            sink = path.open("w", buffering=1)  # line-buffered: a killed rank leaves its last step
        prof = StepProfiler(rank=self.rank, device=device, sink=sink)
        if isinstance(net, nn.parallel.DistributedDataParallel):
            prof.attach_ddp(net)
        batches = iter(_loader(cfg, batch, self.rank))
        prof.enabled = False
        for _ in range(cfg.warmup):
            self._step(prof, net, batches)
        _sync(device)
        prof.enabled = True
        outer: list[float] = []
        for _ in range(cfg.steps):
            t0 = time.perf_counter()
            with prof.step():
                self._step(prof, net, batches)
            _sync(device)
            outer.append(time.perf_counter() - t0)
        prof.flush()
        records = list(prof.records)
        if sink is not None:
            sink.close()
        prof.sink = None
        overhead = self._overhead(prof, net, batches) if cfg.overhead_blocks > 0 else None
        return {
            "batch": batch,
            "records": [dataclasses.asdict(r) for r in records],
            "outer_step_s": outer,
            "overhead": overhead,
            "loader": _loader_only(cfg, batch, self.rank),
        }

    def _overhead(
        self, prof: StepProfiler, net: nn.Module, batches: Iterator[Any]
    ) -> dict[str, Any]:
        """The same steps untimed and timed in alternating blocks, on one host clock."""
        block = max(2, self.cfg.steps // 2)
        on: list[float] = []
        off: list[float] = []
        prof.keep = False
        for b in range(2 * self.cfg.overhead_blocks):
            enabled = b % 2 == 1
            prof.enabled = enabled
            for _ in range(block):
                t0 = time.perf_counter()
                if enabled:
                    with prof.step():
                        self._step(prof, net, batches)
                else:
                    self._step(prof, net, batches)
                _sync(self.device)
                (on if enabled else off).append(time.perf_counter() - t0)
        prof.enabled = True
        return {
            "steps_each": len(on),
            "median_on_ms": 1e3 * statistics.median(on),
            "median_off_ms": 1e3 * statistics.median(off),
            "relative": statistics.median(on) / statistics.median(off) - 1,
        }


def _loader_only(cfg: RankConfig, batch: int, rank: int) -> dict[str, float]:
    """The loader alone, no model: what it can deliver per rank."""
    it = iter(_loader(cfg, batch, rank))
    next(it)
    t0 = time.perf_counter()
    for _ in range(cfg.loader_steps):
        next(it)
    seconds = time.perf_counter() - t0
    return {
        "batches": cfg.loader_steps,
        "seconds": seconds,
        "samples_per_s": cfg.loader_steps * batch / seconds,
    }


def _solo_allreduce(cfg: RankConfig, grad_bytes: int, device: torch.device) -> dict[str, Any]:
    """The interconnect baseline: ``dist.all_reduce`` alone at the gradient size and 1/8 of it
    (two points for the cost model's alpha and beta), timed by the collectives package's bus
    bandwidth benchmark (nccl-tests conventions: ranks lined up, back-to-back calls, the
    slowest rank's time, median of rounds)."""
    sizes = cfg.comm_sizes or (max(4, grad_bytes // 8 // 4 * 4), max(4, grad_bytes // 4 * 4))
    spec = BenchSpec(
        sizes=tuple(sorted(set(sizes))),
        impls=("all_reduce",),
        device=device.type,
        rounds=max(3, cfg.comm_reps),
    )
    measured = measure(dist.get_rank(), dist.get_world_size(), spec)
    box = [
        None
        if measured is None
        else [{"bytes": m.nbytes, "seconds": m.time_s, "correct": m.correct} for m in measured]
    ]
    dist.broadcast_object_list(box, src=0)  # every rank returns rank 0's table
    return {"method": "reference_impls.collectives.busbw.measure", "sizes": box[0]}
