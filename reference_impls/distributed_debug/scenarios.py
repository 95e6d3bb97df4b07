"""Small programs that desync in each way the report classifies, plus a healthy mixed run.

Each scenario is ``fn(rank, world)``: user code as far as the tracer is concerned, so the
report's call sites point at lines of this file (``validate.py`` holds the seed scenario).
:func:`run_scenario` runs one under :func:`trace_collectives` (or without it) and is what the
demo and the distributed tests launch on every rank.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from reference_impls.distributed_debug import validate
from reference_impls.distributed_debug.config import TraceConfig
from reference_impls.distributed_debug.tracer import trace_collectives

__all__ = [
    "SCENARIOS",
    "healthy_mixed",
    "ddp_steps",
    "run_scenario",
    "traced_healthy",
    "uneven_steps",
]


def _warmup() -> None:
    dist.all_reduce(torch.ones(4))  # warm-up


def op_mismatch(rank: int, world: int) -> None:
    """(a): the last rank takes another branch and broadcasts while the others all-reduce."""
    _warmup()
    x = torch.ones(8)
    if rank == world - 1:
        dist.broadcast(x, src=0)  # branch B
    else:
        dist.all_reduce(x)  # branch A
    dist.barrier()


def argument_mismatch(rank: int, world: int) -> None:
    """(b): a data-dependent length: rank 0 all-reduces 8 elements, the others 4. gloo aborts
    the rank that receives more than it expects (uncatchable); the survivors report."""
    _warmup()
    x = torch.ones(8 if rank == 0 else 4)
    time.sleep(0.3)  # the heartbeat carries the last call before gloo can abort a rank
    dist.all_reduce(x)  # sized by local data
    dist.all_reduce(torch.ones(2))  # next step


def skipped(rank: int, world: int) -> None:
    """(c): the last rank skips the second of three all-reduces (an exception swallowed)."""
    _warmup()
    for i in range(3):
        if rank == world - 1 and i == 1:
            continue  # "except Exception: continue"
        dist.all_reduce(torch.ones(4))  # per-item sync
    dist.barrier()  # after the loop


def straggler(rank: int, world: int) -> None:
    """(d): the last rank computes for 4 s before the next all-reduce; the others wait."""
    _warmup()
    if rank == world - 1:
        time.sleep(4.0)  # a slow step
    dist.all_reduce(torch.ones(4))  # next step


def dead_rank(rank: int, world: int) -> None:
    """(e): the last rank is killed with SIGKILL in the middle of an all-reduce."""
    _warmup()
    x = torch.ones(4)
    if rank == world - 1:
        work = dist.all_reduce(x, async_op=True)  # issued, the others not there yet
        time.sleep(0.5)  # long enough for a heartbeat to carry it
        os.kill(os.getpid(), signal.SIGKILL)
        work.wait()
    time.sleep(1.0)
    dist.all_reduce(x)  # the dead rank's partner call


def unmatched_p2p(rank: int, world: int) -> None:
    """(f): rank 0 sends to rank 1 before the step's all-reduce; rank 1 receives after it."""
    _warmup()
    x = torch.arange(4, dtype=torch.float32)
    if rank == 0:
        dist.send(x, dst=1)  # hand-off to rank 1
        dist.all_reduce(x)  # step
    elif rank == 1:
        dist.all_reduce(x)  # step, then the receive
        dist.recv(x, src=0)  # hand-off from rank 0
    else:
        dist.all_reduce(x)


def seed(rank: int, world: int) -> Any:
    return validate.run(rank, world)


def healthy_mixed(rank: int, world: int, rounds: int = 20) -> str:
    """A healthy run of every traced op (P2P included); returns a digest of every result, so a
    traced and an untraced run can be compared bit for bit. 14 collective + 4 P2P calls a round."""
    g = torch.Generator().manual_seed(1234 + rank)
    h = hashlib.sha256()
    right, left = (rank + 1) % world, (rank - 1) % world
    for _ in range(rounds):
        x = torch.randn(16, generator=g)
        dist.all_reduce(x)
        h.update(x.numpy().tobytes())
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        dist.broadcast(x, src=1 % world)
        dist.reduce(x, dst=0)
        outs = [torch.empty(16) for _ in range(world)]
        dist.all_gather(outs, x)
        big = torch.empty(16 * world)
        dist.all_gather_into_tensor(big, x)
        part = torch.empty(16)
        dist.reduce_scatter_tensor(part, big)
        dist.reduce_scatter(part, [big[i * 16 : (i + 1) * 16].clone() for i in range(world)])
        gl = [torch.empty(16) for _ in range(world)] if rank == 0 else None
        dist.gather(x, gl, dst=0)
        dist.scatter(part, [x + i for i in range(world)] if rank == 0 else None, src=0)
        a2a = torch.empty(4 * world)
        dist.all_to_all_single(a2a, torch.arange(4 * world, dtype=torch.float32) + rank)
        ins, outs2 = (
            [x[i : i + 1].clone() for i in range(world)],
            [torch.empty(1) for _ in range(world)],
        )
        dist.all_to_all(outs2, ins)
        w = dist.all_reduce(x, async_op=True)
        w.wait()
        dist.barrier()
        if world > 1:  # a ring shift: sends before receives on even ranks, P2P both ways
            recv = torch.empty(16)
            if rank % 2 == 0:
                dist.send(x, dst=right)
                dist.recv(recv, src=left)
            else:
                dist.recv(recv, src=left)
                dist.send(x, dst=right)
            h.update(recv.numpy().tobytes())
            r2 = torch.empty(16)
            ops = [dist.P2POp(dist.isend, x, right), dist.P2POp(dist.irecv, r2, left)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            h.update(r2.numpy().tobytes())
        for t in (x, part, a2a, big, *outs, *outs2):
            h.update(t.numpy().tobytes())
    return h.hexdigest()


SCENARIOS: dict[str, Callable[..., Any]] = {
    "seed": seed,
    "op_mismatch": op_mismatch,
    "argument_mismatch": argument_mismatch,
    "skipped": skipped,
    "straggler": straggler,
    "dead_rank": dead_rank,
    "unmatched_p2p": unmatched_p2p,
    "healthy": healthy_mixed,
}


def traced_healthy(rank: int, world: int, config: TraceConfig, rounds: int) -> tuple[str, int, int]:
    """:func:`healthy_mixed` under the tracer: (digest, calls recorded, calls left pending)."""
    with trace_collectives(config=config) as tracer:
        digest = healthy_mixed(rank, world, rounds)
        dist.barrier()  # every async call's Work is complete once all ranks are here
        tracer.poll_works()
        records, dropped = tracer.snapshot()
        pending = [r for r in records if r.t_done is None]
    return digest, len(records) + dropped, len(pending)


def ddp_steps(
    rank: int, world: int, config: TraceConfig, steps: int = 3
) -> tuple[str, str, list[str]]:
    """A few DDP steps of a small MLP, untraced and then (same seeds, in the same process, so
    torch's one-off import cost of DDP is paid once) traced through :func:`register_ddp_hook`:
    (weights digest untraced, weights digest traced, the traced run's ops)."""
    from torch.nn.parallel import DistributedDataParallel

    from reference_impls.distributed_debug.tracer import register_ddp_hook

    def train(traced: bool) -> tuple[str, list[str]]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        ddp = DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(100 + rank)
        ops: list[str] = []
        if traced:
            register_ddp_hook(ddp)
        with trace_collectives(config=config) if traced else contextlib.nullcontext() as tracer:
            for _ in range(steps):
                x, y = (
                    torch.randn(4, 8, generator=g),
                    torch.randn(4, 1, generator=g),
                )  # (B, 8), (B, 1)
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(ddp(x), y)
                loss.backward()  # backward: bucket all-reduce
                opt.step()
            if tracer is not None:
                tracer.poll_works()
                ops = [f"{r.op}:{r.t_done is not None}" for r in tracer.snapshot()[0]]
        h = hashlib.sha256()
        for p in model.parameters():
            h.update(p.detach().numpy().tobytes())
        return h.hexdigest(), ops

    plain, _ = train(traced=False)
    traced, ops = train(traced=True)
    return plain, traced, ops


def nccl_skipped(rank: int, world: int, config: TraceConfig) -> None:
    """(c) on CUDA tensors: the last rank skips the second of three all-reduces. NCCL returns
    to the CPU before the GPU is done; the tracer follows each call's Work."""
    torch.cuda.set_device(rank % torch.cuda.device_count())
    x = torch.ones(1024, device="cuda")
    with trace_collectives(config=config):
        dist.all_reduce(x)  # warm-up
        for i in range(3):
            if rank == world - 1 and i == 1:
                continue
            dist.all_reduce(x)  # per-item sync
        dist.all_reduce(torch.ones(8, device="cuda"))  # after the loop
        dist.barrier()  # end: blocks the CPU while the GPU hangs
        torch.cuda.synchronize()


def uneven_steps(rank: int, world: int) -> str:
    """check_equal_steps on the seed's uneven split, then on an even one: the error (or "")."""
    from reference_impls.distributed_debug.guards import UnevenStepsError, check_equal_steps

    check_equal_steps(3, what="validation batches")  # equal: passes
    try:
        check_equal_steps(
            len(validate.batches(validate.shard(rank, world))), what="validation batches"
        )
    except UnevenStepsError as exc:
        return str(exc)
    return ""


def run_scenario(
    rank: int,
    world: int,
    name: str,
    config: TraceConfig | None = None,
    trace: bool = True,
    **kwargs: Any,
) -> Any:
    """Run scenario ``name`` on this rank, traced (the default) or not; ``kwargs`` go to it."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    if not trace:
        return SCENARIOS[name](rank, world, **kwargs)
    with trace_collectives(config=config):
        return SCENARIOS[name](rank, world, **kwargs)
