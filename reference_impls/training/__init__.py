"""Training loop with latest and best checkpoints, early stopping that survives resume, and
exact resume after a crash; a run that diverges, is interrupted or cannot write its run
directory stops with a clear error (docs/training.md).

- :mod:`~reference_impls.training.loop`: :class:`Trainer` (epochs, mini-batches, validation,
  early stopping, checkpoints, resume, torch.distributed, progress bars, JSONL metrics).
- :mod:`~reference_impls.training.checkpoint`: what a checkpoint holds, atomic durable writes,
  verified reads, the fallback to the previous generation, refusal of a different model.
- :mod:`~reference_impls.training.config`: :class:`TrainConfig`, typed and validated.
- ``checkpoint_schema.toml`` / ``metrics_schema.toml``: the artifacts declared for
  ``harness.artifacts`` (``harness artifacts validate --schema ... runs/x/latest.pt``).

Command line (also under ``torchrun --standalone --nproc-per-node N -m ...``)::

    python -m reference_impls.training --config run.toml --run-dir runs/x [--set max_epochs=3]

Exit status: 0 done, 1 a checkpoint problem, 2 a bad config, argument or run directory,
3 diverged (a NaN or infinite loss), 130 interrupted (it prints the resume command).

Nothing here imports pytest or ``harness``.
"""

from reference_impls.training.checkpoint import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointStore,
    RunDirError,
    load_checkpoint,
    save_checkpoint,
)
from reference_impls.training.config import ConfigError, TrainConfig, load_config
from reference_impls.training.data import BatchOrder, make_datasets
from reference_impls.training.early_stopping import EarlyStopping
from reference_impls.training.loop import (
    Callback,
    StopReason,
    Trainer,
    TrainingDivergedError,
    TrainingInterrupted,
    TrainResult,
)
from reference_impls.training.model import build_model

__all__ = [
    "BatchOrder",
    "Callback",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointStore",
    "ConfigError",
    "EarlyStopping",
    "RunDirError",
    "StopReason",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainingDivergedError",
    "TrainingInterrupted",
    "build_model",
    "load_checkpoint",
    "load_config",
    "make_datasets",
    "save_checkpoint",
]
