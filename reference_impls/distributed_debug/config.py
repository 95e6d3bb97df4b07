"""The tracer's configuration, typed and validated once."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

__all__ = ["DEFAULT_RING_SIZE", "TraceConfig", "TracerError"]

DEFAULT_RING_SIZE = 2048
"""Records kept per rank: at ~0.5 KiB each (docs/benchmarks/distributed_debug.md) about 1 MiB,
and hundreds of steps of a DDP job, far more than the distance between a divergence and the
hang it causes."""


class TracerError(RuntimeError):
    """The tracer cannot run as asked (no process group, unreachable store, bad config)."""


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError:
        raise TracerError(f"{name} must be a number of seconds, got {value!r}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TraceConfig:
    """How the tracer records, watches and reports.

    The defaults suit a long job (a report after 30 s without progress); tests and demos use
    a stall threshold of a second or two. ``DISTDEBUG_STALL_S`` and ``DISTDEBUG_REPORT_DIR``
    override the two defaults from the environment, so a job can be tuned without code.
    """

    ring_size: int = DEFAULT_RING_SIZE
    """Records kept per rank (the ring drops the oldest; memory never grows with run length)."""
    stall_s: float = dataclasses.field(
        default_factory=lambda: _env_float("DISTDEBUG_STALL_S", 30.0)
    )
    """A call not completed after this many seconds is a stall: every rank publishes and one
    writes the report. Independent of (and normally far below) the process group timeout."""
    tick_s: float | None = None
    """How often the watchdog looks; None: stall_s / 10, at most 0.5 s."""
    heartbeat_s: float = 1.0
    """Longest time between two heartbeats (each carries the rank's newest records; a rank
    with new calls sends one every tick)."""
    publish_novel_calls: int = 256
    """The first this many distinct (call site, arguments) pairs of a rank are published
    synchronously before they are issued (a store round trip, ~0.1 ms, once each): a rank that
    the backend aborts right after a new mismatched call still leaves that call behind. 0: never."""
    dead_after_s: float = 5.0
    """A rank whose heartbeat is older than this is reported dead."""
    collect_s: float = 1.0
    """How long the reporting rank waits for the other live ranks' records."""
    report_dir: Path = dataclasses.field(
        default_factory=lambda: Path(os.environ.get("DISTDEBUG_REPORT_DIR", "distributed_debug"))
    )
    """Where the report (report.txt, report.json) and every rank's records/rankN.json go."""
    exit_code_after_report: int | None = None
    """None: report and keep waiting (the process group timeout still applies). An int: every
    rank exits with it once the report is written, so a hung job fails in seconds."""
    store_timeout_s: float = 10.0
    """Timeout of the tracer's own store client (reaching the store, each operation)."""

    def __post_init__(self) -> None:
        if not isinstance(self.ring_size, int) or self.ring_size < 8:
            raise TracerError(f"ring_size must be an int >= 8, got {self.ring_size!r}")
        for name in (
            "stall_s",
            "heartbeat_s",
            "dead_after_s",
            "collect_s",
            "store_timeout_s",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise TracerError(f"{name} must be > 0 seconds, got {value!r}")
        if self.tick_s is not None and not self.tick_s > 0:
            raise TracerError(f"tick_s must be None or > 0 seconds, got {self.tick_s!r}")
        if self.dead_after_s <= self.heartbeat_s:
            raise TracerError(
                f"dead_after_s ({self.dead_after_s:g}) must exceed heartbeat_s "
                f"({self.heartbeat_s:g}): otherwise live ranks are reported dead"
            )
        object.__setattr__(self, "report_dir", Path(self.report_dir))

    @property
    def tick(self) -> float:
        return self.tick_s if self.tick_s is not None else min(0.5, self.stall_s / 10)
