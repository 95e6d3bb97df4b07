"""The seed scenario: a training loop whose validation has uneven batch counts across ranks.

4 ranks, 35 validation samples split in contiguous shards as ``numpy.array_split`` does (9, 9,
9, 8), batches of 4: ranks 0-2 get 3 batches, rank 3 gets 2. Validation all-reduces a per-batch
metric and then the epoch totals, both shaped (2,): rank 3's epoch-end all-reduce silently
pairs with the others' third per-batch one (the metric comes back wrong), ranks 0-2 then wait
in their epoch-end all-reduce while rank 3 waits in the next epoch's barrier: a hang, whose
cause is one call earlier than where anything stops.

``fix`` picks one of the three repairs (docs/benchmarks/distributed_debug.md compares them):
``"pad"`` (PaddedEvenSampler: equal batch counts, padding weighted 0), ``"join"`` (the
per-batch all-reduce is a JoinableAllReduce under ``Join``), ``"hoist"`` (sum locally, one
all-reduce after the loop).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from reference_impls.distributed_debug.guards import JoinableAllReduce, PaddedEvenSampler

N_VAL = 35
BATCH = 4
TRAIN_STEPS = 3
FIXES = ("pad", "join", "hoist")


def shard(rank: int, world: int, n: int = N_VAL) -> list[int]:
    """The seed's split: contiguous shards whose sizes differ by at most one (the first
    ``n % world`` ranks get one more), as ``numpy.array_split`` cuts them."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return list(range(start, start + base + (1 if rank < extra else 0)))


def batches(indices: list[int], batch: int = BATCH) -> list[list[int]]:
    return [indices[i : i + batch] for i in range(0, len(indices), batch)]


def train(rank: int, steps: int = TRAIN_STEPS) -> torch.Tensor:
    w = torch.zeros(8, dtype=torch.float64)
    dist.broadcast(w, src=0)  # initial weights from rank 0
    for step in range(steps):
        grad = torch.full((8,), float(rank + step), dtype=torch.float64)
        dist.all_reduce(grad)  # gradient all-reduce
        w -= 0.1 * grad
    return w


def _loss(index: int) -> float:
    return float(index % 7) / 7.0


def validate(rank: int, world: int, fix: str | None = None) -> tuple[float, float]:
    """(mean loss over all samples, running mean of the per-batch metric) as every rank sees it."""
    if fix == "pad":
        sampler = PaddedEvenSampler(N_VAL, world, rank)
        idx, pad = sampler.indices, sampler.is_padding
    else:
        idx = shard(rank, world)
        pad = [False] * len(idx)
    totals = torch.zeros(2, dtype=torch.float64)  # (loss sum, samples)
    running = 0.0
    if fix == "join":
        from torch.distributed.algorithms.join import Join

        sync = JoinableAllReduce((2,), torch.float64)
        with Join([sync]):
            for b in batches(idx):
                metric = torch.tensor([sum(_loss(i) for i in b), len(b)], dtype=torch.float64)
                totals += metric
                sync(metric)  # per-batch metric (joinable)
                running = float(metric[0] / metric[1])
        dist.all_reduce(totals)  # epoch totals, under Join
        return float(totals[0] / totals[1]), running
    for start in range(0, len(idx), BATCH):
        b = idx[start : start + BATCH]
        weights = [0.0 if p else 1.0 for p in pad[start : start + BATCH]]
        metric = torch.tensor(
            [sum(w * _loss(i) for i, w in zip(b, weights, strict=True)), sum(weights)],
            dtype=torch.float64,
        )  # (2,): loss sum, samples of this batch
        totals += metric
        if fix != "hoist":
            dist.all_reduce(metric)  # per-batch metric
            running = float(metric[0] / metric[1])
    dist.all_reduce(totals)  # epoch totals
    if fix == "hoist":
        running = float(totals[0] / totals[1])
    return float(totals[0] / totals[1]), running


def run(
    rank: int, world: int, fix: str | None = None, epochs: int = 2
) -> list[tuple[float, float]]:
    """Train and validate ``epochs`` times; each epoch ends with a barrier."""
    if fix is not None and fix not in FIXES:
        raise ValueError(f"fix must be one of {FIXES} or None, got {fix!r}")
    out = []
    for _ in range(epochs):
        train(rank)
        out.append(validate(rank, world, fix))
        dist.barrier()  # end of epoch
    return out


def expected_mean(n: int = N_VAL) -> float:
    return sum(_loss(i) for i in range(n)) / n
