"""The few torch.distributed operations the loop needs, and a no-op stand-in for one process.

Launch with ``torchrun`` (it sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous);
nothing here creates processes or transports itself.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DistContext", "init_from_env"]


def init_from_env(device: str) -> bool:
    """Join the process group ``torchrun`` describes (gloo on CPU, NCCL on CUDA).

    Returns True when this call initialized it (the caller then destroys it), False in a single
    process (no ``WORLD_SIZE`` above 1) or when the group already exists.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if device == "cuda" else "gloo")
    return True


@dataclasses.dataclass(frozen=True)
class DistContext:
    """This process's place in the run; every collective is a no-op when ``world_size == 1``."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def current(cls) -> DistContext:
        if dist.is_available() and dist.is_initialized():
            local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
            return cls(dist.get_rank(), dist.get_world_size(), local)
        return cls()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (makes a decision identical everywhere)."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_objects(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (in rank order); None on the other ranks."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()
