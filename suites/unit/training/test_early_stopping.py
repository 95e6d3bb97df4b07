"""Early stopping in reference_impls.training: patience against the run's best, and a patience
counter that survives a crash and a resume from ``latest.pt``.

The scripted scenario of the requirements: validation losses 10, 8, 6, then 6.5 for ever,
patience 5.
Epochs are numbered from 0: epoch 2 is the best (6), epochs 3..7 are five checks without
improvement, so the run stops at epoch 7. A run that resets the counter on resume would stop
at epoch 9 after a crash at epoch 4.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from reference_impls.training import Callback, EarlyStopping, TrainConfig, Trainer, load_checkpoint

SCRIPTED_LOSSES = [10.0, 8.0, 6.0]  # then 6.5 for every later epoch
FLAT = 6.5


def scripted_validation(model, *, epoch: int, step: int) -> float:
    return SCRIPTED_LOSSES[epoch] if epoch < len(SCRIPTED_LOSSES) else FLAT


def scenario_config(seed: int) -> TrainConfig:
    # A tiny real model (2 steps per epoch): the validation numbers are scripted, the
    # checkpoints, data positions and resume are the real ones.
    return TrainConfig.from_dict(
        {
            "seed": seed,
            "max_epochs": 20,
            "progress": False,
            "num_threads": 1,
            "model": {"in_features": 4, "hidden": [8]},
            "data": {"num_train": 8, "num_val": 4, "batch_size": 4},
            "early_stopping": {"patience": 5, "min_delta": 0.0},
        }
    )


class CrashAfterEpoch(Callback):
    """Raise once ``latest.pt`` of the given epoch is durable: the process dies right there."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_checkpoint(self, trainer: Trainer, *, best: bool) -> None:
        if trainer.epoch == self.epoch:
            raise SimulatedCrash(f"crash after epoch {self.epoch}")


class SimulatedCrash(Exception):
    pass


def val_rows(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "val"]


def test_a_flat_loss_after_the_best_stops_the_run_at_epoch_7_with_patience_5(tmp_path, seed):
    result = Trainer(scenario_config(seed), tmp_path, validate_fn=scripted_validation).run()

    assert result.stop_reason == "early_stopping"
    assert result.stop_epoch == 7
    assert result.checks_without_improvement == 5
    assert (result.best_val_loss, result.best_epoch) == (6.0, 2)
    assert [r["val_loss"] for r in val_rows(tmp_path)] == [10, 8, 6, 6.5, 6.5, 6.5, 6.5, 6.5]


def test_a_crash_after_epoch_4_and_a_resume_from_latest_also_stop_at_epoch_7(tmp_path, seed):
    config = scenario_config(seed)
    with pytest.raises(SimulatedCrash):
        crashing = [CrashAfterEpoch(4)]
        Trainer(config, tmp_path, validate_fn=scripted_validation, callbacks=crashing).run()
    saved = load_checkpoint(tmp_path / "latest.pt")
    assert saved["epoch"] == 4
    assert saved["early_stopping"]["checks_without_improvement"] == 2  # epochs 3 and 4

    result = Trainer(config, tmp_path, validate_fn=scripted_validation).run()

    assert result.resumed_from == str(tmp_path / "latest.pt")
    assert result.stop_epoch == 7
    assert result.checks_without_improvement == 5
    assert result.steps_run == 3 * 2  # epochs 5, 6 and 7 only, two steps each
    counters = [r["checks_without_improvement"] for r in val_rows(tmp_path)]
    assert counters == [0, 0, 0, 1, 2, 3, 4, 5]  # continued from 2, not restarted at 0


def test_the_best_checkpoint_stays_at_the_best_epoch_while_latest_moves_on(tmp_path, seed):
    Trainer(scenario_config(seed), tmp_path, validate_fn=scripted_validation).run()

    best = load_checkpoint(tmp_path / "best.pt")
    latest = load_checkpoint(tmp_path / "latest.pt")
    assert (best["epoch"], best["val_loss"]) == (2, 6.0)
    assert (latest["epoch"], latest["val_loss"]) == (7, 6.5)
    assert latest["stop_reason"] == "early_stopping"
    # best.pt holds the weights of epoch 2, not those the run went on to train.
    assert not torch.equal(best["model"]["layers.0.weight"], latest["model"]["layers.0.weight"])


def test_resuming_a_run_that_already_stopped_trains_no_further(tmp_path, seed):
    config = scenario_config(seed)
    Trainer(config, tmp_path, validate_fn=scripted_validation).run()

    again = Trainer(config, tmp_path, validate_fn=scripted_validation).run()

    assert (again.stop_reason, again.stop_epoch, again.steps_run) == ("early_stopping", 7, 0)


def test_patience_counts_against_the_best_of_the_run_not_the_previous_check():
    stopper = EarlyStopping(patience=3)
    # 4.2 and 4.1 are better than the check before them but not than the best (4.0).
    improved = [stopper.update(v, step=i, epoch=i) for i, v in enumerate([5.0, 4.0, 4.5, 4.2, 4.1])]

    assert improved == [True, True, False, False, False]
    assert stopper.should_stop
    assert (stopper.best, stopper.best_epoch) == (4.0, 1)


def test_a_gain_no_larger_than_min_delta_is_not_an_improvement():
    stopper = EarlyStopping(patience=2, min_delta=0.1)
    stopper.update(1.0, step=1, epoch=0)

    assert not stopper.update(0.9, step=2, epoch=1)  # exactly min_delta: not more than it
    assert stopper.update(0.85, step=3, epoch=2)  # 0.15 below the best
    assert stopper.best == 0.85


def test_a_nan_validation_loss_never_improves_and_uses_up_patience():
    stopper = EarlyStopping(patience=2)
    assert not stopper.update(math.nan, step=1, epoch=0)
    assert stopper.best is None
    stopper.update(math.nan, step=2, epoch=1)
    assert stopper.should_stop


def test_the_early_stopping_state_round_trips_through_its_state_dict():
    stopper = EarlyStopping(patience=5, min_delta=0.01)
    for i, v in enumerate([3.0, 2.0, 2.5, 2.4]):
        stopper.update(v, step=i + 1, epoch=i)

    restored = EarlyStopping(patience=5, min_delta=0.01)
    restored.load_state_dict(stopper.state_dict())

    assert restored == stopper
    assert restored.checks_without_improvement == 2
