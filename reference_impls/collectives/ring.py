"""Ring all-reduce on torch.distributed point-to-point (``batch_isend_irecv``): gloo and NCCL.

``ring_all_reduce(tensor, op="sum", group=None)`` reduces ``tensor`` in place across the ranks
of ``group`` with the schedule of :mod:`.schedule` (reduce-scatter, then all-gather, ring
``r -> r + 1``). It works on any backend that implements ``isend``/``irecv`` (gloo on CPU,
NCCL on CUDA), any world size and any number of elements (uneven chunks, empty ones too).

Segments. ``RingConfig(segments=S)`` cuts each chunk into S segments ("lanes"); lane s
carries segment s of every chunk through its own 2(N - 1) steps, and the lanes are
interleaved so that one lane's combine can run while the next lane's segments are on the
wire::

    issue lane 0 step 0, lane 1 step 0, ...
    for each step t, for each lane s: wait(s, t); combine(s, t); issue(s, t + 1)

On NCCL the transfers run on the process group's NCCL stream and the combines on the current
stream; ``Work.wait()`` only orders the streams (measured on torch 2.11: it returns in ~10 us
with 20 ms of GPU work queued ahead), and the NCCL stream waits for the combines issued before
each transfer. On gloo the transfers run on gloo's threads while this thread combines.
The default is one lane. Why more lanes did not pay on 2 x H200 was found with the bench's
GPU timelines (``--trace-calls``, docs/benchmarks/allreduce.md): torch's ``add_`` launches a
block per tile and, made ready at the same moment as the next lane's NCCL kernel, fills every
SM first, so the transfer waited for the combine and the lanes ran one after another. With
``combine_ctas`` (a Triton combine of a bounded number of persistent programs,
:mod:`.combine`) the combine and the transfer do overlap, but cutting a transfer in two also
halves NCCL's channels for it, which cost more than the overlap saved at every size measured;
one lane with NCCL's point-to-point chunk at 128 KiB (``NCCL_P2P_NVL_CHUNKSIZE=131072``: the
launcher's default; set it in the environment of other torchrun jobs) was fastest. On gloo the
difference was inside the noise of a shared 2-core machine.

Safety. Before any data moves, the ranks compare one small row of metadata (element count,
dtype, op, segments, device type) with one all-gather, and every rank raises
:class:`RingMismatchError` if any rank disagrees, instead of hanging in mismatched transfers.
The all-gather is posted asynchronously and the ring's state (geometry, receive buffers) is
built while it is on the wire. It uses CPU tensors when the group has a CPU backend (gloo, or
``"cpu:gloo,cuda:nccl"``), so it never synchronizes the GPU; on an NCCL-only group it costs one
device-to-host copy. It is not free: it lines the hosts up once per call, ~0.4-0.5 ms of host
time per call on the 2 x H200 machine (gloo over loopback), so an eager call is bound by the
host below ~256 MiB. ``check_metadata=False`` removes it where every rank is known to agree;
:class:`RingGraph` checks once and then replays without it. A peer that died or hung turns
into :class:`RingPeerError` after the timeout (``RingConfig.timeout_s``, else the process
group's own) instead of a hang.

Just over 500 lines: the entry point, the agreement check and the CUDA-graph replay all drive
the one ring algorithm at the bottom and share its piece geometry.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from reference_impls.collectives.schedule import (
    REDUCE_SCATTER,
    RING_SCHEDULE,
    chunk_bounds,
)

__all__ = [
    "DTYPES",
    "OPS",
    "RingConfig",
    "RingGraph",
    "RingMismatchError",
    "RingPeerError",
    "capture_graph",
    "ring_all_reduce",
]

OPS = ("sum", "mean", "max", "min")
# Dtypes the ring accepts; a row's position is its code in the metadata exchange.
DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
)
_MAGIC = 0x52494E47  # "RING": a peer in a different collective sends some other first row
_META_FIELDS = ("magic", "numel", "dtype", "op", "segments", "device")
_DEVICE_TYPES = ("cpu", "cuda")


class RingMismatchError(ValueError):
    """The ranks called ``ring_all_reduce`` with different sizes, dtypes, ops or segments.

    Raised on every rank of the group, after the metadata exchange, before any data moved.
    """


class RingPeerError(RuntimeError):
    """A peer did not answer: it died, hung, or is not calling ``ring_all_reduce``."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RingConfig:
    """How ``ring_all_reduce`` runs. Every rank of a group must use the same values (checked)."""

    segments: int = 1
    """Pieces each chunk is cut into, interleaved so that combines can overlap transfers (>= 1).
    1 by measurement: more lanes were slower on NCCL at every size (module docstring); on CUDA
    they overlap only with ``combine_ctas`` set."""
    timeout_s: float | None = None
    """Seconds to wait for each transfer and for the metadata exchange before raising
    :class:`RingPeerError`. None: the process group's timeout (``init_process_group(timeout=)``),
    enforced by gloo itself and by the NCCL watchdog. On NCCL a value here goes to
    ``Work.wait(timeout=)``, which may make the host wait for the GPU (version dependent; not
    measured here): prefer the group's timeout there."""
    check_metadata: bool = True
    """Exchange (numel, dtype, op, segments) before moving data, so a mismatch is an error on
    every rank instead of a hang. Turn off only where every rank is known to agree."""
    combine_ctas: int | None = None
    """CUDA only: combine received segments with :func:`.combine.combine_`, a Triton kernel of
    this many persistent programs, instead of torch's ``add_``/``maximum``/``minimum`` (which
    take as many thread blocks as there are tiles). None: torch's ops. CPU tensors always use
    torch's ops."""

    def __post_init__(self) -> None:
        if (
            not isinstance(self.segments, int)
            or isinstance(self.segments, bool)
            or self.segments < 1
        ):
            raise ValueError(f"segments must be an int >= 1, got {self.segments!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be None or > 0 seconds, got {self.timeout_s!r}")
        ctas = self.combine_ctas
        if ctas is not None and (not isinstance(ctas, int) or isinstance(ctas, bool) or ctas < 1):
            raise ValueError(f"combine_ctas must be None or an int >= 1, got {ctas!r}")


_DEFAULT_CONFIG = RingConfig()


def ring_all_reduce(
    tensor: torch.Tensor,
    op: str = "sum",
    group: dist.ProcessGroup | None = None,
    *,
    config: RingConfig | None = None,
) -> torch.Tensor:
    """Reduce ``tensor`` in place over every rank of ``group``; returns ``tensor``.

    Args:
        tensor: any shape, on the device the backend sends from (CPU for gloo, this rank's
            CUDA device for NCCL); one of :data:`DTYPES`. Non-contiguous tensors are reduced
            through a contiguous copy.
        op: ``"sum"``, ``"mean"`` (floating point only), ``"max"`` or ``"min"``.
        group: the process group (default: the world).
        config: :class:`RingConfig`; the same on every rank.

    Raises:
        RingMismatchError: the ranks disagree on numel, dtype, op or segments (every rank).
        ValueError: an unsupported dtype or op (every rank, when the metadata check is on).
        RingPeerError: a peer did not answer within the timeout, or its connection broke.
    """
    config = config or _DEFAULT_CONFIG
    if not dist.is_initialized():
        raise RuntimeError(
            "ring_all_reduce needs torch.distributed initialized: call "
            "dist.init_process_group(...) first (torchrun sets the environment for it)"
        )
    group = group if group is not None else dist.group.WORLD
    if group is None:
        raise ValueError(
            "Default process group has not been initialized: call init_process_group first"
        )
    n = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the group passed to ring_all_reduce")

    problem = _local_problem(tensor, op)
    segments = config.segments
    check = None
    if config.check_metadata and n > 1:
        check = _MetadataCheck(tensor, op, segments, group, rank, n, config.timeout_s)
    if problem is not None:
        if check is not None:
            check.finish(problem)  # every rank learns of it: raises
        raise ValueError(problem)
    if n == 1 or tensor.numel() == 0:
        if check is not None:
            check.finish(None)
        return tensor

    contiguous = tensor.is_contiguous()
    flat = tensor.contiguous().view(-1)  # (numel,): a view when contiguous, else a copy
    ring = _Ring(flat, op, group, rank, n, segments, config.timeout_s, config.combine_ctas)
    if check is not None:
        check.finish(None)  # the ring's state was built while the check was on the wire
    ring.run()
    if not contiguous:
        tensor.copy_(flat.view(tensor.shape))
    return tensor


def _local_problem(tensor: torch.Tensor, op: str) -> str | None:
    if op not in OPS:
        return f"op must be one of {', '.join(OPS)}; got {op!r}"
    if tensor.dtype not in DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        return f"ring_all_reduce supports dtypes {names}; got {tensor.dtype}"
    if op == "mean" and not tensor.dtype.is_floating_point:
        return (
            f"op='mean' needs a floating-point dtype, got {tensor.dtype}: the mean of integers "
            "is not an integer; reduce with op='sum' and divide, or cast to a float dtype first"
        )
    if tensor.device.type not in _DEVICE_TYPES:
        return f"ring_all_reduce runs on CPU (gloo) or CUDA (NCCL) tensors, got {tensor.device}"
    return None


def _metadata_device(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.device:
    """CPU when the group can all-gather CPU tensors (no GPU synchronization), else the tensor's."""
    if tensor.device.type == "cpu":
        return tensor.device
    backend = dist.get_backend_config(group)  # "cpu:gloo,cuda:nccl", "cuda:nccl", "gloo", ...
    if "cpu:" in backend or backend == "gloo":
        return torch.device("cpu")
    return tensor.device


# torch 2.13 renamed all_gather_into_tensor (deprecated there) to all_gather_single; the GPU
# machines run 2.11, which has only the old name.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class _MetadataCheck:
    """The cross-rank metadata check, started before the ring is prepared and finished after.

    One all-gather of every rank's row (F int64 fields) over the group, posted asynchronously so
    that building the ring's state overlaps it; :meth:`finish` waits for it and raises on every
    rank if any field differs (or this rank had a local problem).
    """

    def __init__(
        self,
        tensor: torch.Tensor,
        op: str,
        segments: int,
        group: dist.ProcessGroup,
        rank: int,
        n: int,
        timeout_s: float | None,
    ) -> None:
        self.row = [
            _MAGIC,
            tensor.numel(),
            DTYPES.index(tensor.dtype) if tensor.dtype in DTYPES else -1,
            OPS.index(op) if op in OPS else -1,
            segments,
            _DEVICE_TYPES.index(tensor.device.type) if tensor.device.type in _DEVICE_TYPES else -1,
        ]
        self.rank, self.n, self.timeout_s = rank, n, timeout_s
        device = _metadata_device(tensor, group)
        mine = torch.tensor(self.row, dtype=torch.int64, device=device)  # (F,)
        self.table = mine.new_empty(n * len(self.row))  # (N * F,): rank i's row at [i*F, (i+1)*F)
        try:
            self.work = _all_gather_single(self.table, mine, group=group, async_op=True)
        except RuntimeError as exc:
            raise self._peer_error(exc) from exc

    def _peer_error(self, exc: BaseException) -> RingPeerError:
        return RingPeerError(
            f"rank {self.rank} of {self.n}: the metadata exchange before the ring failed "
            f"({_timeout_text(self.timeout_s)}): {exc}. A peer died, hung, or is not calling "
            "ring_all_reduce at this point"
        )

    def finish(self, problem: str | None) -> None:
        try:
            _wait(self.work, self.timeout_s)
        except RuntimeError as exc:
            raise self._peer_error(exc) from exc
        table = self.table.view(
            self.n, len(self.row)
        ).tolist()  # N x F; a host sync on NCCL-only groups
        if problem is not None:
            raise ValueError(problem)
        disagreements = []
        for f, name in enumerate(_META_FIELDS):
            values = [r[f] for r in table]
            if len(set(values)) > 1:
                shown = ", ".join(f"rank {i}: {_describe(name, v)}" for i, v in enumerate(values))
                disagreements.append(f"{name} ({shown})")
        if disagreements:
            raise RingMismatchError(
                f"ring_all_reduce on rank {self.rank} of {self.n}: the ranks disagree on "
                + "; ".join(disagreements)
                + ". Every rank must pass a tensor with the same number of elements and dtype, "
                "the same op and the same RingConfig.segments"
            )


def _describe(field: str, value: int) -> str:
    if field == "dtype":
        return (
            str(DTYPES[value]).removeprefix("torch.") if 0 <= value < len(DTYPES) else "unsupported"
        )
    if field == "op":
        return repr(OPS[value]) if 0 <= value < len(OPS) else "unsupported"
    if field == "device":
        return _DEVICE_TYPES[value] if 0 <= value < len(_DEVICE_TYPES) else "unsupported"
    if field == "magic":
        return "ring_all_reduce" if value == _MAGIC else f"another collective ({value})"
    return str(value)


def _timeout_text(timeout_s: float | None) -> str:
    return f"timeout {timeout_s:g} s" if timeout_s is not None else "timeout: the process group's"


def _wait(work: dist.Work | None, timeout_s: float | None) -> None:
    if work is None:
        return
    if timeout_s is None:
        work.wait()
    else:
        work.wait(timeout=dt.timedelta(seconds=timeout_s))


def capture_graph(warmup: Callable[[], object], body: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """Run ``warmup`` on a side stream, then capture ``body`` in a new CUDA graph.

    The warm-up, as torch.cuda.graph's docs ask, creates lazily made state (NCCL streams, the
    allocator's blocks for this size) before capture; it should do what ``body`` does, on
    other memory if ``body``'s must not change.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warmup()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


class RingGraph:
    """``ring_all_reduce`` of one CUDA tensor captured in a CUDA graph; ``replay()`` re-runs it.

    Small all-reduces are bound by the host: each ``batch_isend_irecv`` costs tens of
    microseconds of Python and c10d work, 2(N - 1) of them per call, while 16 MiB cross NVLink
    in about as long. A captured ring replays every transfer and combine with one launch. The
    graph reads and writes ``tensor``'s memory: refill that tensor, then replay.

    Creating it is collective (every rank must create its graph with the same arguments): it
    runs the metadata check and a warm-up all-reduce on a copy, then captures. Replays skip
    the check (the shapes cannot change) and the per-call timeout (a captured wait cannot
    block the host); a dead peer is caught by the NCCL watchdog and the group's timeout.
    """

    def __init__(
        self,
        tensor: torch.Tensor,
        op: str = "sum",
        group: dist.ProcessGroup | None = None,
        *,
        config: RingConfig | None = None,
    ) -> None:
        config = config or _DEFAULT_CONFIG
        if tensor.device.type != "cuda":
            raise ValueError(f"RingGraph captures CUDA work; got a tensor on {tensor.device}")
        if not tensor.is_contiguous():
            raise ValueError(
                "RingGraph needs a contiguous tensor (the graph reduces its memory in place); "
                "pass tensor.contiguous() and copy the result back"
            )
        self.tensor = tensor
        probe = tensor.clone()
        ring_all_reduce(probe, op, group, config=config)  # checked: every rank agrees
        unchecked = dataclasses.replace(config, check_metadata=False, timeout_s=None)
        self.graph = None
        if dist.get_world_size(group) > 1 and tensor.numel() > 0:  # else there is nothing to run
            self.graph = capture_graph(
                lambda: ring_all_reduce(probe, op, group, config=unchecked),
                lambda: ring_all_reduce(tensor, op, group, config=unchecked),
            )

    def replay(self) -> torch.Tensor:
        if self.graph is not None:
            self.graph.replay()
        return self.tensor


_Pieces = tuple[tuple[tuple[int, int], ...], ...]


@functools.lru_cache(maxsize=256)
def _geometry(numel: int, n: int, segments: int) -> tuple[_Pieces, tuple[int, ...]]:
    """pieces[c][s] = (start, length) of segment s of chunk c; and each lane's largest length.

    Cached: a training loop reduces the same few sizes over and over.
    """
    chunks = chunk_bounds(numel, n).tolist()  # (N + 1,)
    pieces = []
    for c in range(n):
        seg = chunk_bounds(chunks[c + 1] - chunks[c], segments).tolist()  # (S + 1,)
        pieces.append(tuple((chunks[c] + seg[s], seg[s + 1] - seg[s]) for s in range(segments)))
    lane_sizes = tuple(max(pieces[c][s][1] for c in range(n)) for s in range(segments))
    return tuple(pieces), lane_sizes


class _Ring:
    """One ring all-reduce of a contiguous 1-D tensor: the lanes' schedule and state."""

    def __init__(
        self,
        flat: torch.Tensor,
        op: str,
        group: dist.ProcessGroup,
        rank: int,
        n: int,
        segments: int,
        timeout_s: float | None,
        combine_ctas: int | None = None,
    ) -> None:
        self.flat, self.op, self.group, self.rank, self.n = flat, op, group, rank, n
        self.timeout_s = timeout_s
        self.combine = None
        if combine_ctas is not None and flat.is_cuda:
            from reference_impls.collectives.combine import combine_  # Triton: imported on demand

            op_name = "sum" if op in ("sum", "mean") else op
            self.combine = lambda mine, incoming: combine_(mine, incoming, op_name, combine_ctas)
        self.next_peer = dist.get_global_rank(group, (rank + 1) % n)
        self.prev_peer = dist.get_global_rank(group, (rank - 1) % n)
        self.steps = RING_SCHEDULE.steps(n)
        self.pieces, lane_sizes = _geometry(flat.numel(), n, segments)
        # One receive buffer per lane, as large as that lane's largest segment: reused at every
        # reduce-scatter step (the transfer into it is issued after the combine that reads it).
        scratch = flat.new_empty(sum(lane_sizes))  # (sum of lanes,)
        self.scratch = list(torch.split(scratch, list(lane_sizes)))
        self.segments = segments

    def run(self) -> None:
        lanes = range(self.segments)
        pending = [self._issue(s, 0) for s in lanes]
        for t in range(len(self.steps)):
            for s in lanes:
                self._finish(s, t, pending[s])
                if t + 1 < len(self.steps):
                    pending[s] = self._issue(s, t + 1)

    def _pieces(self, s: int, t: int) -> tuple[str, int, tuple[int, int], tuple[int, int]]:
        phase, k = self.steps[t]
        send_chunk = int(RING_SCHEDULE.chunk_sent(phase, self.rank, k, self.n)) % self.n
        recv_chunk = (
            int(RING_SCHEDULE.chunk_sent(phase, (self.rank - 1) % self.n, k, self.n)) % self.n
        )
        return phase, k, self.pieces[send_chunk][s], self.pieces[recv_chunk][s]

    def _issue(self, s: int, t: int) -> Sequence[dist.Work]:
        phase, k, (send_at, send_len), (recv_at, recv_len) = self._pieces(s, t)
        ops = []
        # Receive first: gloo matches messages by (peer, tag) and a message that arrives before
        # its receive is posted takes a slow path (measured on gloo, 2 processes, 1 KiB: two
        # exchanges 0.73 ms posted receive-first, 7.2 ms send-first). A tag per lane keeps each
        # lane's messages in order. NCCL ignores both: a batch is one NCCL group.
        if recv_len:
            target = (
                self.scratch[s][:recv_len]
                if phase == REDUCE_SCATTER
                else self.flat[recv_at : recv_at + recv_len]
            )
            ops.append(dist.P2POp(dist.irecv, target, self.prev_peer, self.group, s))
        if send_len:
            piece = self.flat[send_at : send_at + send_len]
            ops.append(dist.P2POp(dist.isend, piece, self.next_peer, self.group, s))
        if not ops:
            return []
        try:
            works = dist.batch_isend_irecv(ops)
        except RuntimeError as exc:
            raise self._peer_error(phase, k, exc) from exc
        if not works and self.flat.is_cuda and torch.cuda.is_current_stream_capturing():
            # Without a Work nothing joins the NCCL stream back into the capture.
            raise RuntimeError(
                f"torch {torch.__version__}: batch_isend_irecv returned no Work during CUDA graph "
                "capture, so the ring cannot be captured here; use ring_all_reduce uncaptured"
            )
        return works

    def _finish(self, s: int, t: int, works: Sequence[dist.Work]) -> None:
        phase, k, _, (recv_at, recv_len) = self._pieces(s, t)
        try:
            for work in works:
                _wait(work, self.timeout_s)
        except RuntimeError as exc:
            raise self._peer_error(phase, k, exc) from exc
        if phase != REDUCE_SCATTER:
            return
        if recv_len:
            mine = self.flat[
                recv_at : recv_at + recv_len
            ]  # my copy of the received chunk's segment
            incoming = self.scratch[s][:recv_len]
            if self.combine is not None:
                self.combine(mine, incoming)
            elif self.op in ("sum", "mean"):
                mine.add_(incoming)
            elif self.op == "max":
                torch.maximum(mine, incoming, out=mine)
            else:
                torch.minimum(mine, incoming, out=mine)
        if k == self.n - 2 and self.op == "mean":
            # The chunk just completed is the one this rank owns: divide it once here, so the
            # all-gather spreads the mean and no rank divides the whole tensor.
            at, length = self.pieces[RING_SCHEDULE.owned_chunk(self.rank, self.n) % self.n][s]
            if length:
                self.flat[at : at + length].div_(self.n)

    def _peer_error(self, phase: str, k: int, exc: BaseException) -> RingPeerError:
        return RingPeerError(
            f"rank {self.rank} of {self.n}: the ring stopped at {phase.replace('_', '-')} step "
            f"{k} (sending to global rank {self.next_peer}, receiving from global rank "
            f"{self.prev_peer}; {_timeout_text(self.timeout_s)}): {exc}. A peer died, hung, or "
            "called a different collective"
        )
