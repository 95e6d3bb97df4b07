"""One base seed per run; every test's seed derived from it; determinism switches.

The base seed is printed in the run's header. A test's seed is a hash of the base seed and
its node id, so it does not depend on which other tests ran or in what order: rerunning one
failing test with the same base seed gives it the same seed it had in the full run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random
import re
import secrets
import sys

__all__ = [
    "CUBLAS_WORKSPACE_CONFIG",
    "node_seed",
    "enable_determinism",
    "new_base_seed",
    "parse_seed",
    "seed_everything",
]

SEED_BITS = 32
"""NumPy's legacy global seed takes at most 2**32 - 1; every RNG here accepts that range."""

CUBLAS_WORKSPACE_CONFIG = ":4096:8"
"""cuBLAS needs a fixed workspace for deterministic results (CUDA docs, "Results
reproducibility"); torch.use_deterministic_algorithms raises on CUDA >= 10.2 without it."""


_DECIMAL = re.compile(r"[0-9]+", re.ASCII)


def parse_seed(text: str) -> int:
    """The seed written in ``text``: plain ASCII decimal digits, in ``[0, 2**32)``.

    Stricter than ``int()``, which also takes ``" 7"``, ``"+7"``, ``"1_000"`` and non-ASCII
    digits: a seed is copied between a report, a shell and a CI config, and each of those
    forms reads differently in one of them. Raises ``ValueError`` naming the value.
    """
    if not isinstance(text, str) or not _DECIMAL.fullmatch(text):
        raise ValueError(f"a seed is a decimal integer in [0, 2**{SEED_BITS}), got {text!r}")
    # Compare lengths first: int() refuses strings of over 4300 digits with its own message.
    if len(text.lstrip("0")) > len(str(2**SEED_BITS)) or int(text) >= 2**SEED_BITS:
        raise ValueError(
            f"a seed must be in [0, 2**{SEED_BITS}) = [0, {2**SEED_BITS - 1}], got {text}"
        )
    return int(text)


def new_base_seed() -> int:
    """A fresh base seed for a run that was not given one."""
    return secrets.randbelow(2**SEED_BITS)


def node_seed(base_seed: int, nodeid: str) -> int:
    """The seed of one test: stable across processes and Python versions (no ``hash()``)."""
    digest = hashlib.sha256(f"{base_seed}:{nodeid}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (1 << SEED_BITS)


def seed_everything(seed: int) -> list[str]:
    """Seed Python's ``random``, NumPy's global RNG and torch (CPU and every CUDA device).

    NumPy is imported when installed: its global RNG starts from OS entropy, so an unseeded
    draw in a test that imports NumPy late would otherwise be nondeterministic. torch is seeded
    only when already imported (importing it costs over a second, and torch's default generator
    starts from a fixed seed anyway). Returns the names of what was seeded.
    """
    seeded = ["random"]
    random.seed(seed)
    if "numpy" in sys.modules or importlib.util.find_spec("numpy") is not None:
        import numpy

        numpy.random.seed(seed)
        seeded.append("numpy")
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "manual_seed"):
        torch.manual_seed(seed)  # also seeds every CUDA device's generator
        seeded.append("torch")
    return seeded


def enable_determinism() -> None:
    """Ask torch for deterministic kernels; ops without one raise instead of varying.

    Sets ``CUBLAS_WORKSPACE_CONFIG`` (kept if already set), ``torch.use_deterministic_algorithms``,
    cuDNN's deterministic flag and turns off cuDNN autotuning (which picks kernels by timing).
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    import torch

    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
