"""The JSONL metrics log: one JSON object per line (declared in ``metrics_schema.toml``).

Rows::

    {"kind": "train", "step": 3, "epoch": 0, "loss": 0.41, "lr": 0.01, "time": 1796000000.1}
    {"kind": "val", "step": 10, "epoch": 0, "val_loss": 0.38, "best_val_loss": 0.38,
     "improved": true, "checks_without_improvement": 0, "time": ...}
    {"kind": "event", "step": 10, "epoch": 0, "event": "resumed", "detail": "...", "time": ...}

On resume the log is cut back to the checkpoint's step: rows a killed process wrote after its
last checkpoint (and a half-written last line) are dropped, because the resumed run writes
them again. The train and val rows of a resumed run are then those of an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, TextIO

from reference_impls import atomic

__all__ = ["MetricsLog"]


class MetricsLog:
    """Append-only JSONL writer; a no-op when ``enabled`` is False (ranks other than 0).

    Rows are buffered and reach the file at least every ``flush_every_s`` seconds, at every
    :meth:`flush` (the trainer flushes before each checkpoint, so every row up to a
    checkpoint's step is in the file before the checkpoint is) and at :meth:`close`. Rows a
    kill loses were written after the last checkpoint: the resumed run writes them again.
    A write syscall per row would cost more than the rest of the loop's bookkeeping.
    """

    def __init__(
        self, path: str | os.PathLike, *, enabled: bool = True, flush_every_s: float = 1.0
    ) -> None:
        self.path = Path(path)
        self.enabled = enabled
        self.flush_every_s = flush_every_s
        self._file: TextIO | None = None
        self._flushed_at = 0.0

    def truncate_after(self, step: int) -> int:
        """Keep only complete rows with ``step <= step``; returns how many rows were dropped."""
        if not self.enabled or not self.path.exists():
            return 0
        kept, dropped = [], 0
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # the tail of a write cut short by a kill
                dropped += 1
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
                kept.append(line)
            else:
                dropped += 1
        if dropped:
            # Not durable: after a power loss the longer log is back, and the next resume
            # truncates it again.
            atomic.write_text(self.path, "".join(line + "\n" for line in kept), durable=False)
        return dropped

    def write(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        # Bare NaN is not JSON, and null would pass for "no value": a non-finite number is
        # written as the string "nan"/"inf", which a schema asking for a finite float rejects.
        row = {k: _json_number(v) for k, v in row.items()}
        now = time.time()
        self._file.write(json.dumps({**row, "time": round(now, 3)}) + "\n")
        if now - self._flushed_at >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._flushed_at = time.time()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value
