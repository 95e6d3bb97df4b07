"""Synthetic regression data and a batch order that is a pure function of (seed, epoch, batch).

Because the order of an epoch is recomputed from the seed and the epoch number, the data
loader's position is just ``(epoch, batch)``: resuming in the middle of an epoch regenerates
the epoch's permutation and starts at that batch, without replaying the batches before it.
"""

from __future__ import annotations

import torch

from reference_impls.seeds import mix_seed
from reference_impls.training.config import ConfigError, DataConfig, ModelConfig

__all__ = ["BatchOrder", "SyntheticRegression", "make_datasets"]

_TEACHER_WIDTH = 16  # hidden width of the random teacher: enough for a non-linear target


class SyntheticRegression:
    """``y = tanh(x A) B + noise`` with a random teacher (A, B) fixed by the seed.

    ``x``: (N, in_features) standard normal; ``y``: (N, out_features).
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return self.x.shape[0]


def make_datasets(
    data: DataConfig, model: ModelConfig, seed: int
) -> tuple[SyntheticRegression, SyntheticRegression]:
    """(train, val): the same teacher, disjoint draws of x."""
    g = torch.Generator().manual_seed(mix_seed(seed, "data"))
    a = torch.randn(model.in_features, _TEACHER_WIDTH, generator=g)  # (in, 16)
    b = torch.randn(_TEACHER_WIDTH, model.out_features, generator=g)  # (16, out)
    b = b / _TEACHER_WIDTH**0.5  # unit-variance targets before the noise

    def draw(n: int) -> SyntheticRegression:
        x = torch.randn(n, model.in_features, generator=g)  # (n, in)
        y = torch.tanh(x @ a) @ b + data.noise * torch.randn(n, model.out_features, generator=g)
        return SyntheticRegression(x, y)  # y: (n, out)

    return draw(data.num_train), draw(data.num_val)


class BatchOrder:
    """Which examples each rank takes at each step of each epoch.

    Every epoch is a permutation of the training set drawn from ``(seed, epoch)``. Step ``b``
    of the epoch uses the global batch ``perm[b*B : (b+1)*B]`` (``B`` = the global batch size);
    rank ``r`` of ``W`` takes its ``r``-th contiguous slice of ``B/W`` examples. Every rank thus
    runs exactly ``steps_per_epoch`` steps, and the union of the ranks' batches is the batch a
    single process would take: a W-rank run follows the single-process run step for step.
    With ``drop_last=False`` the last batch is filled from the start of the permutation
    (as ``torch.utils.data.DistributedSampler`` pads), so it is full on every rank too.
    """

    def __init__(
        self,
        num_examples: int,
        batch_size: int,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
    ) -> None:
        if batch_size % world_size:
            raise ConfigError(
                f"data.batch_size is the global batch and must split evenly over the ranks: "
                f"{batch_size} is not divisible by world size {world_size}; use a multiple of "
                f"{world_size}"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        self.num_examples, self.batch_size = num_examples, batch_size
        self.seed, self.rank, self.world_size, self.drop_last = seed, rank, world_size, drop_last
        self.local_batch_size = batch_size // world_size
        full, rest = divmod(num_examples, batch_size)
        self.steps_per_epoch = full if drop_last or rest == 0 else full + 1
        self._cache: tuple[int, torch.Tensor] | None = None

    def permutation(self, epoch: int) -> torch.Tensor:
        if self._cache is None or self._cache[0] != epoch:
            g = torch.Generator().manual_seed(mix_seed(self.seed, "order", epoch))
            perm = torch.randperm(self.num_examples, generator=g)
            pad = self.steps_per_epoch * self.batch_size - self.num_examples
            if pad > 0:
                perm = torch.cat([perm, perm[:pad]])
            self._cache = (epoch, perm)
        return self._cache[1]

    def local_batch(self, epoch: int, batch: int) -> torch.Tensor:
        """Indices (local_batch_size,) this rank trains on at step ``batch`` of ``epoch``."""
        if not 0 <= batch < self.steps_per_epoch:
            raise IndexError(f"batch must be in [0, {self.steps_per_epoch}), got {batch}")
        start = batch * self.batch_size + self.rank * self.local_batch_size
        return self.permutation(epoch)[start : start + self.local_batch_size]

    def val_indices(self, num_val: int) -> torch.Tensor:
        """This rank's share of the validation set (strided; shares differ by at most one)."""
        return torch.arange(self.rank, num_val, self.world_size)
