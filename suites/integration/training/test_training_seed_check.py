"""The seeds' CI check for reference_impls.training: the training entry point, 20 steps on 100
synthetic examples, seeded and deterministic, compared with a recorded loss curve.

``python -m reference_impls.training`` runs twice (two processes, two run directories) on the
config below: 100 examples in global batches of 20 is 5 steps per epoch, 4 epochs, 20 steps.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import assert_close, assert_equal
from harness.artifacts import check, load_schema
from reference_impls.training import (
    TrainConfig,
    build_model,
    load_checkpoint,
    make_datasets,
    save_checkpoint,
)
from reference_impls.training import checkpoint as checkpoint_module

# The config's seed is fixed, not the test's: the golden curve below is the curve of this one
# seed (a golden that moved with the test seed could not be recorded).
CONFIG = """
seed = 20261130
max_epochs = 4
progress = false
num_threads = 1

[model]
in_features = 8
hidden = [32, 32]

[data]
num_train = 100
num_val = 50
batch_size = 20

[optimizer]
name = "adam"
lr = 0.01
"""
STEPS = 20

# Band of the golden curve: rtol 1e-4. Measured on this config (2026-11-30): scaling the
# initial weights by (1 + 1e-6 * noise), far more than the last-bit differences between BLAS
# kernels on different CPUs, moved the curve by at most 5.4e-7 relative; 1 vs 2 torch threads
# by 0. Held out (2026-12-02, 100 fresh noise seeds, docs/tools/training_golden_heldout.py):
# at most 1.65e-6, none near the band. Real regressions move the final loss by 19% (lr x2) to
# 300% (SGD for Adam), so the band is ~60x wider than the noise and ~2000x narrower than the
# smallest regression measured.
GOLDEN_RTOL, GOLDEN_ATOL = 1e-4, 0.0

SCHEMAS = Path(checkpoint_module.__file__).parent


def run_entry_point(config: Path, run_dir: Path) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "reference_impls.training",
            "--config",
            config,
            "--run-dir",
            run_dir,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two complete runs of the same config, in separate processes."""
    root = tmp_path_factory.mktemp("seed_check")
    config = root / "config.toml"
    config.write_text(CONFIG)
    first, second = root / "first", root / "second"
    for run_dir in (first, second):
        result = run_entry_point(config, run_dir)
        assert (result["step"], result["stop_reason"]) == (STEPS, "max_epochs"), result
    return first, second


def metric(run_dir: Path, kind: str, key: str) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row[key] for row in rows if row["kind"] == kind]


def test_twenty_seeded_steps_give_identical_losses_and_weights_in_two_processes(runs):
    first, second = runs

    assert len(metric(first, "train", "loss")) == STEPS
    # Exact: the same seed and thread count in both processes.
    assert metric(first, "train", "loss") == metric(second, "train", "loss")
    a = load_checkpoint(first / "latest.pt")["model"]
    b = load_checkpoint(second / "latest.pt")["model"]
    assert_equal(a, b, bitwise=True)


def test_the_loss_is_finite_and_decreases(runs):
    losses = metric(runs[0], "train", "loss")
    val = metric(runs[0], "val", "val_loss")

    assert all(math.isfinite(v) for v in losses + val)
    # Single mini-batch losses are noisy (batches of 20): compare means of five steps. The
    # recorded run goes from 1.11 to 0.24; "halved" is the claim that the model learns.
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    assert val[-1] < val[0]


def test_the_loss_curve_and_final_validation_loss_match_the_golden(runs, golden):
    band = {"rtol": GOLDEN_RTOL, "atol": GOLDEN_ATOL}
    golden.check("train_loss_curve", metric(runs[0], "train", "loss"), **band)
    golden.check("final_val_loss", metric(runs[0], "val", "val_loss")[-1], **band)


def test_a_model_rebuilt_from_the_checkpoint_alone_reproduces_its_validation_loss(runs, tmp_path):
    state = load_checkpoint(runs[0] / "latest.pt")
    copy = tmp_path / "copy.pt"
    save_checkpoint(state, copy)
    reloaded = load_checkpoint(copy)

    # The checkpoint describes itself: its config rebuilds the model and the validation data.
    config = TrainConfig.from_dict(reloaded["config"])
    model = build_model(config.model)
    model.load_state_dict(reloaded["model"])
    _, val = make_datasets(config.data, config.model, config.seed)
    with torch.no_grad():
        loss = (model(val.x) - val.y).square().mean(dtype=torch.float64).item()

    # float64 accumulation in both; only the order of the float32 sums differs.
    assert_close(loss, state["val_loss"], rtol=1e-6, atol=0.0)
    for key, value in state["model"].items():
        assert_equal(reloaded["model"][key], value, bitwise=True, msg=key)
    assert reloaded["optimizer"]["state"].keys() == state["optimizer"]["state"].keys()


def test_the_run_artifacts_match_their_declared_schemas(runs):
    checkpoint_schema = load_schema(SCHEMAS / "checkpoint_schema.toml")
    for name in ("latest.pt", "latest.prev.pt", "best.pt"):
        check(runs[0] / name, checkpoint_schema)
    rows = check(runs[0] / "metrics.jsonl", load_schema(SCHEMAS / "metrics_schema.toml"))
    assert len(rows) == STEPS + 4  # a train row per step, a val row per epoch
