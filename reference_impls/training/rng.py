"""Capture and restore every RNG a training process draws from: Python, NumPy, torch, CUDA.

States are stored as tensors and plain scalars so that a checkpoint holding them still loads
with ``torch.load(weights_only=True)`` (a NumPy array or a Python tuple of 625 ints would
need full unpickling, or be slow to read).
"""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state", "seed_all"]


def seed_all(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global RNG and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # NumPy's legacy seed takes 32 bits
    torch.manual_seed(seed)


def capture_rng_state() -> dict[str, Any]:
    version, internal, gauss_next = random.getstate()  # internal: 624 words + position
    # The legacy tuple form (a dict only with legacy=False); keys: (624,) uint32.
    state = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    kind, keys, pos, has_gauss, cached = state
    cuda = []
    # Reading CUDA's state would initialize CUDA in a process that never used it.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = list(torch.cuda.get_rng_state_all())
    return {
        "python": {
            "version": version,
            "state": torch.tensor(internal, dtype=torch.int64),  # (625,)
            "gauss_next": gauss_next,
        },
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),  # (624,); int64 holds uint32
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),  # uint8 (5056,)
        "cuda": cuda,  # one uint8 tensor per device
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss_next"]))
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
