"""Which samples each (rank, DataLoader worker) reads in an epoch, and in what order.

Pure functions of the shard sample counts and (seed, epoch, rank, world size, worker, number
of workers): every process computes the same plan with no communication.

The epoch's **global order** is the shards in a per-epoch shuffled order (``seed``, ``epoch``)
with each shard's samples in stored order, concatenated: ``T`` samples, positions
``0..T-1``. Rank ``r`` of ``W`` takes the contiguous positions
``[r*T//W, (r+1)*T//W)``: the ranks partition the epoch, so every sample goes to exactly one
rank, and counts differ by at most one. Contiguous ranges keep each rank on whole shards
except at most two boundary shards, which it reads partly (a shard is never downloaded twice
by one rank).

**Equal lengths** (a rank with fewer batches than the others would hang in a collective):
``uneven="pad"`` gives every rank ``ceil(T/W)`` samples; a rank one short repeats its own
first sample(s), flagged ``__pad__ = True`` so a loss can mask them (fewer than ``W`` pad
samples per epoch in all). ``uneven="drop"`` gives every rank ``floor(T/W)``; a rank one over
leaves its last sample out (fewer than ``W`` samples dropped per epoch, different ones each
epoch because the order is reshuffled). Either way, over all ranks, every non-pad sample that
is read is read exactly once.

**DataLoader workers** split their rank's list the same way: worker ``k`` of ``K`` takes the
contiguous slice ``[k*L//K, (k+1)*L//K)`` of the rank's ``L`` items.

**Sample shuffle**: each worker's stream passes through a bounded shuffle buffer
(:class:`ShuffleSchedule`). Its choices depend only on positions, never on data, so the
schedule can be replayed without reading anything: that is how a resumed epoch finds the
exact samples not yet consumed and continues in the same order as an uninterrupted run.
"""

from __future__ import annotations

import bisect
import dataclasses
import random
from collections.abc import Iterator, Sequence
from typing import Literal, get_args

__all__ = [
    "Segment",
    "ShuffleSchedule",
    "epoch_shard_order",
    "plan_worker",
    "rank_length",
    "worker_lengths",
]

Uneven = Literal["pad", "drop"]
"""The policy for examples that do not divide evenly over the ranks (module docstring)."""
UNEVEN_POLICIES: tuple[str, ...] = get_args(Uneven)


@dataclasses.dataclass(frozen=True)
class Segment:
    """Samples ``[start, stop)`` of shard ``shard`` (an index into the manifest), read in
    order; ``pad``: they are repeats that equalise rank lengths."""

    shard: int
    start: int
    stop: int
    pad: bool = False

    def __len__(self) -> int:
        return self.stop - self.start


def _check(
    total: int, world_size: int, rank: int, num_workers: int, worker: int, uneven: Uneven
) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if not 0 <= worker < num_workers:
        raise ValueError(f"worker must be in [0, {num_workers}), got {worker}")
    if uneven not in UNEVEN_POLICIES:
        raise ValueError(f"uneven must be one of {UNEVEN_POLICIES}, got {uneven!r}")
    if total < 1:
        raise ValueError("the dataset has no samples: every shard in the manifest is empty")
    if uneven == "drop" and total < world_size:
        raise ValueError(
            f"uneven='drop' with {total} samples and world_size {world_size} gives every rank "
            "0 samples; use uneven='pad' or more data"
        )


def epoch_shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The epoch's shard order (indices into the manifest): same on every rank and worker."""
    order = list(range(num_shards))
    if shuffle:
        # Seeding with a string hashes it with SHA-512: stable across processes, platforms and
        # Python versions (unlike hash(), which PYTHONHASHSEED randomises).
        random.Random(f"shards/{seed}/{epoch}").shuffle(order)
    return order


def rank_length(total: int, world_size: int, uneven: Uneven = "pad") -> int:
    """Samples every rank yields in one epoch (the same for all ranks)."""
    return -(-total // world_size) if uneven == "pad" else total // world_size


def worker_lengths(rank_len: int, num_workers: int) -> list[int]:
    """Samples each of a rank's DataLoader workers yields."""
    return [
        (k + 1) * rank_len // num_workers - k * rank_len // num_workers for k in range(num_workers)
    ]


def _global_to_segments(
    order: Sequence[int], counts: Sequence[int], starts: Sequence[int], lo: int, hi: int, pad: bool
) -> list[Segment]:
    """Global positions ``[lo, hi)`` as per-shard segments (``starts``: prefix sums)."""
    out: list[Segment] = []
    pos = lo
    while pos < hi:
        i = bisect.bisect_right(starts, pos) - 1  # the order slot holding position pos
        while counts[order[i]] == 0:  # empty shards own no positions
            i += 1
        first = pos - starts[i]
        take = min(counts[order[i]] - first, hi - pos)
        out.append(Segment(order[i], first, first + take, pad))
        pos += take
    return out


def plan_worker(
    counts: Sequence[int],
    *,
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    worker: int = 0,
    num_workers: int = 1,
    uneven: Uneven = "pad",
    shuffle_shards: bool = True,
) -> list[Segment]:
    """The segments one worker of one rank reads this epoch, in reading order.

    ``counts``: samples per shard in manifest order. The result's total length is
    ``worker_lengths(rank_length(T, W, uneven), K)[worker]``.
    """
    total = sum(counts)
    _check(total, world_size, rank, num_workers, worker, uneven)
    order = epoch_shard_order(len(counts), seed, epoch, shuffle_shards)
    starts = [0]
    for i in order:
        starts.append(starts[-1] + counts[i])
    lo, hi = rank * total // world_size, (rank + 1) * total // world_size
    length = rank_length(total, world_size, uneven)
    # The rank's items as (global_lo, global_hi, pad) runs: its own range (cut for "drop"),
    # then repeats of its first samples for "pad" (wrapping at T when a rank has none).
    runs: list[tuple[int, int, bool]] = [(lo, min(hi, lo + length), False)]
    missing = length - (hi - lo)
    pad_from = lo
    while missing > 0:
        take = min(missing, total - pad_from % total)
        start = pad_from % total
        runs.append((start, start + take, True))
        missing -= take
        pad_from = start + take
    # This worker's slice [a, b) of the rank's items.
    a, b = worker * length // num_workers, (worker + 1) * length // num_workers
    segments: list[Segment] = []
    offset = 0
    for run_lo, run_hi, pad in runs:
        n = run_hi - run_lo
        s_lo, s_hi = max(a, offset), min(b, offset + n)
        if s_lo < s_hi:
            segments += _global_to_segments(
                order, counts, starts, run_lo + s_lo - offset, run_lo + s_hi - offset, pad
            )
        offset += n
    return segments


class ShuffleSchedule:
    """Output order of a bounded shuffle buffer over input positions ``0..n-1``.

    The buffer fills to ``buffer_size`` positions, then emits a uniformly chosen one and
    refills from the input: the classic streaming shuffle (webdataset's ``shuffle``), whose
    choices depend on positions only. ``buffer_size <= 1`` is no shuffle. Memory: the buffer,
    plus nothing per emitted position.

    ``pending()`` is what a resumed reader needs after some outputs were consumed: the
    positions still in the buffer and the next input position.
    """

    def __init__(self, n: int, buffer_size: int, key: str) -> None:
        if n < 0 or buffer_size < 0:
            raise ValueError(f"n and buffer_size must be >= 0, got {n} and {buffer_size}")
        self.n = n
        self.buffer_size = buffer_size
        self._rng = random.Random(f"samples/{key}")
        self._buf: list[int] = []
        self.next_input = 0
        self.emitted = 0

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        n, size, buf = self.n, self.buffer_size, self._buf
        if size <= 1:
            if self.next_input >= n:
                raise StopIteration
            self.next_input += 1
            self.emitted += 1
            return self.next_input - 1
        while len(buf) < size and self.next_input < n:
            buf.append(self.next_input)
            self.next_input += 1
        if not buf:
            raise StopIteration
        j = self._rng.randrange(len(buf))
        buf[j], buf[-1] = buf[-1], buf[j]
        self.emitted += 1
        return buf.pop()

    def advance(self, count: int) -> None:
        """Skip ``count`` outputs (already consumed) without reading any data."""
        if count > self.n - self.emitted:
            raise ValueError(
                f"cannot skip {count} samples: only {self.n - self.emitted} remain in this stream"
            )
        for _ in range(count):
            next(self)

    def pending(self) -> tuple[list[int], int]:
        """(positions in the buffer, next input position)."""
        return list(self._buf), self.next_input
