"""Guards against the commonest desync: ranks with different numbers of batches.

* :func:`check_equal_steps` at the top of a loop: one small all-reduce (min and max of the
  count in one tensor); on disagreement one all-gather names every rank's count, and every rank
  raises :class:`UnevenStepsError` instead of hanging later.
* :class:`PaddedEvenSampler`: every rank gets ceil(N / world) indices; the few padding
  positions repeat real samples and are flagged, so a metric can weight them 0 and stay exact.
* :class:`JoinableAllReduce`: an all-reduce inside a loop that works under
  ``torch.distributed.algorithms.Join`` (ranks that ran out of data shadow it with zeros).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

__all__ = ["JoinableAllReduce", "PaddedEvenSampler", "UnevenStepsError", "check_equal_steps"]


class UnevenStepsError(RuntimeError):
    """Ranks disagree on how many steps a loop will take (the loop's collectives would desync)."""


def _device(group: dist.ProcessGroup | None) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_equal_steps(
    n: int, group: dist.ProcessGroup | None = None, *, what: str = "steps"
) -> None:
    """Raise :class:`UnevenStepsError` on every rank unless all ranks of ``group`` pass the
    same ``n``.

    Call it before a loop whose body has collectives (validation with a per-batch metric
    all-reduce): a rank with fewer batches would otherwise pair its next collective with the
    others' extra ones, silently, and hang later.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be a non-negative int (the number of {what}), got {n!r}")
    device = _device(group)
    t = torch.tensor([n, -n], dtype=torch.int64, device=device)  # (2,): min(n), -max(n)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    low, high = int(t[0]), -int(t[1])
    if low == high:
        return
    world = dist.get_world_size(group)
    counts = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([n], dtype=torch.int64, device=device), group=group)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
    by_count: dict[int, list[int]] = {}
    for rank, c in zip(ranks, counts, strict=True):
        by_count.setdefault(int(c), []).append(rank)
    listing = "; ".join(f"{what} {c}: ranks {rs}" for c, rs in sorted(by_count.items()))
    raise UnevenStepsError(
        f"the ranks disagree on the number of {what} ({listing}); a loop with collectives would "
        "desync and hang. Fix: give every rank the same count (PaddedEvenSampler, or drop the "
        "remainder), shadow the loop's collectives with Join (JoinableAllReduce), or move the "
        "collective out of the loop"
    )


class PaddedEvenSampler(torch.utils.data.Sampler[int]):
    """Rank ``rank`` of ``world`` gets positions ``rank, rank + world, ...`` of the dataset
    padded to a multiple of ``world``: every rank the same length, ceil(N / world).

    ``is_padding[i]`` says whether the i-th index this rank yields is padding (a repeat of an
    early sample, at most world - 1 of them in total): weight those 0 in metrics.
    """

    def __init__(self, length: int, world: int, rank: int) -> None:
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, {world}), got {rank}")
        self.length, self.world, self.rank = length, world, rank
        self.per_rank = math.ceil(length / world)
        positions = range(rank, self.per_rank * world, world)
        self.indices = [p % length for p in positions]
        self.is_padding = [p >= length for p in positions]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.per_rank


class JoinableAllReduce(Joinable):
    """``x = sync(x)`` all-reduces (sum) inside a ``with Join([sync]):`` loop; a rank that has
    run out of batches joins and shadows each remaining call with zeros of ``shape``.

    Cost: Join adds one small all-reduce per iteration (who is still running) on top of the
    loop's own.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype = torch.float64,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.shape, self.dtype, self.group = shape, dtype, group
        self._device = _device(group)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        Join.notify_join_context(self)
        dist.all_reduce(t, group=self.group)
        return t

    def join_hook(self, **kwargs: object) -> JoinHook:
        sync = self

        class _Shadow(JoinHook):
            def main_hook(self) -> None:
                dist.all_reduce(
                    torch.zeros(sync.shape, dtype=sync.dtype, device=sync._device), group=sync.group
                )

        return _Shadow()

    @property
    def join_device(self) -> torch.device:
        return self._device

    @property
    def join_process_group(self) -> dist.ProcessGroup:
        return self.group if self.group is not None else dist.group.WORLD  # type: ignore[return-value]
