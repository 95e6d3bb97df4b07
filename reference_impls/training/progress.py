"""Progress bars for epochs and steps (rich), shown by rank 0 on a terminal only."""

from __future__ import annotations

from typing import Any

__all__ = ["ProgressBars"]


class ProgressBars:
    """Two bars: epochs of the run, steps of the current epoch (with the last loss).

    Disabled (every method a no-op) when ``enabled`` is False or stderr is not a terminal:
    a CI log or a pipe gets the metrics log and the summary instead of redraw sequences.
    """

    def __init__(self, *, enabled: bool, max_epochs: int, steps_per_epoch: int) -> None:
        self._progress: Any = None
        if not enabled:
            return
        from rich.console import Console  # noqa: PLC0415 - only when bars are wanted
        from rich.progress import (  # noqa: PLC0415
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        console = Console(stderr=True)
        if not console.is_terminal:
            return
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._epochs = self._progress.add_task("epochs", total=max_epochs, info="")
        self._steps = self._progress.add_task("steps", total=steps_per_epoch, info="")

    def __enter__(self) -> ProgressBars:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def start_epoch(self, epoch: int, batch: int) -> None:
        if self._progress is not None:
            self._progress.update(self._epochs, completed=epoch, info=f"epoch {epoch}")
            self._progress.reset(self._steps, completed=batch)

    def step(self, loss: float | None) -> None:
        if self._progress is not None:
            info = "" if loss is None else f"loss {loss:.4g}"
            self._progress.update(self._steps, advance=1, info=info)

    def validated(self, val_loss: float, best: float | None) -> None:
        if self._progress is not None:
            best_text = "-" if best is None else f"{best:.4g}"
            self._progress.update(self._epochs, info=f"val {val_loss:.4g} (best {best_text})")

    def end_epoch(self, epoch: int) -> None:
        if self._progress is not None:
            self._progress.update(self._epochs, completed=epoch + 1)
