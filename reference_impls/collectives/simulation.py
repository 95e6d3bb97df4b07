"""An exact NumPy simulation of ring all-reduce: every message, every combine, no processes.

``simulate_ring_allreduce(arrays, op)`` runs the two phases of :mod:`.schedule` on one array
per worker and returns a new array per worker; the inputs are never changed. All messages of
a step move at once (each is read from the state at the start of the step), the way the real
ring's concurrent sends and receives do. Optionally every message is logged.

Layout: the N workers' arrays are gathered once into a chunk-major buffer ``buf`` of shape
(N workers, N chunks, C) with C the largest chunk size; a step is then one gather and one
scatter over all workers. Slots past a chunk's real size hold zeros that only ever combine
with other padding and are dropped when the results are read out: they never reach a result.

Integer sums are exact or refused, never wrapped silently. NumPy's integer additions wrap
modulo 2**bits, as the real ring's (and NCCL's) do, so a partial sum may wrap on its way round
the ring and the result is still the true sum whenever the true sum fits the dtype (modular
addition does not depend on the order). When it does not fit, the ring would hand every
worker a wrapped number: :func:`simulate_ring_allreduce` raises ``ValueError`` naming the
element, its true sum and the dtype's range instead. max and min cannot overflow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from reference_impls.collectives.schedule import (
    REDUCE_SCATTER,
    RING_SCHEDULE,
    RingSchedule,
    chunk_bounds,
)

__all__ = ["OPS", "Message", "simulate_ring_allreduce"]

# The reduction a receiver applies during the reduce-scatter. "mean" sums, then the owner of
# each reduced chunk divides it by N once (as the real ring does) before the all-gather.
_COMBINE = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}
OPS = tuple(_COMBINE)


@dataclasses.dataclass(frozen=True)
class Message:
    """One message of the ring: ``sender`` sent chunk ``chunk`` (``nbytes`` bytes) to
    ``receiver`` at global step ``step`` (0 .. 2(N-1) - 1; the first N - 1 are the
    reduce-scatter)."""

    step: int
    phase: str
    sender: int
    receiver: int
    chunk: int
    nbytes: int


def simulate_ring_allreduce(
    arrays: Sequence[np.ndarray],
    op: str = "sum",
    *,
    message_log: list[Message] | None = None,
    schedule: RingSchedule = RING_SCHEDULE,
) -> list[np.ndarray]:
    """All-reduce ``arrays`` (one per worker) with a simulated ring; a new array per worker.

    Args:
        arrays: N >= 1 arrays of one shape and dtype (integer or floating point).
        op: ``"sum"``, ``"mean"`` (floating point only), ``"max"`` or ``"min"``.
        message_log: if given, every message is appended to it in send order, empty ones too
            (a chunk is empty when the array has fewer elements than workers).
        schedule: the chunk rules; only the suites pass anything but the correct one.

    Raises:
        ValueError: no arrays, mismatched shapes or dtypes, an unsupported dtype or op, or an
            integer ``"sum"`` whose true value does not fit the dtype somewhere (it would wrap).
    """
    if len(arrays) == 0:
        raise ValueError("simulate_ring_allreduce needs at least one worker's array, got none")
    inputs = [np.asarray(a) for a in arrays]
    shape, dtype = inputs[0].shape, inputs[0].dtype
    for w, a in enumerate(inputs):
        if a.shape != shape or a.dtype != dtype:
            raise ValueError(
                f"every worker must hold an array of the same shape and dtype: worker 0 has "
                f"{shape} {dtype}, worker {w} has {a.shape} {a.dtype}"
            )
    if op not in _COMBINE:
        raise ValueError(f"op must be one of {', '.join(OPS)}; got {op!r}")
    if not (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)):
        raise ValueError(f"dtype must be an integer or floating-point type, got {dtype}")
    if op == "mean" and not np.issubdtype(dtype, np.floating):
        raise ValueError(
            f"op='mean' needs a floating-point dtype, got {dtype}: the mean of integers is not "
            "an integer; reduce with op='sum' and divide, or cast to a float dtype first"
        )

    if op == "sum" and np.issubdtype(dtype, np.integer):
        _check_integer_sum_fits(inputs, dtype)

    n = len(inputs)
    length = int(np.prod(shape, dtype=np.int64))
    combine = _COMBINE[op]
    bounds = chunk_bounds(length, n)
    sizes = np.diff(bounds)  # (N,)
    q, rem = divmod(length, n)
    width = q + (rem > 0)  # C, the largest chunk
    split = rem * (q + 1)  # elements in the first ``rem`` (larger) chunks

    # Chunk-major copy: chunk c of worker w is buf[w, c, :sizes[c]]. The first ``rem`` chunks
    # hold q + 1 elements and the rest q, so each worker's array is two reshapes, not a gather.
    buf = np.zeros((n, n, width), dtype=dtype)  # (N workers, N chunks, C)
    for w, a in enumerate(inputs):
        a = a.reshape(-1)
        buf[w, :rem, :width] = a[:split].reshape(rem, width)
        buf[w, rem:, :q] = a[split:].reshape(n - rem, q)

    ranks = np.arange(n)
    receivers = (ranks + 1) % n
    for step, (phase, k) in enumerate(schedule.steps(n)):
        chunks = np.asarray(schedule.chunk_sent(phase, ranks, k, n)) % n  # (N,) per sender
        incoming = buf[ranks, chunks]  # (N, C): read before any write (simultaneous sends)
        if phase == REDUCE_SCATTER or not schedule.all_gather_overwrites:
            buf[receivers, chunks] = combine(buf[receivers, chunks], incoming)
        else:
            buf[receivers, chunks] = incoming
        if phase == REDUCE_SCATTER and k == n - 2 and op == "mean":
            _divide_owned_chunks(buf, schedule, n)
        if message_log is not None:
            itemsize = dtype.itemsize
            message_log.extend(
                Message(step, phase, int(s), int(d), int(c), int(sizes[c]) * itemsize)
                for s, d, c in zip(ranks, receivers, chunks, strict=True)
            )

    results = []
    for w in range(n):
        out = np.empty(length, dtype=dtype)
        out[:split] = buf[w, :rem, :width].reshape(-1)
        out[split:] = buf[w, rem:, :q].reshape(-1)
        results.append(out.reshape(shape))
    return results


def _check_integer_sum_fits(inputs: list[np.ndarray], dtype: np.dtype) -> None:
    """Raise ValueError unless every element's true sum over the workers fits ``dtype``."""
    info = np.iinfo(dtype)
    if inputs[0].size == 0:
        return
    # Cheap bound first (Python ints cannot overflow): the sums of the workers' extremes.
    low = sum(int(a.min()) for a in inputs)
    high = sum(int(a.max()) for a in inputs)
    if info.min <= low and high <= info.max:
        return
    # Exact per-element sums: int64 holds any sum of up to 2**31 values of 32 bits or fewer;
    # 64-bit values are summed as Python ints (slow, and only reached near the range's edge).
    wide = np.dtype(np.int64) if dtype.itemsize < 8 else np.dtype(object)
    total = np.zeros(inputs[0].shape, dtype=wide)
    for a in inputs:
        total += a.astype(wide)
    bad = (total < info.min) | (total > info.max)
    count = int(np.count_nonzero(bad))
    if count == 0:
        return
    first = int(np.flatnonzero(bad.reshape(-1))[0])
    where = np.unravel_index(first, inputs[0].shape)
    raise ValueError(
        f"op='sum' over {len(inputs)} workers overflows {dtype}: element {tuple(map(int, where))} "
        f"sums to {total[where]}, outside [{info.min}, {info.max}] ({count} of {total.size} "
        f"elements overflow). The ring would give every worker a value wrapped modulo "
        f"2**{info.bits}: {_wider(int(total.min()), int(total.max()))}"
    )


def _wider(low: int, high: int) -> str:
    """What to use instead, for the message: the smallest signed integer type holding
    [low, high], else floating point."""
    for bits in (16, 32, 64):
        if -(2 ** (bits - 1)) <= low and high < 2 ** (bits - 1):
            return f"use a wider dtype (int{bits} holds these sums) or a floating-point one"
    return "no 64-bit integer dtype holds these sums: use a floating-point dtype"


def _divide_owned_chunks(buf: np.ndarray, schedule: RingSchedule, n: int) -> None:
    """Each worker divides the chunk it owns after the reduce-scatter by N, in place."""
    for w in range(n):
        c = schedule.owned_chunk(w, n) % n
        buf[w, c] = buf[w, c] / buf.dtype.type(n)
