"""Per-rank checks of ``ring_all_reduce``: run inside a group (``launch`` or ``torchrun``).

Each function has the launcher's signature ``fn(rank, world_size, ...)`` and returns plain
picklable values, so the suites, ``python -m reference_impls.collectives`` and the benchmark
all drive the same code and judge its results where they like.

Inputs are integer-valued (also in floating-point dtypes) and small enough that every partial
sum is exact for up to 8 ranks: any summation order then gives the same bits, so the ring and
``dist.all_reduce`` (which add in different orders) must agree *exactly*, and an indexing bug
cannot hide inside a float tolerance. :func:`make_input` is deterministic, so a checker can
rebuild every rank's input and compute the reference with NumPy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import os
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from reference_impls.collectives.ring import (
    RingConfig,
    RingMismatchError,
    RingPeerError,
    ring_all_reduce,
)
from reference_impls.seeds import mix_seed

__all__ = [
    "Case",
    "CaseResult",
    "compare_with_all_reduce",
    "graph_replays",
    "make_input",
    "mismatch_errors",
    "peer_exits",
    "SILENT_PEER_CAP_S",
    "peer_goes_silent",
    "self_check",
]

REDUCE_OP = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}
# Largest |value| per dtype such that 8 ranks' partial sums stay exact: bfloat16 holds
# integers exactly up to 256 (8 significant bits), int8/uint8 must not overflow.
_VALUE_BOUND = {"bfloat16": 15, "int8": 15, "uint8": 31}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    """One all-reduce to run on every rank."""

    numel: int
    dtype: str = "float32"
    op: str = "sum"
    segments: int = 1
    combine_ctas: int | None = None
    """:attr:`RingConfig.combine_ctas` (the Triton combine on CUDA; ignored on CPU)."""
    seed: int = 0
    integer_valued: bool = True
    """False: standard-normal floats (then the ring and dist.all_reduce differ by rounding)."""
    shape: tuple[int, ...] | None = None
    """Reshape the input to this (numel must match); None: 1-D."""
    strided: bool = False
    """Reduce a non-contiguous view (every other element of a buffer twice as long); the
    elements between must come back untouched."""

    @property
    def ring_config(self) -> RingConfig:
        return RingConfig(segments=self.segments, combine_ctas=self.combine_ctas)


@dataclasses.dataclass(frozen=True)
class CaseResult:
    case: Case
    equal: bool
    """The ring's result equals ``dist.all_reduce``'s bit for bit."""
    mismatched: int
    """Elements where they differ."""
    max_abs_diff: float
    digest: str
    """SHA-256 of the ring result's bytes: equal digests on every rank = identical results."""
    ring: np.ndarray | None
    """This rank's ring_all_reduce result (bfloat16 as float32); None above ``keep_arrays``."""
    reference: np.ndarray | None
    """This rank's dist.all_reduce result ("mean": SUM / world size), same conversion."""


def make_input(case: Case, rank: int) -> torch.Tensor:
    """Rank ``rank``'s CPU input for ``case``: deterministic in (seed, rank, numel, dtype)."""
    g = torch.Generator().manual_seed(mix_seed(case.seed, "input", rank, case.numel))
    dtype = getattr(torch, case.dtype)
    if case.integer_valued:
        bound = _VALUE_BOUND.get(case.dtype, 50)
        low = 0 if case.dtype == "uint8" else -bound
        x = torch.randint(low, bound + 1, (case.numel,), generator=g).to(dtype)
    else:
        x = torch.randn(case.numel, generator=g, dtype=torch.float64).to(dtype)
    return x.reshape(case.shape) if case.shape is not None else x


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def compare_with_all_reduce(
    rank: int, world_size: int, cases: list[Case], device: str = "cpu", keep_arrays: int = 1 << 16
) -> list[CaseResult]:
    """Run every case through ``ring_all_reduce`` and ``dist.all_reduce``; compare on the rank.

    ``device="cuda"`` puts the tensors on this rank's current CUDA device (NCCL groups). Both
    results come back as arrays for cases of at most ``keep_arrays`` elements (the rest only
    as a summary: shipping large arrays through pipes would cost more than the check).
    """
    dev = torch.device(device if device != "cuda" else f"cuda:{torch.cuda.current_device()}")
    results = []
    for case in cases:
        x = make_input(case, rank).to(dev)
        if case.strided:
            base = torch.full((2 * case.numel,), 7, dtype=x.dtype, device=dev)  # (2 numel,)
            ring = base[::2]  # (numel,), stride 2: not contiguous
            ring.copy_(x)
            ring_all_reduce(ring, case.op, config=case.ring_config)
            if not bool((base[1::2] == 7).all()):
                raise AssertionError(f"{case}: ring_all_reduce wrote between the view's elements")
        else:
            ring = x.clone()
            ring_all_reduce(ring, case.op, config=case.ring_config)
        ref = x.clone()
        dist.all_reduce(ref, op=getattr(dist.ReduceOp, REDUCE_OP[case.op]))
        if case.op == "mean":
            ref.div_(world_size)
        differ = ring != ref
        diff = (ring.double() - ref.double()).abs()
        ring_np = _numpy(ring)
        keep = case.numel <= keep_arrays
        results.append(
            CaseResult(
                case,
                equal=bool(torch.equal(ring, ref)),
                mismatched=int(differ.sum()),
                max_abs_diff=float(diff.max()) if case.numel else 0.0,
                digest=hashlib.sha256(ring_np.tobytes()).hexdigest(),
                ring=ring_np if keep else None,
                reference=_numpy(ref) if keep else None,
            )
        )
    return results


def self_check(
    rank: int, world_size: int, cases: list[Case], device: str = "cpu", keep_arrays: int = 1 << 16
) -> dict[str, object]:
    """:func:`compare_with_all_reduce` then :func:`mismatch_errors`, in one group."""
    return {
        "cases": compare_with_all_reduce(rank, world_size, cases, device, keep_arrays),
        "mismatch": mismatch_errors(rank, world_size, device),
    }


def mismatch_errors(rank: int, world_size: int, device: str = "cpu") -> dict[str, Any]:
    """Call ``ring_all_reduce`` with arguments that differ between ranks; return what was raised.

    Returns {scenario: (exception type name, message)} plus ``"after"``: the result of a
    correct call made afterwards, which shows that every rank left each failed call at the
    same point (none is stuck in a transfer its peers never started).
    """
    # Every rank finishes joining the group first: a rank that fails at once (a bad
    # ``device``) and exits could otherwise close its sockets while a slower peer is still
    # connecting, and that peer would fail with a connection error instead of its own.
    dist.barrier()
    dev = torch.device(device if device != "cuda" else f"cuda:{torch.cuda.current_device()}")
    last = world_size - 1
    scenarios = {
        # name: (numel, dtype, op, segments) on this rank
        "numel": (99 if rank == last else 100, torch.float32, "sum", 1),
        "dtype": (100, torch.float64 if rank == 0 else torch.float32, "sum", 1),
        "op": (100, torch.float32, "max" if rank == last else "sum", 1),
        "segments": (100, torch.float32, "sum", 2 if rank == 0 else 1),
        "unsupported dtype": (100, torch.bool if rank == 0 else torch.float32, "sum", 1),
    }
    out: dict[str, tuple[str, str] | object] = {}
    for name, (numel, dtype, op, segments) in scenarios.items():
        x = torch.ones(numel, dtype=dtype, device=dev)
        try:
            ring_all_reduce(x, op, config=RingConfig(segments=segments))
            out[name] = ("no error", "")
        except (RingMismatchError, ValueError) as exc:
            out[name] = (type(exc).__name__, str(exc))
    x = torch.full((10,), float(rank + 1), device=dev)
    out["after"] = _numpy(ring_all_reduce(x))
    return out


SILENT_PEER_CAP_S = 120.0
"""How long a silent peer of :func:`peer_goes_silent` waits at most for rank 0 to let it go."""

_SILENT_PEER_RELEASED = "checks/silent-peer-released"


def peer_goes_silent(
    rank: int, world_size: int, timeout_s: float, check_metadata: bool
) -> tuple[str, str, float] | None:
    """Every rank but 0 stays alive without calling the ring; rank 0 must get an error in time.

    The silent ranks wait, on the rendezvous store (not on the ring's connections), until rank
    0 has its answer, so the error rank 0 gets can only come from its own timeout: no peer
    closes its socket first, however slowly a loaded machine runs rank 0. Without a working
    timeout they give up after :data:`SILENT_PEER_CAP_S` and exit, and rank 0 then fails on
    the closed connection, about that long after it started.

    Returns, on rank 0, (exception type name, message, seconds until it was raised).
    """
    store = dist.distributed_c10d._get_default_store()
    if rank != 0:
        # Alive but silent: a hung peer, not a closed socket. A DistStoreError (a
        # RuntimeError) means the cap passed without rank 0 getting its answer.
        with contextlib.suppress(RuntimeError):
            store.wait([_SILENT_PEER_RELEASED], dt.timedelta(seconds=SILENT_PEER_CAP_S))
        return None
    start = time.perf_counter()
    try:
        ring_all_reduce(
            torch.ones(1000), config=RingConfig(timeout_s=timeout_s, check_metadata=check_metadata)
        )
    except RingPeerError as exc:
        result = type(exc).__name__, str(exc), time.perf_counter() - start
    else:
        result = "no error", "", time.perf_counter() - start
    store.set(_SILENT_PEER_RELEASED, "1")
    return result


def peer_exits(rank: int, world_size: int) -> tuple[str, str, float]:
    """Rank 1 exits at once; rank 0's ring must fail with RingPeerError, not hang."""
    # Every rank joins the group first: gloo connects its full mesh as ranks arrive, and a
    # rank 1 that exited while rank 0 was still connecting made rank 0's set-up fail instead
    # of its ring (seen on a loaded 2-core runner), which is not the failure under test.
    dist.barrier()
    if rank == 1:
        os._exit(3)
    if rank != 0:
        time.sleep(2)  # the others stay out of the way
        return ("bystander", "", 0.0)
    start = time.perf_counter()
    try:
        ring_all_reduce(torch.ones(1000))
    except RingPeerError as exc:
        return type(exc).__name__, str(exc), time.perf_counter() - start
    return "no error", "", time.perf_counter() - start


def graph_replays(
    rank: int, world_size: int, case: Case, replays: int = 3
) -> list[tuple[bool, bool]]:
    """Capture a :class:`RingGraph` of ``case`` on this rank's GPU and replay it ``replays`` times.

    Before each replay the captured tensor is refilled with this rank's input; returns, per
    replay, (equal to ``dist.all_reduce``, equal to the uncaptured ``ring_all_reduce``).
    """
    from reference_impls.collectives.ring import RingGraph

    dev = torch.device("cuda", torch.cuda.current_device())
    x = make_input(case, rank).to(dev)
    reference = x.clone()
    dist.all_reduce(reference, op=getattr(dist.ReduceOp, REDUCE_OP[case.op]))
    if case.op == "mean":
        reference.div_(world_size)
    eager = ring_all_reduce(x.clone(), case.op, config=case.ring_config)
    buf = torch.empty_like(x)
    graph = RingGraph(buf, case.op, config=case.ring_config)
    out = []
    for _ in range(replays):
        buf.copy_(x)
        graph.replay()
        out.append((bool(torch.equal(buf, reference)), bool(torch.equal(buf, eager))))
    torch.cuda.synchronize()
    return out
