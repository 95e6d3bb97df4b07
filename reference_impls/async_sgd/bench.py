"""Async parameter server vs synchronous DistributedDataParallel, both on gloo, in one run.

Two measurements, each side by side (``python -m reference_impls.async_sgd bench``):

* **Throughput**: the 1M-parameter MLP (``dim = hidden = 1000``: 1,002,001 parameters),
  ``workers`` gloo workers, for ``seconds``. Async: 1 server + N workers, server updates
  applied per second (each update = one worker's minibatch). Sync: N DDP ranks, optimizer
  steps per second (each step = N minibatches, gradients all-reduced). Samples per second
  put the two on one scale.
* **Time to a target loss with one worker 3x slower**: the same model and learning rate;
  the last worker sleeps twice its own previous iteration (compute and communication,
  without the sleep) in each iteration, so its iterations take 3x as long. Async (``1/(1+s)``
  policy) stops when the server's full-data loss reaches the target; DDP evaluates on rank 0
  every ``eval_every`` steps and broadcasts the stop. Time from the training loop's start.

Every rank runs with one torch thread (what torchrun does, and what keeps oversubscribed
ranks from starving each other's communication threads).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from typing import Any

import torch
import torch.distributed as dist

from reference_impls.async_sgd.distributed import ServerReport, TrainConfig, run_rank
from reference_impls.async_sgd.policies import make_policy
from reference_impls.async_sgd.problem import Problem, ProblemConfig

__all__ = ["BenchSpec", "ddp_rank", "run_all"]

MODEL_1M = ProblemConfig(
    kind="mlp", samples=512, dim=1000, hidden=1000, batch_size=16, l2=0.0, seed=0
)
# Plain SGD on this MLP diverges above ~0.01 (the 1000 hidden activations make the output
# layer's curvature ~ |h|^2 ~ 200, so steps must stay below 2/200); 0.008 halves the loss in
# about 30 steps of one minibatch of 16.
LR = 0.008
TARGET_FRACTION = 0.5
"""The target loss is this fraction of the initial loss."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchSpec:
    """One DDP run (the async side is a :class:`~.distributed.TrainConfig`)."""

    problem: ProblemConfig = MODEL_1M
    lr: float = LR
    seconds: float = 10.0
    """Stop after this long (throughput runs) or as a cap (time-to-target runs)."""
    slow_rank: int | None = None
    slowdown: float = 3.0
    target_loss: float | None = None
    eval_every: int = 5


def ddp_rank(rank: int, world: int, spec: BenchSpec) -> dict[str, Any]:
    """Synchronous data parallel training with DDP (gloo) on one rank's shard."""
    from torch.nn.parallel import DistributedDataParallel

    problem = Problem(spec.problem)
    module = problem.build_module()
    model = DistributedDataParallel(module)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr)
    flag = torch.zeros(1)
    dist.barrier()
    t0 = time.monotonic()
    steps, reached = 0, None
    t_prev: float | None = None
    iteration: float | None = None
    slept = slept_total = 0.0
    while True:
        tc = time.perf_counter()
        if t_prev is not None:
            iteration = tc - t_prev - slept  # the previous step without this rank's sleep
        t_prev, slept = tc, 0.0
        idx = problem.batch_indices(rank, world, steps)
        opt.zero_grad(set_to_none=True)
        loss = problem.loss_fn(model, idx)
        if rank == spec.slow_rank and iteration is not None:
            # as the async straggler: its whole step takes `slowdown` times as long
            slept = (spec.slowdown - 1.0) * iteration
            time.sleep(slept)
            slept_total += slept
        loss.backward()  # the all-reduce of the gradients happens in here
        opt.step()
        steps += 1
        if steps % spec.eval_every == 0:
            elapsed = time.monotonic() - t0
            if rank == 0:
                stop = elapsed >= spec.seconds
                if spec.target_loss is not None:
                    with torch.no_grad():
                        full = float(problem.loss_fn(module))
                    if full <= spec.target_loss:
                        reached, stop = time.monotonic() - t0, True
                flag.fill_(float(stop))
            dist.broadcast(flag, 0)
            if flag.item():
                break
    wall = time.monotonic() - t0
    return {"steps": steps, "wall_s": wall, "time_to_target_s": reached, "slept_s": slept_total}


def _launch(fn: Any, arg: Any, world: int, timeout: float) -> list[Any]:
    from reference_impls.collectives.launcher import LaunchConfig, launch

    return launch(fn, arg, config=LaunchConfig(world_size=world, timeout_s=timeout))


def async_throughput(
    workers: int, seconds: float, problem: ProblemConfig = MODEL_1M
) -> dict[str, Any]:
    config = TrainConfig(
        policy=make_policy("inverse"),
        problem=problem,
        lr=LR,
        updates=10**9,
        max_time_s=seconds,
        eval_every=0,
        dead_after_s=60.0,
    )
    report: ServerReport = _launch(run_rank, config, workers + 1, seconds + 120)[0]
    return {
        "updates": report.version,
        "wall_s": report.wall_s,
        "updates_per_s": report.version / report.wall_s,
        "samples_per_s": report.version * problem.batch_size / report.wall_s,
    }


def ddp_throughput(
    workers: int, seconds: float, problem: ProblemConfig = MODEL_1M
) -> dict[str, Any]:
    r = _launch(ddp_rank, BenchSpec(problem=problem, seconds=seconds), workers, seconds + 120)[0]
    return {
        "steps": r["steps"],
        "wall_s": r["wall_s"],
        "steps_per_s": r["steps"] / r["wall_s"],
        "samples_per_s": r["steps"] * workers * problem.batch_size / r["wall_s"],
    }


def time_to_target(
    workers: int,
    target: float,
    cap_s: float,
    problem: ProblemConfig = MODEL_1M,
    slowdown: float = 3.0,
) -> dict[str, Any]:
    """Both modes with the last worker ``slowdown`` times slower (1.0: none); seconds until
    the loss reaches ``target`` (None: not within ``cap_s``)."""
    slow = TrainConfig(
        policy=make_policy("inverse"),
        problem=problem,
        lr=LR,
        updates=10**9,
        max_time_s=cap_s,
        eval_every=5,
        target_loss=target,
        stragglers=(workers,),
        slowdown=3.0,
        dead_after_s=60.0,
    )
    a: ServerReport = _launch(run_rank, slow, workers + 1, cap_s + 120)[0]
    spec = BenchSpec(
        problem=problem,
        seconds=cap_s,
        slow_rank=workers - 1 if slowdown > 1 else None,
        slowdown=slowdown,
        target_loss=target,
    )
    ddp = _launch(ddp_rank, spec, workers, cap_s + 120)
    d = ddp[0]
    return {
        "target_loss": target,
        "slowdown": slowdown,
        "async_s": a.time_to_target_s,
        "async_updates": a.version,
        "ddp_s": d["time_to_target_s"],
        "ddp_steps": d["steps"],
        "ddp_slow_rank_slept_s": max(r["slept_s"] for r in ddp),
    }


def run_all(
    workers: int = 4, seconds: float = 10.0, target: float | None = None, repeat: int = 1
) -> dict[str, Any]:
    """Every measurement of the module docstring, with the machine's description; the
    time-to-target pairs are run ``repeat`` times (interleaved) and reported with medians."""
    import os
    import platform
    import statistics

    problem = Problem(MODEL_1M)
    initial = problem.full_loss(problem.init_params)
    target = target if target is not None else TARGET_FRACTION * initial
    a = async_throughput(workers, seconds)
    d = ddp_throughput(workers, seconds)
    cap = max(60.0, 6 * seconds)
    runs: dict[str, list[dict[str, Any]]] = {"straggler_3x": [], "no_straggler": []}
    for _ in range(repeat):
        runs["straggler_3x"].append(time_to_target(workers, target, cap, slowdown=3.0))
        runs["no_straggler"].append(time_to_target(workers, target, cap, slowdown=1.0))

    def median(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [r[key] for r in rows]
        return None if any(v is None for v in values) else statistics.median(values)

    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "parameters": problem.numel,
        "workers": workers,
        "initial_loss": initial,
        "target_loss": target,
        "async": a,
        "ddp": d,
        "async_over_ddp_samples_per_s": a["samples_per_s"] / d["samples_per_s"],
        "time_to_target": {
            name: {
                "async_s_median": median(rows, "async_s"),
                "ddp_s_median": median(rows, "ddp_s"),
                "runs": rows,
            }
            for name, rows in runs.items()
        },
    }
