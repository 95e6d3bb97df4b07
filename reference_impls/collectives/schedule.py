"""The ring all-reduce schedule and its cost model, shared by the simulation and the real ring.

Ring all-reduce (Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 2009; the algorithm behind NCCL's ring and Baidu's ``ring-allreduce``) on
N workers arranged in a ring ``i -> (i + 1) % N``. Each worker's array is cut into N chunks.

1. Reduce-scatter, N - 1 steps: at step k worker r sends chunk ``(r - k) % N`` to its next
   neighbour, which **combines** it into its own copy of that chunk. After the last step
   worker r holds chunk ``(r + 1) % N`` reduced over all N workers.
2. All-gather, N - 1 steps: at step k worker r sends chunk ``(r + 1 - k) % N``, which the
   next neighbour **overwrites** its copy with. Afterwards every worker holds every reduced
   chunk, bit-identical everywhere (copies, not recomputations).

Each worker sends 2(N - 1) messages of about 1/N of the array: 2(N - 1)/N of the array in
all, independent of N, which is why nccl-tests reports *bus bandwidth*
``busbw = algbw * 2(N - 1)/N`` (algbw = array bytes / time): the rate each link carried.

Chunks follow ``numpy.array_split``: the first ``length % N`` chunks hold one element more.
A length smaller than N leaves some chunks empty; nothing is padded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "ALL_GATHER",
    "REDUCE_SCATTER",
    "RING_SCHEDULE",
    "RingCost",
    "RingSchedule",
    "bus_bandwidth_factor",
    "chunk_bounds",
    "ring_cost",
]

REDUCE_SCATTER = "reduce_scatter"
ALL_GATHER = "all_gather"

# A chunk rule maps (ranks, phase-local step, world size) to the chunk index each rank
# *sends* at that step. ``ranks`` may be an int or an integer ndarray (the simulation moves
# every worker's message of a step at once).
ChunkRule = Callable[[Any, int, int], Any]


def _reduce_scatter_chunk(ranks, step: int, n: int):
    return (ranks - step) % n


def _all_gather_chunk(ranks, step: int, n: int):
    # After reduce-scatter, rank r owns chunk (r + 1) % n: it starts the all-gather with it.
    return (ranks + 1 - step) % n


@dataclasses.dataclass(frozen=True, kw_only=True)
class RingSchedule:
    """Which chunk each worker sends at each step, and how its receiver combines it.

    :data:`RING_SCHEDULE` is the correct one; the simulation and the real ring both read their
    chunk indices from it. Other instances exist to show that the suites catch broken
    schedules (an all-gather that adds instead of overwriting, a chunk index off by a step).
    """

    reduce_scatter_chunk: ChunkRule = _reduce_scatter_chunk
    """Chunk sent by rank r at reduce-scatter step k (0 <= k < N - 1)."""
    all_gather_chunk: ChunkRule = _all_gather_chunk
    """Chunk sent by rank r at all-gather step k (0 <= k < N - 1)."""
    all_gather_overwrites: bool = True
    """The all-gather receiver replaces its copy (True) or combines into it like the
    reduce-scatter does (False, a classic bug: with ``sum`` it double-counts)."""

    def owned_chunk(self, rank: int, n: int) -> int:
        """The chunk rank holds fully reduced after the reduce-scatter (the first it gathers)."""
        return int(self.all_gather_chunk(rank, 0, n))

    def steps(self, n: int) -> list[tuple[str, int]]:
        """(phase, phase-local step) for the 2(N - 1) steps in order; global step = index."""
        return [(REDUCE_SCATTER, k) for k in range(n - 1)] + [(ALL_GATHER, k) for k in range(n - 1)]

    def chunk_sent(self, phase: str, ranks, step: int, n: int):
        rule = self.reduce_scatter_chunk if phase == REDUCE_SCATTER else self.all_gather_chunk
        return rule(ranks, step, n)


RING_SCHEDULE = RingSchedule()


def chunk_bounds(length: int, n: int) -> np.ndarray:
    """Offsets (n + 1,) of ``numpy.array_split``'s n pieces of ``range(length)``.

    Chunk c is ``[bounds[c], bounds[c + 1])``; sizes differ by at most one element.
    """
    if n < 1:
        raise ValueError(f"the number of chunks must be >= 1, got {n}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    q, rem = divmod(length, n)
    sizes = np.full(n, q, dtype=np.int64)
    sizes[:rem] += 1
    bounds = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    return bounds


@dataclasses.dataclass(frozen=True)
class RingCost:
    """What one ring all-reduce of ``numel`` elements of ``itemsize`` bytes costs each worker."""

    world_size: int
    numel: int
    itemsize: int
    messages_per_worker: int
    """2(N - 1): every step sends exactly one message (empty when its chunk is)."""
    bytes_sent: tuple[int, ...]
    """Exact bytes each worker sends: every chunk but ``(r + 1) % N`` during the
    reduce-scatter and every chunk but ``(r + 2) % N`` during the all-gather."""

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def approx_bytes_per_worker(self) -> float:
        """The textbook 2(N - 1)/N of the array; the exact count is within 2 elements of it."""
        return bus_bandwidth_factor(self.world_size) * self.nbytes


def ring_cost(world_size: int, numel: int, itemsize: int) -> RingCost:
    """The cost model of :data:`RING_SCHEDULE` for ``world_size`` workers."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    sizes = np.diff(chunk_bounds(numel, world_size))
    n = world_size
    sent = tuple(
        int(2 * numel - sizes[(r + 1) % n] - sizes[(r + 2) % n]) * itemsize for r in range(n)
    )
    return RingCost(n, numel, itemsize, 2 * (n - 1), sent)


def bus_bandwidth_factor(world_size: int) -> float:
    """nccl-tests' all-reduce factor 2(n - 1)/n: busbw = algbw * factor (0 for one worker)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return 2 * (world_size - 1) / world_size
