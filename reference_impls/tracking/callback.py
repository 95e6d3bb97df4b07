"""An adapter that records a training-loop run (reference_impls.training) in the tracker.

The loop knows nothing of tracking: it calls ``on_step_end`` and ``on_checkpoint`` on any
object passed in ``callbacks=`` (its ``Callback`` protocol). This adapter

- starts a run with the flattened training config as typed params (``optimizer.lr`` ...);
- at every checkpoint reads the rows the loop appended to its ``metrics.jsonl`` since the
  last checkpoint (the loop flushes that file before writing a checkpoint, so it is complete
  up to the checkpoint's step) and logs them as metrics: ``loss``/``lr`` from train rows,
  ``val_loss``/``best_val_loss`` from validation rows; a resumed run's rewritten rows are
  upserts, stored once;
- logs ``best.pt`` as a ``checkpoint`` artifact when validation improved (``log_checkpoints``:
  "best", "all" also logs every ``latest.pt``, "none");
- ``finish(result)`` logs the remaining rows and the final ``latest.pt``, records the result
  as tags and ends the run.

Only rank 0 records anything (the other ranks' callbacks do nothing).

    cb = TrackingCallback(tracker, "regression", config)
    result = Trainer(config, run_dir, callbacks=[cb]).run()
    cb.finish(result)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from reference_impls.tracking.client import Run, Tracker
from reference_impls.tracking.metadata import RunStatus

__all__ = ["TrackingCallback", "flatten"]


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optimizer": {"lr": 0.1}}`` -> ``{"optimizer.lr": 0.1}``; lists and None as text."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, bool | int | str) or (isinstance(v, float) and math.isfinite(v)):
            out[key] = v
        else:
            out[key] = json.dumps(v)
    return out


class TrackingCallback:
    def __init__(
        self,
        tracker: Tracker,
        project: str,
        config: Any,
        *,
        name: str | None = None,
        tags: dict[str, str] | None = None,
        log_checkpoints: Literal["best", "all", "none"] = "best",
        git_commit: str | None = None,
    ) -> None:
        if log_checkpoints not in ("best", "all", "none"):
            raise ValueError(f"log_checkpoints must be best, all or none, got {log_checkpoints!r}")
        self.tracker = tracker
        self.project = project
        self.config = config
        self.name = name
        self.tags = dict(tags or {})
        self.log_checkpoints = log_checkpoints
        self.git_commit = git_commit
        self.run: Run | None = None
        self._offset = 0
        self._active = True

    def _start(self, trainer: Any) -> Run | None:
        if not trainer.dist.is_main:
            self._active = False
        if not self._active:
            return None
        if self.run is None:
            params = flatten(self.config.to_dict())
            self.run = self.tracker.start_run(
                self.project,
                name=self.name,
                params=params,
                tags={**self.tags, "run_dir": str(trainer.run_dir)},
                git_commit=self.git_commit,
            )
        return self.run

    # the loop's Callback protocol ------------------------------------------------------------
    def on_step_end(self, trainer: Any) -> None:
        self._start(trainer)  # cheap after the first call: metrics are read at checkpoints

    def on_checkpoint(self, trainer: Any, *, best: bool) -> None:
        run = self._start(trainer)
        if run is None:
            return
        self._read_rows(run, Path(trainer.run_dir) / "metrics.jsonl")
        run_dir = Path(trainer.run_dir)
        if best and self.log_checkpoints in ("best", "all"):
            run.log_artifact(
                run_dir / "best.pt", f"checkpoints/best-step{trainer.step}.pt", kind="checkpoint"
            )
        if self.log_checkpoints == "all":
            run.log_artifact(
                run_dir / "latest.pt", f"checkpoints/step{trainer.step}.pt", kind="checkpoint"
            )

    def finish(self, result: Any = None, *, run_dir: str | Path | None = None) -> None:
        """Log what is left, the final checkpoint and the result; end the run."""
        run = self.run
        if run is None:
            return
        directory = Path(run_dir) if run_dir is not None else None
        if directory is None and "run_dir" in self.tags:
            directory = Path(self.tags["run_dir"])
        if directory is None:
            directory = Path(self.tracker.get_run(run.id).tags["run_dir"])
        self._read_rows(run, directory / "metrics.jsonl")
        final = directory / "latest.pt"
        if final.exists() and self.log_checkpoints != "none":
            run.log_artifact(final, "checkpoints/final.pt", kind="checkpoint")
        if result is not None:
            info = result.to_dict() if hasattr(result, "to_dict") else dict(result)
            run.set_tags({k: str(v) for k, v in info.items() if v is not None and k.isidentifier()})
        run.finish(RunStatus.FINISHED)

    def _read_rows(self, run: Run, path: Path) -> None:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return
        if size < self._offset:  # a resume cut the log back: read it again (upserts)
            self._offset = 0
        with open(path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a half-written last line waits for the next read
        self._offset += end
        for line in data[:end].splitlines():
            row = json.loads(line)
            step = int(row.get("step", 0))
            if row.get("kind") == "train":
                values = {k: row[k] for k in ("loss", "lr") if _finite(row.get(k))}
            elif row.get("kind") == "val":
                values = {k: row[k] for k in ("val_loss", "best_val_loss") if _finite(row.get(k))}
            else:
                continue
            if values:
                run.log_metrics(values, step=step)


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
