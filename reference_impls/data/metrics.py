"""What the reader measures about itself, and a one-line progress display.

Counters are per process (a DataLoader worker has its own); fetch threads and the consuming
thread both add to them, under a lock. ``time_blocked_s`` is the time the consumer waited
for bytes that were not there yet: near zero means the data path keeps up with compute (the
prefetch depth is enough); close to the wall time means training is waiting on data.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

__all__ = ["Metrics", "ProgressDisplay"]

_COUNTERS = (
    "samples",
    "shards",
    "bytes_network",
    "bytes_cache",
    "cache_hits",
    "cache_misses",
    "cache_corrupt",
    "cache_evictions",
    "cache_skipped",
    "cache_index_rebuilds",
    "retries",
)


class Metrics:
    """Counters and timers of one process's reading (thread-safe increments)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.samples = 0  # samples yielded (pad samples included)
        self.shards = 0  # shard reads completed
        self.bytes_network = 0  # bytes received from the source (resumed bytes counted once)
        self.bytes_cache = 0  # bytes served from the local cache
        self.cache_hits = 0
        self.cache_misses = 0
        self.cache_corrupt = 0  # cached files that failed verification (deleted, refetched)
        self.cache_evictions = 0
        self.cache_skipped = 0  # misses not cached: no room even after eviction
        self.cache_index_rebuilds = 0  # hits whose sample index was missing or bad (rebuilt)
        self.retries = 0  # ranged GETs re-issued after a failed or cut read
        self.time_blocked_s = 0.0  # consumer waiting for bytes
        self.started = time.monotonic()

    def add(self, **counts: float) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def snapshot(self) -> dict[str, Any]:
        """Counters plus derived rates (MB = 1e6 bytes)."""
        with self._lock:
            out: dict[str, Any] = {name: getattr(self, name) for name in _COUNTERS}
            out["time_blocked_s"] = self.time_blocked_s
        elapsed = max(self.elapsed_s, 1e-9)
        out["elapsed_s"] = elapsed
        out["throughput_mb_s"] = (out["bytes_network"] + out["bytes_cache"]) / elapsed / 1e6
        out["samples_per_s"] = out["samples"] / elapsed
        out["blocked_fraction"] = min(1.0, out["time_blocked_s"] / elapsed)
        return out


class ProgressDisplay:
    """Prints ``label: 1,234/5,000 samples (24.7%) | 312.4 MB/s | cache 10 hit 2 miss | ...``
    at most every ``interval_s`` seconds (carriage-return updates on a terminal)."""

    def __init__(
        self,
        total: int,
        *,
        label: str = "data",
        interval_s: float = 5.0,
        stream: TextIO | None = None,
    ) -> None:
        self.total = total
        self.label = label
        self.interval_s = interval_s
        self.stream = stream if stream is not None else sys.stderr
        self._last = 0.0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def format(self, metrics: Metrics, done: int) -> str:
        s = metrics.snapshot()
        pct = 100.0 * done / self.total if self.total else 100.0
        return (
            f"{self.label}: {done:,}/{self.total:,} samples ({pct:.1f}%) | "
            f"{s['throughput_mb_s']:.1f} MB/s, {s['samples_per_s']:.0f} samples/s | "
            f"cache {s['cache_hits']} hit {s['cache_misses']} miss {s['cache_corrupt']} corrupt | "
            f"retries {s['retries']} | blocked {s['time_blocked_s']:.1f} s "
            f"({100 * s['blocked_fraction']:.0f}%)"
        )

    def update(self, metrics: Metrics, done: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        line = self.format(metrics, done)
        if self._tty:
            self.stream.write("\r" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self, metrics: Metrics, done: int) -> None:
        self.update(metrics, done, force=True)
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()
