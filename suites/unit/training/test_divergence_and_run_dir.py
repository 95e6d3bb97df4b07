"""What reference_impls.training refuses to do quietly: train on with NaN or infinite losses or
weights (and overwrite the last good checkpoint with them), accept non-finite config values,
or find out only after the whole set-up that its run directory cannot be written.

Also the patience setting's spelling of "never stop early" in a TOML file (TOML has no null).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from reference_impls.training import (
    Callback,
    ConfigError,
    RunDirError,
    TrainConfig,
    Trainer,
    TrainingDivergedError,
    load_checkpoint,
    load_config,
)


def small_config(seed: int, **changes) -> TrainConfig:
    # 4 steps per epoch, validation (and latest.pt) at the end of every epoch.
    data = {
        "seed": seed,
        "max_epochs": 4,
        "progress": False,
        "num_threads": 1,
        "model": {"in_features": 4, "hidden": [8]},
        "data": {"num_train": 16, "num_val": 8, "batch_size": 4},
    }
    config = TrainConfig.from_dict(data)
    return config.replace(changes) if changes else config


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class AfterFirstCheckpoint(Callback):
    """Once latest.pt of epoch 0 is durable, remember its bytes and break the run with ``hurt``."""

    def __init__(self, hurt) -> None:
        self.hurt = hurt
        self.latest: bytes | None = None
        self.best: bytes | None = None

    def on_checkpoint(self, trainer: Trainer, *, best: bool) -> None:
        if self.latest is None:
            self.latest = (trainer.run_dir / "latest.pt").read_bytes()
            self.best = (trainer.run_dir / "best.pt").read_bytes()
            self.hurt(trainer)


def explode_lr(trainer: Trainer) -> None:
    for group in trainer.optimizer.param_groups:
        group["lr"] = 1e30


def assert_checkpoints_untouched(run_dir: Path, callback: AfterFirstCheckpoint) -> None:
    assert (run_dir / "latest.pt").read_bytes() == callback.latest
    assert (run_dir / "best.pt").read_bytes() == callback.best
    weights = load_checkpoint(run_dir / "latest.pt")["model"]
    assert all(torch.isfinite(w).all() for w in weights.values())


# --------------------------------------------------------------------------- divergence


def test_a_learning_rate_that_blows_up_stops_the_run_at_the_first_non_finite_train_loss(
    tmp_path, seed
):
    run_dir = tmp_path / "run"
    wrecker = AfterFirstCheckpoint(explode_lr)

    with pytest.raises(TrainingDivergedError) as info:
        Trainer(small_config(seed), run_dir, callbacks=[wrecker]).run()

    err = info.value
    assert err.what == "train loss" and not math.isfinite(err.value)
    assert err.epoch >= 1 and err.step > 4  # after the first checkpoint (step 4, epoch 0)
    message = str(err)
    assert f"train loss is {err.value} at step {err.step} (epoch {err.epoch})" in message
    assert f"{run_dir / 'latest.pt'} (step 4, epoch 0)" in message
    assert "allow_non_finite_loss" in message
    # The first non-finite loss stops it: every train row before it is finite.
    train_losses = [r["loss"] for r in rows(run_dir) if r["kind"] == "train"]
    assert all(isinstance(v, float) for v in train_losses[:-1]) and train_losses[-1] in (
        "nan",
        "inf",
        "-inf",
    )
    assert_checkpoints_untouched(run_dir, wrecker)
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["stop_reason"], result["step"]) == ("diverged", err.step)


def test_a_non_finite_validation_loss_stops_the_run_before_its_checkpoint(tmp_path, seed):
    run_dir = tmp_path / "run"

    def validate(model, *, epoch: int, step: int) -> float:
        return 1.0 if epoch == 0 else math.inf

    with pytest.raises(
        TrainingDivergedError, match=r"validation loss is inf at step 8 \(epoch 1\)"
    ):
        Trainer(small_config(seed), run_dir, validate_fn=validate).run()

    assert load_checkpoint(run_dir / "latest.pt")["step"] == 4
    assert not (run_dir / "latest.prev.pt").exists()  # the write of step 8 never started


def test_non_finite_weights_are_never_checkpointed_even_when_the_losses_look_finite(tmp_path, seed):
    # The validation loss is scripted (finite) and train rows are logged only every 1000
    # steps: the weights check is what must catch this.
    run_dir = tmp_path / "run"

    def poison(trainer: Trainer) -> None:
        with torch.no_grad():
            trainer.model.layers[0].weight[0, 0] = math.nan

    wrecker = AfterFirstCheckpoint(poison)
    config = small_config(seed, log_every_steps=1000)

    with pytest.raises(TrainingDivergedError, match=r"the weights at step 8 \(epoch 1\)"):
        Trainer(config, run_dir, validate_fn=lambda m, **_: 1.0, callbacks=[wrecker]).run()

    assert_checkpoints_untouched(run_dir, wrecker)


def test_allow_non_finite_loss_trains_on_to_the_end(tmp_path, seed):
    config = small_config(seed, **{"optimizer.lr": 1e30, "allow_non_finite_loss": True})

    result = Trainer(config, tmp_path / "run").run()

    assert result.stop_reason == "max_epochs" and result.step == 16
    assert math.isnan(result.last_val_loss)


# --------------------------------------------------------------------------- config values


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("optimizer.lr", math.inf),
        ("optimizer.lr", math.nan),
        ("optimizer.weight_decay", math.inf),
        ("optimizer.momentum", math.nan),
        ("scheduler.min_lr", math.inf),
        ("scheduler.gamma", math.nan),
        ("data.noise", math.inf),
        ("model.dropout", math.nan),
        ("early_stopping.min_delta", math.inf),
    ],
)
def test_a_non_finite_config_value_is_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=re.escape(f"{key} must be a finite number")):
        TrainConfig().replace({key: value})


@pytest.mark.parametrize("key", ["optimizer.lr", "optimizer.weight_decay", "scheduler.min_lr"])
def test_a_factor_beyond_float32_is_refused_before_torch_fails_on_it(key):
    # weight_decay = 1e308 once reached Adam and failed there with "value cannot be converted
    # to type float without overflow" (found by suites/property/training).
    with pytest.raises(ConfigError, match=re.escape(f"{key} must be <= 3.402823e+38")):
        TrainConfig().replace({key: 1e308})
    TrainConfig().replace({key: 3e38})  # float32 holds it (min_lr: unused by "constant")


def test_a_cosine_schedule_that_would_rise_to_min_lr_is_refused():
    with pytest.raises(ConfigError, match=r"scheduler\.min_lr \(1\.0\) must be <= optimizer\.lr"):
        TrainConfig().replace({"scheduler.name": "cosine", "scheduler.min_lr": 1.0})
    TrainConfig().replace({"scheduler.name": "step", "scheduler.min_lr": 1.0})  # unused there


def test_non_finite_values_in_a_toml_file_are_refused(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[optimizer]\nweight_decay = inf\n")

    with pytest.raises(
        ConfigError, match=r"optimizer\.weight_decay must be a finite number, got inf"
    ):
        load_config(path)


def test_patience_0_in_toml_disables_early_stopping_and_leaving_it_out_means_5(tmp_path, seed):
    off, default = tmp_path / "off.toml", tmp_path / "default.toml"
    off.write_text("[early_stopping]\npatience = 0\n")
    default.write_text("max_epochs = 3\n")
    assert load_config(default).early_stopping.patience == 5
    assert load_config(off).early_stopping.patience is None

    # The same flat validation loss that stops a run with patience 1 after 2 checks runs to
    # max_epochs with patience 0.
    def flat(model, *, epoch: int, step: int) -> float:
        return 1.0

    stopped = Trainer(
        small_config(seed, **{"early_stopping.patience": 1}), tmp_path / "a", validate_fn=flat
    )
    assert stopped.run().stop_reason == "early_stopping"
    never = Trainer(
        small_config(seed, **{"early_stopping.patience": 0}), tmp_path / "b", validate_fn=flat
    )
    assert never.run().stop_reason == "max_epochs"


def test_a_negative_patience_says_how_to_disable_early_stopping():
    with pytest.raises(ConfigError) as info:
        TrainConfig().replace({"early_stopping.patience": -1})
    message = str(info.value)
    assert "0 to never stop early" in message and "left out it is 5" in message
    assert "absent" not in message  # absent is 5, not "disabled"


# --------------------------------------------------------------------------- run directory


def test_a_run_directory_that_is_a_file_is_refused_before_the_set_up(tmp_path, seed):
    target = tmp_path / "run"
    target.write_text("not a directory")
    trainer = Trainer(small_config(seed), target)

    with pytest.raises(RunDirError, match=f"run directory {target} is a file"):
        trainer.run()

    assert not hasattr(trainer, "model")  # _build() never ran: no data, no model
    with pytest.raises(RunDirError, match=f"{target} is a file, not a directory"):
        Trainer(small_config(seed), target / "sub").run()


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory no file can be created in, also for root (who ignores permission bits):
    chmod for other users, the immutable attribute (chattr +i) for root."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    chattr = shutil.which("chattr")
    made = chattr and subprocess.run([chattr, "+i", str(path)], capture_output=True).returncode == 0
    if not made:
        pytest.skip(f"running as root on a filesystem where chattr +i fails ({tmp_path})")
    yield path
    subprocess.run([chattr, "-i", str(path)], check=True)


def test_a_read_only_run_directory_is_refused_before_the_set_up(read_only_dir, seed):
    trainer = Trainer(small_config(seed), read_only_dir)
    with pytest.raises(RunDirError, match=f"run directory {read_only_dir} is not writable"):
        trainer.run()
    assert not hasattr(trainer, "model")
    with pytest.raises(RunDirError, match=f"cannot create run directory {read_only_dir / 'x'}"):
        Trainer(small_config(seed), read_only_dir / "x").run()


def test_an_empty_run_directory_is_refused_not_taken_as_the_working_directory(
    tmp_path, seed, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunDirError, match="run directory is an empty string"):
        Trainer(small_config(seed), "").run()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_a_config_error_saying_what_to_use(tmp_path, seed):
    with pytest.raises(ConfigError, match="device is 'cuda' but this torch .* sees no CUDA"):
        Trainer(small_config(seed, device="cuda"), tmp_path / "run").run()
