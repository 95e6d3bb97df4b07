"""The real parameter server: rank 0 serves, ranks 1..N compute, over torch.distributed P2P.

Launch with ``torchrun`` (one process per rank, any number of nodes through its rendezvous)::

    torchrun --nproc-per-node 5 -m reference_impls.async_sgd train --policy inverse --stragglers 1

or, on one machine, let ``python -m reference_impls.async_sgd train`` start the gloo processes
itself. Both call :func:`run_rank`.

Protocol (gloo on CPU; every message is a ``torch.distributed`` send/recv, tags below):

* worker -> server, ``TAG_HEADER``: 8 int64 ``[kind, seq, version_pulled, numel, loss bits,
  0, 0, 0]`` with kind PULL (first contact), PUSH (followed by the flat float32 gradient,
  ``numel`` elements, ``TAG_GRAD``) or BYE (after it was told to stop).
* server -> worker, ``TAG_REPLY``: 8 int64 ``[stop, version, clock, status of the last push,
  expected numel, 0, 0, 0]`` then, unless stop, the parameters (``TAG_PARAMS``).

The server receives headers from *any* source (``dist.recv(src=None)``) in a receiver thread,
so pushes are applied in the order they arrive; the main thread applies them, answers, keeps
the SSP gate, watches heartbeats and writes checkpoints. (gloo's ``Work.is_completed()`` stays
False until ``wait()`` is called and ``wait(timeout)`` breaks the connection on timeout, so
polling pending receives does not work on gloo; a blocking any-source receive in a thread does:
docs/platform.md, "torch.distributed on CPU (gloo)".)

Liveness: each worker's heartbeat thread increments a counter in the rendezvous store every
``heartbeat_s``; a worker whose counter has not moved for ``dead_after_s`` is declared dead,
the SSP gate stops waiting for it and the run finishes with the others; the report names it,
when, and its last handled push. (torchrun's agent ends every local process when one fails,
so a worker death under torchrun ends the job; the death tests start the processes
themselves.)

Sharding the parameters over several server ranks (not done here) would split the flat vector
into contiguous ranges, one per server rank; a worker would pull and push each range to its
owner, each owner keeps its own version, and staleness becomes per shard.
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import signal
import struct
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from reference_impls.async_sgd.policies import FLOAT32_MAX, PolicyError, StalenessPolicy
from reference_impls.async_sgd.problem import Problem, ProblemConfig
from reference_impls.async_sgd.runlog import write_run
from reference_impls.async_sgd.server import ParameterServer, PushError, UpdateStatus

__all__ = ["ServerReport", "TrainConfig", "WorkerReport", "run_rank"]

TAG_HEADER, TAG_GRAD, TAG_REPLY, TAG_PARAMS = 11, 12, 13, 14
PULL, PUSH, BYE = 1, 2, 3
_STATUS_CODES = {s: i for i, s in enumerate(UpdateStatus)}
_STATUS_BY_CODE = dict(enumerate(UpdateStatus))
_HB_KEY = "async_sgd/heartbeat/"


def _f2i(x: float) -> int:
    value: int = struct.unpack("<q", struct.pack("<d", x))[0]  # the float's bits, for an int64
    return value


def _i2f(x: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<q", x))[0]
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One real run (the same object on every rank)."""

    policy: StalenessPolicy
    problem: ProblemConfig = ProblemConfig()
    lr: float = 0.5
    updates: int = 200
    """Applied updates after which the server stops the workers (counted from version 0: a
    resumed run continues to the same total)."""
    out_dir: str | None = None
    """Run directory for the staleness log, run.json and the checkpoint (None: none written)."""
    checkpoint_every: int = 0
    """Checkpoint every n applied updates (0: only at the end)."""
    resume: str | None = None
    """Server checkpoint to resume from."""
    stragglers: tuple[int, ...] = ()
    """Worker ranks made ``slowdown`` times slower: after each gradient they sleep
    ``(slowdown - 1) x`` their own previous iteration (pull + compute + push, without the
    sleep), so their whole iteration takes ``slowdown`` times as long."""
    slowdown: float = 3.0
    kill: tuple[int, int] | None = None
    """(rank, seq): that worker SIGKILLs itself instead of sending push ``seq``."""
    bad_push: tuple[int, int] | None = None
    """(rank, seq): that worker's push ``seq`` carries 3 extra elements (a wrong shape)."""
    heartbeat_s: float = 0.2
    dead_after_s: float = 5.0
    """A worker whose heartbeat has not moved this long is declared dead."""
    max_time_s: float = 300.0
    """The server stops the run after this long, whatever the version."""
    eval_every: int = 1
    """Full-data loss after every n-th applied update (0: never)."""
    progress_every: int = 0
    """Print a progress line every n applied updates (0: quiet)."""
    target_loss: float | None = None
    """Stop once an evaluated full-data loss is at or below this (needs ``eval_every``)."""

    def __post_init__(self) -> None:
        if isinstance(self.updates, bool) or not isinstance(self.updates, int) or self.updates < 1:
            raise ValueError(f"updates must be an int >= 1, got {self.updates!r}")
        # ``x > 0`` is True for inf: an infinite step or slowdown would be a NaN model or a
        # worker that sleeps forever, found only after the processes started.
        if not (math.isfinite(self.lr) and 0 < self.lr <= FLOAT32_MAX):
            raise ValueError(
                f"lr must be > 0, got {self.lr!r} (at most {FLOAT32_MAX:.4g}: a float32 step)"
            )
        if not (math.isfinite(self.slowdown) and self.slowdown >= 1):
            raise ValueError(f"slowdown must be >= 1, got {self.slowdown!r}")
        if not (0 < self.heartbeat_s < self.dead_after_s < math.inf):
            raise ValueError(
                f"need 0 < heartbeat_s < dead_after_s (finite), got {self.heartbeat_s} and "
                f"{self.dead_after_s}"
            )
        if not (math.isfinite(self.max_time_s) and self.max_time_s > 0):
            raise ValueError(f"max_time_s must be a finite number > 0, got {self.max_time_s!r}")
        if self.target_loss is not None and not math.isfinite(self.target_loss):
            raise ValueError(f"target_loss must be finite, got {self.target_loss!r}")
        if self.checkpoint_every < 0 or self.eval_every < 0 or self.progress_every < 0:
            raise ValueError("checkpoint_every, eval_every and progress_every must be >= 0")
        if self.target_loss is not None and not self.eval_every:
            raise ValueError("target_loss needs eval_every >= 1 (the loss must be evaluated)")
        if (self.checkpoint_every or self.resume) and not self.out_dir:
            raise ValueError("checkpoints need out_dir (where checkpoint.pt is written)")
        if self.resume and not Path(self.resume).is_file():
            raise FileNotFoundError(
                f"no checkpoint at {self.resume}: check the --resume path (it is checked before "
                "any process starts)"
            )


@dataclasses.dataclass
class WorkerReport:
    """What a worker saw: its pushes by the status the server replied with."""

    rank: int
    pushes: int = 0
    statuses: dict[str, int] = dataclasses.field(default_factory=dict)
    errors: list[str] = dataclasses.field(default_factory=list)
    compute_s: float = 0.0


@dataclasses.dataclass
class ServerReport:
    """What the server did (also written to run.json)."""

    version: int
    start_version: int
    counts: dict[str, int]
    per_worker: dict[int, dict[str, int]]
    deaths: list[dict[str, Any]]
    wall_s: float
    final_loss: float
    params: np.ndarray
    """Final parameters (a NumPy array: a torch tensor sent through a multiprocessing pipe
    travels as a shared-memory handle that dies with the sending process)."""
    checkpoint: str | None
    stop_reason: str
    error: str | None = None
    time_to_target_s: float | None = None
    """Seconds from the server's start until the target loss was reached (None: not reached)."""


def run_rank(rank: int, world_size: int, config: TrainConfig) -> ServerReport | WorkerReport:
    """The body of every rank (after ``init_process_group``): rank 0 serves, the others work."""
    if world_size < 2:
        raise ValueError(
            f"need a server and at least one worker (world size >= 2), got {world_size}"
        )
    if rank == 0:
        return _serve(world_size, config)
    return _work(rank, world_size, config)


# -- worker ------------------------------------------------------------------------------
def _heartbeat(store: Any, key: str, every: float, stop: threading.Event) -> None:
    while not stop.is_set():
        store.add(key, 1)
        stop.wait(every)


def _work(rank: int, world: int, config: TrainConfig) -> WorkerReport:
    problem = Problem(config.problem)
    dist.barrier()  # the server's clock starts when every rank has built its data and model
    store = dist.distributed_c10d._get_default_store()  # the rendezvous store every rank has
    stop = threading.Event()
    hb = threading.Thread(
        target=_heartbeat, args=(store, _HB_KEY + str(rank), config.heartbeat_s, stop), daemon=True
    )
    hb.start()
    report = WorkerReport(rank)
    header = torch.zeros(8, dtype=torch.int64)
    reply = torch.zeros(8, dtype=torch.int64)
    params = torch.empty(problem.numel)  # (P,)
    try:
        header[:] = torch.tensor([PULL, -1, 0, 0, 0, 0, 0, 0])
        dist.send(header, 0, tag=TAG_HEADER)
        seq = 0
        t_prev: float | None = None
        iteration: float | None = None
        slept = 0.0
        while True:
            dist.recv(reply, 0, tag=TAG_REPLY)
            stop_flag, version, clock, last_status, expected = (int(v) for v in reply[:5])
            if last_status >= 0:
                status = _STATUS_BY_CODE[last_status]
                report.statuses[status.value] = report.statuses.get(status.value, 0) + 1
                if status is UpdateStatus.REJECTED_BAD:
                    report.errors.append(
                        f"server rejected push {seq - 1}: expected a flat gradient of "
                        f"{expected} elements (nothing was applied)"
                    )
            if stop_flag:
                break
            dist.recv(params, 0, tag=TAG_PARAMS)
            t0 = time.perf_counter()
            if t_prev is not None:
                iteration = t0 - t_prev - slept  # pull + compute + push, without the sleep
            t_prev, slept = t0, 0.0
            grad, loss = problem.gradient(params, problem.batch_indices(rank - 1, world - 1, clock))
            spent = time.perf_counter() - t0
            if rank in config.stragglers:
                slept = (config.slowdown - 1.0) * (iteration if iteration is not None else spent)
                time.sleep(slept)
            report.compute_s += spent
            if config.kill == (rank, seq):
                os.kill(os.getpid(), signal.SIGKILL)
            if config.bad_push == (rank, seq):
                grad = torch.cat([grad, torch.zeros(3)])
            header[:] = torch.tensor([PUSH, seq, version, grad.numel(), _f2i(loss), 0, 0, 0])
            dist.send(header, 0, tag=TAG_HEADER)
            dist.send(grad.contiguous(), 0, tag=TAG_GRAD)
            report.pushes += 1
            seq += 1
        header[:] = torch.tensor([BYE, seq, 0, 0, 0, 0, 0, 0])
        dist.send(header, 0, tag=TAG_HEADER)
    finally:
        stop.set()
    return report


# -- server ------------------------------------------------------------------------------
def _receive(
    q: queue.Queue[tuple[int, torch.Tensor, torch.Tensor | None, str | None]],
    max_numel: int,
    workers: int,
) -> None:
    """Receiver thread: headers from any source, in arrival order, each push's gradient read
    from its sender right after its header. Ends after every worker said BYE."""
    byes = 0
    while byes < workers:
        header = torch.zeros(8, dtype=torch.int64)
        src = dist.recv(header, None, tag=TAG_HEADER)
        grad = None
        if int(header[0]) == PUSH:
            numel = int(header[3])
            if not 0 <= numel <= max_numel:
                # Cannot be read into a bounded buffer: the worker is cut off (declared dead).
                q.put((src, header, None, f"announced {numel} elements (limit {max_numel})"))
                continue
            grad = torch.empty(numel)
            dist.recv(grad, src, tag=TAG_GRAD)
        elif int(header[0]) == BYE:
            byes += 1
        q.put((src, header, grad, None))


def _serve(world: int, config: TrainConfig) -> ServerReport:
    problem = Problem(config.problem)
    dist.barrier()
    t_start = time.monotonic()
    workers = list(range(1, world))
    server = ParameterServer(
        problem.init_params, lr=config.lr, policy=config.policy, workers=workers
    )
    out = Path(config.out_dir) if config.out_dir else None
    ckpt = out / "checkpoint.pt" if out else None
    if config.resume:
        server.load(config.resume)
    start_version = server.version
    store = dist.distributed_c10d._get_default_store()
    q: queue.Queue[tuple[int, torch.Tensor, torch.Tensor | None, str | None]] = queue.Queue()
    threading.Thread(
        target=_receive, args=(q, 4 * problem.numel + 1024, len(workers)), daemon=True
    ).start()
    expected = problem.numel
    last_status: dict[int, int] = dict.fromkeys(workers, -1)
    blocked: set[int] = set()
    done: set[int] = set()  # said BYE
    hb_seen = {w: (-1, time.monotonic()) for w in workers}
    per_worker: dict[int, dict[str, int]] = {w: {} for w in workers}
    stopping = server.version >= config.updates
    stop_reason = "reached the number of updates" if stopping else ""
    error: str | None = None
    time_to_target: float | None = None
    next_hb_check = 0.0

    def now_s() -> float:
        return time.monotonic() - t_start

    def reply(w: int) -> None:
        stop = stopping or w not in server.alive
        head = torch.tensor(
            [int(stop), server.version, server.clocks[w], last_status[w], expected, 0, 0, 0],
            dtype=torch.int64,
        )
        last_status[w] = -1
        try:
            dist.send(head, w, tag=TAG_REPLY)
            if not stop:
                dist.send(server.params, w, tag=TAG_PARAMS)
        except RuntimeError as exc:  # gloo: "Connection closed by peer" -- the worker is gone
            server.mark_dead(w, now_s(), f"connection lost: {str(exc)[:200]}")

    def answer(w: int) -> None:
        if stopping or w not in server.alive or server.may_start(w):
            reply(w)
        else:
            blocked.add(w)

    def release() -> None:
        for w in sorted(blocked):
            if stopping or server.may_start(w):
                blocked.discard(w)
                reply(w)

    while len(done | (set(workers) - server.alive)) < len(workers):
        try:
            src, header, grad, problem_text = q.get(timeout=0.05)
        except queue.Empty:
            src = None
        if src is not None:
            kind, seq, v_pulled, numel = (int(x) for x in header[:4])
            if kind == PULL:
                answer(src)
            elif kind == BYE:
                done.add(src)
            elif kind == PUSH:
                loss = _i2f(int(header[4]))
                if src not in server.alive:
                    # declared dead (its heartbeat stalled) but still talking: log the push,
                    # apply nothing and tell it to stop, so that it is not left waiting
                    rec = server.reject_bad(
                        src,
                        seq,
                        v_pulled,
                        loss=loss,
                        time_s=now_s(),
                        detail=f"worker {src} was declared dead; its push was not applied",
                    )
                elif grad is None:
                    server.mark_dead(src, now_s(), f"protocol violation: {problem_text}")
                    rec = None
                elif grad.numel() != expected:
                    rec = server.reject_bad(
                        src,
                        seq,
                        v_pulled,
                        loss=loss,
                        time_s=now_s(),
                        detail=(
                            f"worker {src} pushed a gradient of {grad.numel()} elements; "
                            f"the model has {expected}"
                        ),
                    )
                else:
                    try:
                        rec = server.push(
                            src,
                            grad,
                            v_pulled,
                            seq=seq,
                            loss=loss,
                            time_s=now_s(),
                            stopped=stopping,
                        )
                    except PushError as exc:
                        rec = server.reject_bad(
                            src, seq, v_pulled, loss=loss, time_s=now_s(), detail=str(exc)
                        )
                    except PolicyError as exc:
                        error = f"{type(exc).__name__}: {exc}"
                        rec = server.reject_bad(
                            src, seq, v_pulled, loss=loss, time_s=now_s(), detail=error
                        )
                        stopping, stop_reason = True, "policy error"
                if rec is not None:
                    last_status[src] = _STATUS_CODES[rec.status]
                    counts = per_worker[src]
                    counts[rec.status.value] = counts.get(rec.status.value, 0) + 1
                    if rec.status is UpdateStatus.APPLIED:
                        v = server.version
                        if config.eval_every and v % config.eval_every == 0:
                            full = problem.full_loss(server.params)
                            server.set_server_loss(full)
                            if (
                                config.target_loss is not None
                                and full <= config.target_loss
                                and time_to_target is None
                            ):
                                time_to_target = now_s()
                                stopping, stop_reason = True, "reached the target loss"
                        if ckpt and config.checkpoint_every and v % config.checkpoint_every == 0:
                            server.save(ckpt)
                        if config.progress_every and v % config.progress_every == 0:
                            print(
                                f"[server] version {v}/{config.updates} s={rec.staleness} "
                                f"from worker {src} loss {rec.loss:.4f} t={now_s():.1f}s",
                                flush=True,
                            )
                        if v >= config.updates and not stopping:
                            stopping, stop_reason = True, "reached the number of updates"
                    answer(src)
        t = time.monotonic()
        if t >= next_hb_check:
            next_hb_check = t + config.heartbeat_s
            for w in sorted(server.alive - done):
                count = int(store.add(_HB_KEY + str(w), 0))
                if count != hb_seen[w][0]:
                    hb_seen[w] = (count, t)
                elif t - hb_seen[w][1] > config.dead_after_s:
                    death = server.mark_dead(
                        w, now_s(), f"no heartbeat for {t - hb_seen[w][1]:.1f} s"
                    )
                    blocked.discard(w)
                    if death:
                        print(
                            f"[server] worker {w} declared dead at t={death.time_s:.1f}s "
                            f"(version {death.version}, last push {death.last_seq}): "
                            f"{death.reason}",
                            flush=True,
                        )
            if not stopping and now_s() > config.max_time_s:
                stopping, stop_reason = True, f"time limit of {config.max_time_s:g} s"
        release()

    wall = now_s()
    if ckpt:
        server.save(ckpt)
    final_loss = problem.full_loss(server.params)
    report = ServerReport(
        version=server.version,
        start_version=start_version,
        counts=dict(server.counts),
        per_worker=per_worker,
        deaths=[dataclasses.asdict(d) for d in server.deaths],
        wall_s=wall,
        final_loss=final_loss,
        params=server.params.numpy().copy(),
        checkpoint=str(ckpt) if ckpt else None,
        stop_reason=stop_reason,
        error=error,
        time_to_target_s=time_to_target,
    )
    if out:
        write_run(
            out,
            server.log,
            {
                "mode": "gloo",
                "workers": len(workers),
                "updates": config.updates,
                "lr": config.lr,
                "policy": config.policy.describe(),
                "problem": dataclasses.asdict(config.problem),
                "stragglers": list(config.stragglers),
                "slowdown": config.slowdown,
                "counts": report.counts,
                "per_worker": {str(k): v for k, v in per_worker.items()},
                "deaths": report.deaths,
                "start_version": start_version,
                "version": server.version,
                "final_loss": final_loss,
                "time_unit": "s",
                "wall_s": wall,
                "stop_reason": stop_reason,
                "error": error,
                "checkpoint": report.checkpoint,
            },
        )
    return report
