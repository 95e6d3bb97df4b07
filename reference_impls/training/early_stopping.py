"""Early stopping on the validation loss, with state that a checkpoint carries across a resume."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["EarlyStopping"]


@dataclasses.dataclass
class EarlyStopping:
    """Counts validation checks without improvement against the best loss of the whole run.

    A check improves when its loss is below ``best - min_delta``; only then does ``best``
    move (so a slow drift of tiny gains below ``min_delta`` still runs out of patience). The
    run stops once ``checks_without_improvement`` reaches ``patience``. With validation once
    per epoch the counter is the number of epochs without improvement.

    The counter is part of the state a checkpoint stores: resetting it on resume (the usual
    bug) would let a crashed run train ``patience`` checks longer than an uninterrupted one.
    """

    patience: int | None
    """None: never stop early (the best value is still tracked, for ``best.pt``)."""
    min_delta: float = 0.0
    best: float | None = None
    """Lowest validation loss so far (None before the first check)."""
    best_step: int | None = None
    best_epoch: int | None = None
    checks_without_improvement: int = 0

    def update(self, value: float, *, step: int, epoch: int) -> bool:
        """Record one validation check; True when it improved on the best."""
        # NaN compares False with everything: it never improves and so counts against patience.
        improved = math.isfinite(value) and (
            self.best is None or value < self.best - self.min_delta
        )
        if improved:
            self.best, self.best_step, self.best_epoch = float(value), step, epoch
            self.checks_without_improvement = 0
        else:
            self.checks_without_improvement += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.checks_without_improvement >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the best value and the counter. ``patience`` and ``min_delta`` stay those of
        the current config: a resumed run may be given more patience on purpose."""
        self.best = state["best"]
        self.best_step = state["best_step"]
        self.best_epoch = state["best_epoch"]
        self.checks_without_improvement = int(state["checks_without_improvement"])
