"""Start N processes that form a torch.distributed group, run a function in each, collect results.

For tests and benchmarks on one machine; production runs use ``torchrun`` (its rendezvous
spans nodes). Nothing home-made stands in for torch.distributed: this only starts processes
and hands them a ``TCPStore``::

    results = launch(fn, "arg", config=LaunchConfig(world_size=3))  # [fn(0, 3, "arg"), ...]

* Rendezvous: the parent opens a ``TCPStore`` on port 0 (the kernel picks a free port), so
  parallel launches never collide and no port is guessed.
* ``fn(rank, world_size, *args)`` runs after ``init_process_group``; it must be importable by
  name (a module-level function) and its arguments and return value picklable.
* Finite everything: a rank that raises, exits without a result, or outlives
  ``timeout_s`` ends the launch with :class:`LaunchError`, which names each failed rank with
  its traceback and keeps the results of the others; surviving ranks are killed after a short
  grace period, never left to hang the caller.
* NCCL: ``backend="cpu:gloo,cuda:nccl"`` (or ``"nccl"``) gives rank r the GPU ``r % count``,
  with NVLink multicast off and NCCL's point-to-point chunk tuned (:data:`NCCL_DEFAULT_ENV`) unless
  the environment says otherwise.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import importlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "MULTICAST_OFF_ENV",
    "NCCL_DEFAULT_ENV",
    "LaunchConfig",
    "LaunchError",
    "RankFailure",
    "apply_nccl_defaults",
    "launch",
]

_BACKENDS = ("gloo", "nccl", "cpu:gloo,cuda:nccl")
# NVLink multicast off in NCCL, torch symmetric memory and NVSHMEM: on shared GPU hosts a
# program that uses it can put the host's GPUs out of service. NCCL ranks get these unless
# the environment already says otherwise.
MULTICAST_OFF_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
# What every NCCL rank started here (and by this package's torchrun entry points) gets unless the
# environment says otherwise: multicast off, and NCCL's NVLink point-to-point chunk at 128 KiB
# instead of 512 KiB. NCCL gives a send or receive one more channel each time its bytes per channel
# exceed 32 chunks, so the smaller chunk lets a 128 MiB transfer use 32 channels instead of 16:
# on 2 x H200 that took the ring from 0.88x to 1.01x NCCL's all_reduce at 256 MiB, with NCCL's
# own all_reduce unchanged (docs/benchmarks/allreduce.md). NCCL reads it once per process.
NCCL_DEFAULT_ENV = {**MULTICAST_OFF_ENV, "NCCL_P2P_NVL_CHUNKSIZE": "131072"}


def apply_nccl_defaults() -> None:
    """Set :data:`NCCL_DEFAULT_ENV` in this process's environment where it is not set yet
    (before NCCL starts: it reads them once)."""
    for key, value in NCCL_DEFAULT_ENV.items():
        os.environ.setdefault(key, value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """How :func:`launch` starts the group."""

    world_size: int
    """Number of processes (>= 1)."""
    backend: str = "gloo"
    """``"gloo"`` (CPU), ``"nccl"`` or ``"cpu:gloo,cuda:nccl"`` (CUDA, with a gloo side for
    CPU tensors: ``ring_all_reduce``'s metadata check then never synchronizes the GPU)."""
    timeout_s: float = 120.0
    """Wall-clock limit for the whole launch, process start included."""
    pg_timeout_s: float = 60.0
    """``init_process_group(timeout=)``: how long any collective may wait for a peer."""
    grace_s: float = 5.0
    """After a rank fails, how long the others get to finish before they are killed."""
    start_method: str = "forkserver"
    """``"forkserver"`` (torch is imported once by the server; each rank forks from it) or
    ``"spawn"`` (each rank imports torch itself: slower, nothing shared)."""
    threads_per_rank: int | None = 1
    """``torch.set_num_threads`` in each rank. 1, as torchrun does: when ranks x threads exceed
    the cores, each rank's spinning OpenMP threads starve the others' communication threads
    (measured with gloo, 2 ranks on 2 cores, 1 MiB ring all-reduce: 20 ms per call with torch's
    default threads, 3.9 ms with 1). None: torch's default."""
    host: str = "127.0.0.1"
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Extra environment variables for the ranks (set before torch.distributed starts)."""

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {self.world_size!r}")
        if self.backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(_BACKENDS)}; got {self.backend!r}")
        for name in ("timeout_s", "pg_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if self.threads_per_rank is not None and self.threads_per_rank < 1:
            raise ValueError(
                f"threads_per_rank must be None or >= 1, got {self.threads_per_rank!r}"
            )
        if not self.grace_s >= 0:
            raise ValueError(f"grace_s must be >= 0 seconds, got {self.grace_s!r}")
        if self.start_method not in ("forkserver", "spawn"):
            raise ValueError(
                f"start_method must be 'forkserver' or 'spawn', got {self.start_method!r} "
                "('fork' is unsafe once torch has started threads)"
            )


@dataclasses.dataclass(frozen=True)
class RankFailure:
    """Why one rank produced no result."""

    rank: int
    kind: str
    """``"raised"``, ``"exited"`` (no result, with ``exitcode``) or ``"timeout"`` (killed)."""
    error_type: str
    message: str
    traceback: str = ""
    exitcode: int | None = None


class LaunchError(RuntimeError):
    """Some ranks failed; ``failures`` says why, ``results`` holds the other ranks' values."""

    def __init__(self, failures: dict[int, RankFailure], results: dict[int, Any], world_size: int):
        self.failures = failures
        self.results = results
        lines = [f"{len(failures)} of {world_size} ranks failed:"]
        for f in failures.values():
            lines.append(f"  rank {f.rank}: {f.kind}: {f.error_type}: {f.message}")
        for f in failures.values():
            if f.traceback:
                lines.append(f"--- rank {f.rank} traceback ---\n{f.traceback.rstrip()}")
        super().__init__("\n".join(lines))


def launch(fn: Callable[..., Any], *args: Any, config: LaunchConfig) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``config.world_size`` processes; results by rank.

    Raises:
        LaunchError: a rank raised, exited without a result, or ran past ``timeout_s``.
    """
    import torch.distributed as dist

    payload = pickle.dumps((_import_name(fn), args))  # args must pickle: fail here, not in a rank
    ctx = multiprocessing.get_context(config.start_method)
    if config.start_method == "forkserver":
        # The server imports torch once; each rank then forks from it in milliseconds.
        ctx.set_forkserver_preload(["torch", "torch.distributed", __name__])
    store = dist.TCPStore(  # type: ignore[attr-defined]  # exported by torch, not declared
        config.host,
        0,  # the kernel picks a free port
        None,
        True,
        timeout=dt.timedelta(seconds=config.timeout_s),
        wait_for_workers=False,
    )
    n = config.world_size
    readers, procs = [], []
    try:
        for rank in range(n):
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(  # type: ignore[attr-defined]  # a context has Process
                target=_rank_main,
                args=(rank, config, store.port, payload, writer, list(sys.path)),
                name=f"rank{rank}",
                daemon=True,
            )
            proc.start()
            writer.close()  # the child holds the only write end: EOF means it is gone
            readers.append(reader)
            procs.append(proc)
        return _collect(readers, procs, config)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10)
        for reader in readers:
            reader.close()
        del store


def _import_name(fn: Callable[..., Any]) -> tuple[str, str]:
    """(module, qualname) under which a rank can import ``fn``.

    A function of a module run with ``python -m pkg.mod`` has ``__module__ == "__main__"``;
    the ranks import it under its real name ``pkg.mod`` instead.
    """
    module, qualname = fn.__module__, fn.__qualname__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        if spec is None:
            raise ValueError(
                f"launch cannot hand {qualname} to the ranks: it is defined in a script run as "
                "__main__; move it into a module, or run the script with python -m"
            )
        module = spec.name
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"launch needs a module-level function the ranks can import, got {module}.{qualname}"
        )
    return module, qualname


def _collect(readers, procs, config: LaunchConfig) -> list[Any]:
    n = config.world_size
    results: dict[int, Any] = {}
    failures: dict[int, RankFailure] = {}
    deadline = time.monotonic() + config.timeout_s
    open_ranks = set(range(n))
    while open_ranks:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready = multiprocessing.connection.wait([readers[r] for r in open_ranks], remaining)
        for conn in ready:
            assert isinstance(conn, multiprocessing.connection.Connection)  # wait() on pipes
            rank = readers.index(conn)
            open_ranks.discard(rank)
            try:
                status, value = conn.recv()
            except (EOFError, OSError):
                procs[rank].join(timeout=5)
                code = procs[rank].exitcode
                failures[rank] = RankFailure(
                    rank,
                    "exited",
                    "ProcessExit",
                    f"exited with code {code} without a result",
                    exitcode=code,
                )
                deadline = min(deadline, time.monotonic() + config.grace_s)
                continue
            if status == "ok":
                results[rank] = value
            else:
                error_type, message, tb = value
                failures[rank] = RankFailure(rank, "raised", error_type, message, tb)
                deadline = min(deadline, time.monotonic() + config.grace_s)
    for rank in sorted(open_ranks):
        failures[rank] = RankFailure(
            rank,
            "timeout",
            "TimeoutError",
            f"no result within the launch's time limit (timeout_s={config.timeout_s:g}, "
            f"grace_s={config.grace_s:g} after the first failure); killed",
        )
    if failures:
        raise LaunchError(dict(sorted(failures.items())), results, n)
    return [results[r] for r in range(n)]


def _rank_main(rank: int, config: LaunchConfig, port: int, payload: bytes, conn, sys_path) -> None:
    """Entry point of one rank: join the group, run fn, send ("ok", value) or ("error", ...)."""
    sys.path[:] = sys_path  # fn may live in a module found through the parent's sys.path
    os.environ.update(config.env)
    if "nccl" in config.backend:
        apply_nccl_defaults()
    if config.host == "127.0.0.1" and sys.platform == "linux":
        # Every rank is on this machine: gloo over the loopback device. Measured on 2 x H200
        # (2 ranks): the ring's per-call metadata exchange, and with it an eager 1 KiB ring
        # all-reduce, 1015 -> 849 us per call.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        import torch
        import torch.distributed as dist

        if config.threads_per_rank is not None:
            torch.set_num_threads(config.threads_per_rank)
        (module, qualname), args = pickle.loads(payload)
        fn: Callable[..., Any] = functools.reduce(
            getattr, qualname.split("."), importlib.import_module(module)
        )  # type: ignore[assignment]  # a module's attribute chain ends at the function
        store = dist.TCPStore(  # type: ignore[attr-defined]
            config.host, port, None, False, timeout=dt.timedelta(seconds=config.timeout_s)
        )
        kwargs: dict[str, Any] = {}
        if "nccl" in config.backend:
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
            kwargs["device_id"] = device
        dist.init_process_group(
            config.backend,
            store=store,
            rank=rank,
            world_size=config.world_size,
            timeout=dt.timedelta(seconds=config.pg_timeout_s),
            **kwargs,
        )
        value = fn(rank, config.world_size, *args)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        conn.send(("error", (type(exc).__name__, str(exc), traceback.format_exc())))
        conn.close()
        # No teardown: a group whose peer failed can hang in destroy_process_group.
        os._exit(1)
    conn.send(("ok", value))
    conn.close()
    dist.destroy_process_group()
