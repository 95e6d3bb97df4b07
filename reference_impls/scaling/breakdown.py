"""Per-rank step breakdown: what each rank measured locally, and what the ranks together say.

A rank measures, for every step, its wall time and the time spent in each phase
(:class:`StepRecord`): data wait, forward, backward compute, optimizer, *exposed*
communication (time blocked in collectives while nothing else of the step ran) and
communication *overlapped* with backward compute (hidden, reported on the side). Whatever the
phases do not cover is ``other`` (host work between phases: logging, ``zero_grad``, Python).

A rank cannot tell alone whether its exposed communication was the transfer or waiting for a
slower rank: a rank whose peer is 5 ms late sits 5 ms longer in the all-reduce. Together they
can. A collective completes for everyone at about the same moment, so the rank that arrived
last waited for nobody: its exposed communication is the transfer. :func:`attribute` takes, per
step, ``transfer = min over ranks of exposed communication`` and ``waiting_r = exposed_r -
transfer``. No clocks are compared across ranks (they may live on different hosts), and no
collective is added to the step: the split is made afterwards from the records.

The parts of an :class:`AttributedStep` add up to its wall time exactly (``other`` is the
remainder, never negative because the phases are measured one after another on one clock).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

__all__ = [
    "PARTS",
    "AttributedStep",
    "Part",
    "StepRecord",
    "attribute",
    "attribute_steps",
    "mean_parts",
]


class Part(StrEnum):
    """The parts a step is split into (values are the JSON keys)."""

    DATA = "data"
    """Blocked on the data loader (the time ``next(loader)`` and host-to-device copies took)."""
    FORWARD = "forward"
    BACKWARD = "backward"
    """Backward compute only (communication it waited for at its end is not in here)."""
    OPTIMIZER = "optimizer"
    COMM_TRANSFER = "comm_transfer"
    """Exposed communication that every rank paid: moving the bytes."""
    COMM_WAIT = "comm_wait"
    """Exposed communication beyond the transfer: waiting for the slowest rank to arrive."""
    OTHER = "other"
    """The rest of the step: host work between the phases, logging, idle."""


PARTS: tuple[Part, ...] = tuple(Part)
_COMPUTE = (Part.FORWARD, Part.BACKWARD, Part.OPTIMIZER)
_JSON_LINE = (
    '{"step":%d,"rank":%d,"wall":%.6f,"data":%.6f,"forward":%.6f,"backward":%.6f,'
    '"optimizer":%.6f,"comm":%.6f,"comm_overlapped":%.6f,"comm_bytes":%d,"start":%.6f}'
)
# A phase sum may exceed the wall time by clock rounding only: 1 us (perf_counter resolution
# is far finer; CUDA events resolve ~0.5 us).
_SLACK_S = 1e-6


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__, which
# triples the cost of making one record per step; nothing here changes a record once made.
@dataclasses.dataclass(slots=True, kw_only=True)
class StepRecord:
    """One rank's own measurements of one step, in seconds.

    ``data + forward + backward + optimizer + comm <= wall``; ``comm_overlapped`` is not part
    of that sum (it ran during ``backward``).
    """

    step: int
    rank: int
    wall: float
    data: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    optimizer: float = 0.0
    comm: float = 0.0
    """Exposed communication: blocked in collectives (arrival skew and transfer together)."""
    comm_overlapped: float = 0.0
    """Communication that ran while backward still computed (hidden)."""
    comm_bytes: int = 0
    """Bytes this rank handed to collectives in the step (gradient buckets)."""
    start: float = 0.0
    """The step's start on this host's monotonic clock (for lining up ranks of one host)."""

    def __post_init__(self) -> None:
        # Plain comparisons, no loop over dataclasses.fields(): this runs once per step.
        for name, v in (
            ("wall", self.wall),
            ("data", self.data),
            ("forward", self.forward),
            ("backward", self.backward),
            ("optimizer", self.optimizer),
            ("comm", self.comm),
            ("comm_overlapped", self.comm_overlapped),
        ):
            if not (v >= 0 and v < math.inf):  # also False for NaN
                raise ValueError(f"StepRecord.{name} must be a finite number >= 0 s, got {v!r}")
        used = self.measured
        if used > self.wall + _SLACK_S:
            raise ValueError(
                f"step {self.step} rank {self.rank}: the phases add up to {used * 1e3:.4f} ms, "
                f"more than the step's wall time {self.wall * 1e3:.4f} ms; phases must not "
                "overlap (communication overlapped with backward goes in comm_overlapped)"
            )

    @property
    def measured(self) -> float:
        """Seconds covered by the phases (everything but ``other``)."""
        return self.data + self.forward + self.backward + self.optimizer + self.comm

    @property
    def compute(self) -> float:
        return self.forward + self.backward + self.optimizer

    @property
    def other(self) -> float:
        return max(0.0, self.wall - self.measured)

    def to_json(self) -> str:
        """One line, microsecond resolution: ~200 bytes (the bound is 1 KB per step per rank).

        Formatted by hand: ``json.dumps`` of a dict costs ~35 us, most of the profiler's
        per-step budget; this ~3 us."""
        return _JSON_LINE % (
            self.step,
            self.rank,
            self.wall,
            self.data,
            self.forward,
            self.backward,
            self.optimizer,
            self.comm,
            self.comm_overlapped,
            self.comm_bytes,
            self.start,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(
                f"unknown StepRecord field(s) {sorted(unknown)}; known: {sorted(known)}"
            )
        return cls(**dict(data))


@dataclasses.dataclass(frozen=True, slots=True)
class AttributedStep:
    """One rank's step split into :data:`PARTS`, after looking at every rank's records."""

    step: int
    rank: int
    wall: float
    parts: dict[Part, float]
    comm_overlapped: float

    def share(self, part: Part) -> float:
        return self.parts[part] / self.wall if self.wall > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "rank": self.rank,
            "wall": self.wall,
            "comm_overlapped": self.comm_overlapped,
            **{str(p): v for p, v in self.parts.items()},
        }


def attribute(step_records: Sequence[StepRecord]) -> list[AttributedStep]:
    """Split one step's records (one per rank) into parts; see the module docstring.

    Raises:
        ValueError: records of different steps, or a rank twice.
    """
    if not step_records:
        return []
    steps = {r.step for r in step_records}
    if len(steps) != 1:
        raise ValueError(f"attribute() takes the records of one step, got steps {sorted(steps)}")
    ranks = [r.rank for r in step_records]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"step {step_records[0].step}: a rank appears twice in {sorted(ranks)}")
    transfer = min(r.comm for r in step_records)  # the last to arrive waited for nobody
    out = []
    for r in sorted(step_records, key=lambda r: r.rank):
        parts = {
            Part.DATA: r.data,
            Part.FORWARD: r.forward,
            Part.BACKWARD: r.backward,
            Part.OPTIMIZER: r.optimizer,
            Part.COMM_TRANSFER: transfer,
            Part.COMM_WAIT: r.comm - transfer,
            Part.OTHER: r.other,
        }
        out.append(AttributedStep(r.step, r.rank, r.wall, parts, r.comm_overlapped))
    return out


def attribute_steps(records: Iterable[StepRecord]) -> list[AttributedStep]:
    """:func:`attribute` over every step that all ranks recorded (incomplete steps are left out:
    without every rank the transfer cannot be told from waiting)."""
    by_step: dict[int, list[StepRecord]] = {}
    ranks: set[int] = set()
    for r in records:
        by_step.setdefault(r.step, []).append(r)
        ranks.add(r.rank)
    out = []
    for step in sorted(by_step):
        if {r.rank for r in by_step[step]} == ranks:
            out.extend(attribute(by_step[step]))
    return out


def mean_parts(steps: Sequence[AttributedStep]) -> dict[str, float]:
    """Per part, the mean over the given steps (and ranks) of its seconds, plus ``wall`` and
    ``comm_overlapped``. Means, not medians: means of parts add up to the mean wall time."""
    if not steps:
        raise ValueError("mean_parts() needs at least one attributed step")
    out = {str(p): statistics.fmean(s.parts[p] for s in steps) for p in PARTS}
    out["wall"] = statistics.fmean(s.wall for s in steps)
    out["comm_overlapped"] = statistics.fmean(s.comm_overlapped for s in steps)
    return out
