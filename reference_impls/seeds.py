"""Deriving seeds: one function turns a run's seed and labels into an independent seed.

Every reference implementation that needs a seed per rank, per worker, per step or per use
(data, dropout, a batch draw) derives it with :func:`mix_seed` instead of an ad-hoc formula
such as ``seed * 1_000_003 + rank``: arithmetic mixes collide (``(seed=1, rank=0)`` and
``(seed=0, rank=1_000_003)``) and neighbouring seeds give correlated streams in some
generators, while a hash gives unrelated seeds for any two label tuples. It is stable across
processes, machines and Python versions (no ``hash()``, which ``PYTHONHASHSEED`` randomises),
so a distributed run and its replay draw the same numbers.
"""

from __future__ import annotations

import hashlib

__all__ = ["mix_seed"]


def mix_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed from ``seed`` and the labels ``parts`` (ints and strings; their ``repr``
    is hashed, so ``1`` and ``"1"`` differ). 63 bits: every generator here accepts it
    (``torch.Generator.manual_seed`` takes up to 2**64 - 1, NumPy any non-negative int).

    >>> mix_seed(7, "rank", 0) == mix_seed(7, "rank", 0) != mix_seed(7, "rank", 1)
    True
    """
    digest = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
