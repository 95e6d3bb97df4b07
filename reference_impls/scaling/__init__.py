"""Scaling investigation for data-parallel training: why N GPUs do not give N times the speed.

- :mod:`~reference_impls.scaling.profiler`: :class:`StepProfiler` times the phases of each step
  per rank (host clock on CPU, CUDA events on GPU): a context manager per phase for any loop, a
  timed DDP communication hook, and :class:`TrainerBreakdown`, a callback for the training
  loop's ``Trainer``. One ~200-byte JSON line per step per rank.
- :mod:`~reference_impls.scaling.breakdown`: the records and their attribution: data wait,
  forward, backward, optimizer, communication *transfer* vs *waiting for the slowest rank*,
  overlapped vs exposed, other; the parts add up to the step.
- :mod:`~reference_impls.scaling.stragglers`: per-rank relative and individual scores, the rank
  that makes the others wait, hardware homogeneity and oversubscription checks.
- :mod:`~reference_impls.scaling.transport`: what NCCL picked (P2P/NVLink, SHM, NET/IB,
  Socket) from its ``NCCL_DEBUG=INFO`` log, with a warning on a fallback.
- :mod:`~reference_impls.scaling.costmodel`: the ring all-reduce's alpha-beta cost plus measured
  compute, projected to 8, 64, 512 GPUs, with and without overlap and bucketing.
- :mod:`~reference_impls.scaling.investigate`: ``python -m reference_impls.scaling investigate
  --world-sizes 1,2`` runs it all and writes ``report.md``, ``scaling.json`` and plots.
- :mod:`~reference_impls.scaling.ddp`: the DDP step-timing driver at 1..N GPUs (formerly
  ``reference_impls.training.scaling``).

docs/benchmarks/scaling.md has the measurements and the "2x instead of 8x" walk-through.
Nothing here imports pytest or ``harness``.
"""

from reference_impls.scaling.breakdown import (
    PARTS,
    AttributedStep,
    Part,
    StepRecord,
    attribute,
    attribute_steps,
    mean_parts,
)
from reference_impls.scaling.costmodel import (
    Interconnect,
    Prediction,
    Workload,
    fit_alpha_beta,
    fit_compute,
    project,
    ring_allreduce_s,
)
from reference_impls.scaling.profiler import PHASES, StepProfiler, TrainerBreakdown
from reference_impls.scaling.stragglers import (
    RankScore,
    homogeneity_problems,
    host_facts,
    straggler_scores,
)
from reference_impls.scaling.transport import Transport, TransportReport, parse_nccl_log

__all__ = [
    "PARTS",
    "PHASES",
    "AttributedStep",
    "Interconnect",
    "Part",
    "Prediction",
    "RankScore",
    "StepProfiler",
    "StepRecord",
    "TrainerBreakdown",
    "Transport",
    "TransportReport",
    "Workload",
    "attribute",
    "attribute_steps",
    "fit_alpha_beta",
    "fit_compute",
    "homogeneity_problems",
    "host_facts",
    "mean_parts",
    "parse_nccl_log",
    "project",
    "ring_allreduce_s",
    "straggler_scores",
]
