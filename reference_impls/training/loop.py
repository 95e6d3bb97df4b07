"""The training loop: epochs of mini-batches, validation, early stopping, checkpoints, resume.

One optimizer step per global batch. Validation runs every ``val_every_steps`` steps (or at
the end of every epoch) and is followed by a checkpoint: ``best.pt`` when the validation loss
improved, then ``latest.pt`` (checkpoint.py says what they hold and how they are written).
The run ends when early stopping runs out of patience, or after ``max_epochs`` /
``max_steps``; the last step is always validated and checkpointed.

Resume restores everything the run's future depends on (model, optimizer, scheduler, data
position, early-stopping best and counter, every rank's RNG states), so an interrupted and
resumed run computes what the uninterrupted one computes, bit for bit on the same machine
and thread count.

Under torch.distributed (``torchrun``) every rank runs the same steps on its share of each
global batch (data.py), gradients are averaged by DistributedDataParallel, the validation
loss is summed over all ranks, rank 0's value is broadcast so that every rank takes the same
early-stopping decision, and only rank 0 writes files.

A run that cannot go on well stops loudly instead of finishing with garbage:

- a run directory that is a file, or cannot be created or written, is refused before
  anything is built (:class:`~reference_impls.training.checkpoint.RunDirError`);
- a train loss (checked at every logged step, ``log_every_steps``), a validation loss or
  weights (checked at every validation, before the checkpoint) that are NaN or infinite raise
  :class:`TrainingDivergedError` naming the step, the epoch and which one, unless the config
  sets ``allow_non_finite_loss``. Nothing is checkpointed after the weights went bad:
  ``latest.pt`` and ``best.pt`` keep the last finite ones;
- Ctrl-C (SIGINT) raises :class:`TrainingInterrupted` (a ``KeyboardInterrupt``) saying where
  the run stopped and which checkpoint a resume continues from. A Ctrl-C during a checkpoint
  write takes effect once the write is complete.

Both write ``result.json`` with ``stop_reason`` "diverged" or "interrupted", so that a
previous run's summary never stands for this one.

Over 500 lines, one concern: :meth:`Trainer.run` is the loop's state machine (steps, validation,
early stopping, checkpoints, resume, divergence, Ctrl-C); the checkpoint format and its I/O are
in checkpoint.py and checkpoint_io.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import math
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from reference_impls import atomic
from reference_impls.seeds import mix_seed
from reference_impls.training.checkpoint import (
    FORMAT,
    CheckpointError,
    CheckpointStore,
    RunDirError,
    check_run_dir,
    config_differences,
    load_checkpoint,
)
from reference_impls.training.config import ConfigError, TrainConfig
from reference_impls.training.data import BatchOrder, make_datasets
from reference_impls.training.distributed import DistContext
from reference_impls.training.early_stopping import EarlyStopping
from reference_impls.training.metrics import MetricsLog
from reference_impls.training.model import build_model, build_optimizer, build_scheduler
from reference_impls.training.progress import ProgressBars
from reference_impls.training.rng import capture_rng_state, restore_rng_state, seed_all

__all__ = [
    "Callback",
    "CheckpointInfo",
    "StopReason",
    "TrainResult",
    "Trainer",
    "TrainingDivergedError",
    "TrainingInterrupted",
    "ValidateFn",
]

log = logging.getLogger("reference_impls.training")

ValidateFn = Callable[..., float]
"""``fn(model, *, epoch, step) -> float``: replaces the built-in validation loss (the model is
in eval mode; rank 0's value is the one every rank uses)."""

_VAL_CHUNK = 4096  # validation examples per forward pass


ResumeMode = Literal["auto", "never", "require"]
"""``Trainer.run(resume=...)``: continue from ``latest.pt`` if there is one, refuse a directory
that already holds checkpoints, or fail without one."""


class StopReason(enum.StrEnum):
    """Why a run ended: ``TrainResult.stop_reason`` and ``result.json`` (a checkpoint stores
    the plain string).

    EARLY_STOPPING, MAX_EPOCHS and MAX_STEPS end a run that completed. DIVERGED and
    INTERRUPTED are what ``result.json`` says after :meth:`Trainer.run` raised
    :class:`TrainingDivergedError` or :class:`TrainingInterrupted`; a later resume continues
    from ``latest.pt`` and replaces ``result.json`` with its own ending.
    """

    EARLY_STOPPING = "early_stopping"
    MAX_EPOCHS = "max_epochs"
    MAX_STEPS = "max_steps"
    DIVERGED = "diverged"
    INTERRUPTED = "interrupted"


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """The newest checkpoint of the run directory this run knows of (wrote or resumed from)."""

    path: str
    step: int
    epoch: int

    def describe(self) -> str:
        return f"{self.path} (step {self.step}, epoch {self.epoch})"


class TrainingDivergedError(Exception):
    """A loss or the weights became NaN or infinite (see ``allow_non_finite_loss``)."""

    def __init__(
        self,
        message: str,
        *,
        what: str,
        value: float,
        step: int,
        epoch: int,
        last_checkpoint: CheckpointInfo | None,
    ) -> None:
        super().__init__(message)
        self.what = what
        """``train loss``, ``validation loss`` or ``weights``."""
        self.value = value
        self.step = step
        self.epoch = epoch
        self.last_checkpoint = last_checkpoint


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped :meth:`Trainer.run`: where, and what a resume starts from.

    A ``KeyboardInterrupt``, so code that lets Ctrl-C through still does; the command line
    catches it to print the resume command and exit with 130 (128 + SIGINT).
    """

    def __init__(
        self,
        *,
        step: int,
        epoch: int,
        last_checkpoint: CheckpointInfo | None,
        started: bool,
    ) -> None:
        if not started:
            text = "interrupted during set-up, before training started; nothing was written"
        elif last_checkpoint is None:
            text = (
                f"interrupted after step {step} (epoch {epoch}); no checkpoint was written yet: "
                "a resume starts from the beginning"
            )
        else:
            lost = step - last_checkpoint.step
            text = (
                f"interrupted after step {step} (epoch {epoch}); the last checkpoint is "
                f"{last_checkpoint.describe()}"
                + (f": the {lost} step(s) after it are run again on resume" if lost else "")
            )
        super().__init__(text)
        self.started = started
        """False: stopped during the set-up, before the resume point was loaded."""
        self.step = step
        """Optimizer steps done when it stopped."""
        self.epoch = epoch
        """The epoch of the last step (numbered from 0)."""
        self.last_checkpoint = last_checkpoint


class Callback:
    """Hooks into the loop (tests use them to crash a run at a chosen point)."""

    def on_step_end(self, trainer: Trainer) -> None:
        """After an optimizer step (``trainer.step`` counts it), before any validation."""

    def on_checkpoint(self, trainer: Trainer, *, best: bool) -> None:
        """After a validation's checkpoints are durable (on every rank; rank 0 wrote them)."""


@dataclasses.dataclass
class TrainResult:
    """How a run ended. The same for every rank, except ``rank`` and the per-process counts."""

    stop_reason: StopReason
    """early_stopping, max_epochs or max_steps (see :class:`StopReason`)."""
    stop_epoch: int
    """The epoch of the last optimizer step (numbered from 0)."""
    step: int
    best_val_loss: float | None
    best_step: int | None
    best_epoch: int | None
    checks_without_improvement: int
    last_val_loss: float | None
    resumed_from: str | None
    skipped_checkpoints: list[str]
    """Damaged checkpoints passed over on resume, with what was wrong with each."""
    rank: int
    world_size: int
    steps_run: int
    """Optimizer steps this process ran (less than ``step`` after a resume)."""
    checkpoints_written: int
    """``latest.pt`` writes by this process (0 on every rank but 0)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Trainer:
    """Train ``config`` in ``run_dir`` (see the module docstring); :meth:`run` does it all."""

    def __init__(
        self,
        config: TrainConfig,
        run_dir: str | os.PathLike,
        *,
        validate_fn: ValidateFn | None = None,
        callbacks: Sequence[Callback] = (),
        dist: DistContext | None = None,
    ) -> None:
        self.config = config
        self._run_dir_given = os.fspath(run_dir)
        self.run_dir = Path(run_dir)
        self.validate_fn = validate_fn
        self.callbacks = list(callbacks)
        self.dist = dist or DistContext.current()
        self.store = CheckpointStore(self.run_dir)
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", enabled=self.dist.is_main)
        # Set by run():
        self.step = 0
        self.epoch = 0
        self.position = (0, 0)
        self.stop_reason: StopReason | None = None
        self.last_val_loss: float | None = None
        self.last_checkpoint: CheckpointInfo | None = None
        self.resumed_from: str | None = None
        self.skipped: list[str] = []
        self.started = False
        """True once the run directory was checked and the resume point loaded."""
        self.early_stopping = EarlyStopping(
            config.early_stopping.patience, config.early_stopping.min_delta
        )

    # ----------------------------------------------------------------------- setup

    def _build(self) -> None:
        cfg = self.config
        if cfg.num_threads is not None:
            torch.set_num_threads(cfg.num_threads)  # run() puts the caller's value back
        if cfg.device == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError(
                    f"device is 'cuda' but this torch ({torch.__version__}) sees no CUDA "
                    "device; use device = 'cpu' (or --set device=cpu)"
                )
            self.device = torch.device("cuda", self.dist.local_rank)
        else:
            self.device = torch.device("cpu")
        # The data and the initial weights depend on the seed only: every rank, and every
        # process of a resumed run, builds the same ones.
        seed_all(cfg.seed)
        self.train_set, self.val_set = make_datasets(cfg.data, cfg.model, cfg.seed)
        self.model = build_model(cfg.model).to(self.device)
        # Each rank then draws from its own stream (its own dropout masks).
        seed_all(mix_seed(cfg.seed, "rank", self.dist.rank))
        self.order = BatchOrder(
            cfg.data.num_train,
            cfg.data.batch_size,
            seed=cfg.seed,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            drop_last=cfg.data.drop_last,
        )
        self.optimizer = build_optimizer(cfg.optimizer, self.model)
        self.scheduler = build_scheduler(
            cfg.scheduler, self.optimizer, planned_steps=cfg.planned_steps()
        )
        self.net: nn.Module = self.model
        if self.dist.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.net = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)

    def _resume(self, mode: ResumeMode) -> tuple[str | None, list[str]]:
        """Find and restore the checkpoint to continue from. Returns (path, skipped problems)."""
        found: dict[str, Any] | None = None
        error: CheckpointError | None = None
        state: dict[str, Any] | None = None
        if self.dist.is_main:
            try:
                found, state = self._find_resume(mode)
            except CheckpointError as exc:
                error, found = exc, {"error": str(exc)}
        # Rank 0 decides, so that every rank resumes from the same file (or fails together
        # instead of waiting forever in a collective).
        found = self.dist.broadcast_object(found)
        if found is not None and "error" in found:
            raise error or CheckpointError(found["error"])
        if found is None:
            self.metrics.truncate_after(0)  # rows of an attempt that never reached a checkpoint
            return None, []
        if state is None:  # the other ranks read the file rank 0 chose
            state = load_checkpoint(found["path"])
        self._load_state_dict(state)
        self.metrics.truncate_after(self.step)
        self.last_checkpoint = CheckpointInfo(found["path"], self.step, self.epoch)
        return found["path"], found["skipped"]

    def _find_resume(self, mode: ResumeMode) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """({"path", "skipped"}, the checkpoint) or (None, None) for a fresh start."""
        if mode == "never":
            if self.store.has_checkpoints():
                raise CheckpointError(
                    f"{self.run_dir} already holds checkpoints and resume='never' would overwrite "
                    "them; use a new run directory, or resume='auto'",
                    path=self.run_dir,
                )
            return None, None
        for tmp in self.store.remove_temporaries():
            log.warning("removed %s, left by a checkpoint write that was interrupted", tmp)
        point = self.store.find_resume(self.config.to_dict()["model"])
        if point is None:
            if mode == "require":
                raise CheckpointError(
                    f"no checkpoint to resume from in {self.run_dir}", path=self.run_dir
                )
            return None, None
        skipped = []
        for problem in point.skipped:
            assert problem.path is not None  # a corrupt checkpoint's error names its file
            kept = self.store.set_aside(problem.path)
            log.warning(
                "%s; resuming from %s instead (the damaged file is kept as %s)",
                problem,
                point.path,
                kept,
            )
            skipped.append(str(problem))
        for diff in config_differences(point.state["config"], self.config.to_dict()):
            log.warning("resuming %s with a changed config: %s", point.path, diff)
        return {"path": str(point.path), "skipped": skipped}, point.state

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.early_stopping.load_state_dict(state["early_stopping"])
        self.step, self.epoch = state["step"], state["epoch"]
        self.position = (state["position"]["epoch"], state["position"]["batch"])
        self.last_val_loss = state["val_loss"]
        rng = state["rng"].get(f"rank{self.dist.rank}")
        if rng is not None:
            restore_rng_state(rng)
        else:  # resumed with more ranks than wrote the checkpoint: a fresh, seeded stream
            log.warning(
                "checkpoint written by %d rank(s) has no RNG state for rank %d: it draws from a "
                "new seeded stream, so this run will not repeat the original bit for bit",
                state["world_size"],
                self.dist.rank,
            )
            seed_all(mix_seed(self.config.seed, "rank", self.dist.rank, "step", self.step))

    def state_dict(self, rng_states: list[dict[str, Any]]) -> dict[str, Any]:
        """The checkpoint (without ``saved_at``, which the store adds)."""
        assert self.last_val_loss is not None  # a checkpoint follows a validation
        return {
            "format": FORMAT,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": self.epoch,
            "step": self.step,
            "position": {"epoch": self.position[0], "batch": self.position[1]},
            "early_stopping": self.early_stopping.state_dict(),
            "val_loss": float(self.last_val_loss),
            # The plain string: torch.load(weights_only=True) refuses enum instances.
            "stop_reason": None if self.stop_reason is None else str(self.stop_reason),
            "rng": {f"rank{r}": s for r, s in enumerate(rng_states)},
            "world_size": self.dist.world_size,
            "config": self.config.to_dict(),
        }

    # ----------------------------------------------------------------------- the loop

    def run(self, *, resume: ResumeMode = "auto") -> TrainResult:
        """Train to the end. ``resume``: auto (continue from ``latest.pt`` if there is one),
        never (refuse a directory that already holds checkpoints), require (fail without one)."""
        if resume not in get_args(ResumeMode):
            raise ValueError(f"resume must be auto, never or require, got {resume!r}")
        threads = torch.get_num_threads()
        self.steps_run = self.checkpoints_written = 0
        try:
            return self._run(resume)
        except TrainingDivergedError as exc:
            self._event("diverged", str(exc))
            self._write_result(StopReason.DIVERGED)
            raise
        except KeyboardInterrupt:
            stopped = TrainingInterrupted(
                step=self.step,
                epoch=self.epoch,
                last_checkpoint=self.last_checkpoint,
                started=self.started,
            )
            if self.started:  # before that, a previous run's result.json still holds
                self._event("interrupted", str(stopped))
                self._write_result(StopReason.INTERRUPTED)
            raise stopped from None
        finally:
            self.metrics.close()
            torch.set_num_threads(threads)

    def _run(self, resume: ResumeMode) -> TrainResult:
        self._check_run_dir()
        self._build()
        self.resumed_from, self.skipped = self._resume(resume)
        self.started = True
        if self.resumed_from is not None:
            detail = f"from {self.resumed_from}" + "".join(f"; skipped {s}" for s in self.skipped)
            self._event("resumed", detail)
        self.stop_reason = self._limit_reached()
        cfg = self.config
        bars = ProgressBars(
            enabled=cfg.progress and self.dist.is_main,
            max_epochs=cfg.max_epochs,
            steps_per_epoch=self.order.steps_per_epoch,
        )
        with bars:
            # Train mode once, and again after each validation: Module.train() walks every
            # submodule (~90 us for this small MLP, as much as a whole step).
            self.net.train()
            while self.stop_reason is None:
                epoch, first = self.position
                bars.start_epoch(epoch, first)
                for batch in range(first, self.order.steps_per_epoch):
                    loss = self._train_step(epoch, batch)
                    bars.step(loss)
                    for callback in self.callbacks:
                        callback.on_step_end(self)
                    epoch_done = self.position[1] == 0
                    limit = self._limit_reached()
                    every = cfg.val_every_steps
                    due = self.step % every == 0 if every else epoch_done
                    if due or limit is not None:  # the last step is always validated
                        self._validate_and_checkpoint(limit, bars)
                        if self.stop_reason is not None:
                            break
                bars.end_epoch(epoch)
        assert self.stop_reason is not None
        result = self._write_result(self.stop_reason)
        self.dist.barrier()
        return result

    def _write_result(self, reason: StopReason) -> TrainResult:
        """The run's summary; rank 0 writes it to ``result.json`` (atomically)."""
        result = TrainResult(
            stop_reason=reason,
            stop_epoch=self.epoch,
            step=self.step,
            best_val_loss=self.early_stopping.best,
            best_step=self.early_stopping.best_step,
            best_epoch=self.early_stopping.best_epoch,
            checks_without_improvement=self.early_stopping.checks_without_improvement,
            last_val_loss=self.last_val_loss,
            resumed_from=self.resumed_from,
            skipped_checkpoints=self.skipped,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            steps_run=self.steps_run,
            checkpoints_written=self.checkpoints_written,
        )
        if self.dist.is_main and self.run_dir.is_dir():
            _write_json(self.run_dir / "result.json", result.to_dict())
        return result

    def _check_run_dir(self) -> None:
        """Refuse a run directory that cannot hold the run's files, before the set-up (data,
        model, process-group collectives) is paid for. Rank 0 checks; every rank raises."""
        problem = None
        if self.dist.is_main:
            try:
                check_run_dir(self._run_dir_given)
            except CheckpointError as exc:
                problem = exc
        text = self.dist.broadcast_object(None if problem is None else str(problem))
        if text is not None:
            if problem is not None:
                raise problem
            raise RunDirError(text, path=self.run_dir)

    def _limit_reached(self) -> StopReason | None:
        """Why the run ends now (early stopping, or the end of the schedule), or None."""
        if self.early_stopping.should_stop:
            return StopReason.EARLY_STOPPING
        if self.config.max_steps is not None and self.step >= self.config.max_steps:
            return StopReason.MAX_STEPS
        if self.position[0] >= self.config.max_epochs:
            return StopReason.MAX_EPOCHS
        return None

    def _train_step(self, epoch: int, batch: int) -> float | None:
        index = self.order.local_batch(epoch, batch)  # (B/W,)
        x = self.train_set.x[index].to(self.device, non_blocking=True)  # (B/W, in)
        y = self.train_set.y[index].to(self.device, non_blocking=True)  # (B/W, out)
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(self.net(x), y)
        loss.backward()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        self.steps_run += 1
        self.epoch = epoch
        last = batch + 1 == self.order.steps_per_epoch
        self.position = (epoch + 1, 0) if last else (epoch, batch + 1)
        if self.step % self.config.log_every_steps:
            return None
        mean = loss.detach()
        if self.dist.world_size > 1:  # equal local batches: the mean of means is the mean
            mean = self.dist.all_reduce_sum(mean.clone()) / self.dist.world_size
        value = float(mean.item())
        row = {"kind": "train", "step": self.step, "epoch": epoch, "loss": value, "lr": lr}
        self.metrics.write(row)
        if not math.isfinite(value) and not self.config.allow_non_finite_loss:
            raise self._diverged("train loss", value)
        return value

    @torch.no_grad()
    def _evaluate(self) -> float:
        """Mean squared error over the whole validation set, summed over every rank's share."""
        index = self.order.val_indices(len(self.val_set))
        total = torch.zeros(2, dtype=torch.float64, device=self.device)  # (sum of squares, count)
        for chunk in index.split(_VAL_CHUNK):
            x = self.val_set.x[chunk].to(self.device)
            y = self.val_set.y[chunk].to(self.device)
            total[0] += (self.model(x) - y).square().sum(dtype=torch.float64)
            total[1] += y.numel()
        self.dist.all_reduce_sum(total)
        return (total[0] / total[1]).item()

    def _validate_and_checkpoint(self, limit: StopReason | None, bars: ProgressBars) -> None:
        self.model.eval()
        if self.validate_fn is not None:
            value = float(self.validate_fn(self.model, epoch=self.epoch, step=self.step))
        else:
            value = self._evaluate()
        finite_weights = self.config.allow_non_finite_loss or _all_finite(self.model)
        # Rank 0's numbers on every rank: identical input, identical early-stopping state.
        value, finite_weights = self.dist.broadcast_object((value, finite_weights))
        if not self.config.allow_non_finite_loss:
            # Before anything is written: latest.pt and best.pt keep the last finite weights.
            if not math.isfinite(value):
                raise self._diverged("validation loss", value)
            if not finite_weights:
                raise self._diverged("weights", math.nan)
        es = self.early_stopping
        improved = es.update(value, step=self.step, epoch=self.epoch)
        self.last_val_loss = value
        self.stop_reason = StopReason.EARLY_STOPPING if es.should_stop else limit
        self.metrics.write(
            {
                "kind": "val",
                "step": self.step,
                "epoch": self.epoch,
                "val_loss": value,
                "best_val_loss": es.best,
                "improved": improved,
                "checks_without_improvement": es.checks_without_improvement,
            }
        )
        bars.validated(value, es.best)
        self.metrics.flush()  # every row up to this step is in the file before the checkpoint
        rng_states = self.dist.gather_objects(capture_rng_state())
        with _sigint_deferred():
            if rng_states is not None:  # rank 0, which writes
                self.store.save(self.state_dict(rng_states), best=improved)
                self.checkpoints_written += 1
            self.last_checkpoint = CheckpointInfo(str(self.store.latest), self.step, self.epoch)
        for callback in self.callbacks:
            callback.on_checkpoint(self, best=improved)
        self.net.train()

    def _diverged(self, what: str, value: float) -> TrainingDivergedError:
        opt = self.config.optimizer
        shown = "" if what == "weights" else f" is {value}"
        saved = (
            f"{self.last_checkpoint.describe()} is the last checkpoint, with finite weights"
            if self.last_checkpoint is not None
            else "no checkpoint was written"
        )
        return TrainingDivergedError(
            f"training diverged: the {what}{shown} at step {self.step} (epoch {self.epoch}); "
            f"stopped without checkpointing it: {saved}. Lower optimizer.lr (now {opt.lr}) or "
            f"optimizer.weight_decay (now {opt.weight_decay}), or set allow_non_finite_loss = "
            "true to train on regardless",
            what=what,
            value=value,
            step=self.step,
            epoch=self.epoch,
            last_checkpoint=self.last_checkpoint,
        )

    def _event(self, event: str, detail: str) -> None:
        row = {"kind": "event", "step": self.step, "epoch": self.epoch, "event": event}
        self.metrics.write({**row, "detail": detail})


def _all_finite(model: nn.Module) -> bool:
    """Whether every parameter is finite (one device sync for the whole model)."""
    flags = [torch.isfinite(p).all() for p in model.parameters()]
    return bool(torch.stack(flags).all()) if flags else True


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold a Ctrl-C back until the block is done, then raise it.

    A checkpoint write is atomic either way (checkpoint.py), but the trainer must know which
    one it completed to say where a resume continues from. Only Python's default handler is
    replaced, and only in the main thread (signal handlers cannot be set elsewhere).
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    received: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if received:
        raise KeyboardInterrupt


def _write_json(path: Path, data: dict[str, Any]) -> None:
    # Non-finite numbers as strings ("nan"): bare NaN is not JSON.
    data = {
        k: repr(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in data.items()
    }
    # Not durable: result.json summarises the run; the checkpoints are the durable state.
    atomic.write_text(path, json.dumps(data, indent=2) + "\n", durable=False)
