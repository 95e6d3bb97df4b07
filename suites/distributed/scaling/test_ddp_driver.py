"""The data-parallel scaling driver (python -m reference_impls.scaling.ddp, formerly
reference_impls.training.scaling), on CPU with gloo.

Timings on a shared 2-core machine mean nothing, so this checks the driver's bookkeeping, not
its numbers: every case ran, the derived columns follow from the measured ones, and the
Trainer gives the same validation loss at 1 and 2 workers (same global batch, same seed).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def scaling(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling")
    cmd = [
        sys.executable,
        "-m",
        "reference_impls.scaling.ddp",
        "--device",
        "cpu",
        "--gpus",
        "1,2",
        "--in-features",
        "16",
        "--hidden",
        "32,32",
        "--global-batch",
        "16",
        "--per-gpu-batch",
        "8",
        "--precisions",
        "fp32",
        "--warmup",
        "1",
        "--steps",
        "3",
        "--blocks",
        "1",
        "--comm-reps",
        "2",
        "--trainer-steps",
        "2",
        "--no-cli-check",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "scaling.json").read_text())


def test_every_precision_scaling_and_worker_count_has_a_row(scaling):
    cases = {(r["precision"], r["scaling"], r["gpus"]) for r in scaling["table"]}
    assert cases == {("fp32", s, g) for s in ("strong", "weak") for g in (1, 2)}


def test_speedup_and_efficiency_follow_from_the_measured_throughput(scaling):
    rows = {(r["scaling"], r["gpus"]): r for r in scaling["table"]}
    for kind in ("strong", "weak"):
        base, two = rows[(kind, 1)], rows[(kind, 2)]
        assert two["global_batch"] == (16 if kind == "strong" else 2 * base["global_batch"])
        # samples/s is the global batch over the median step time
        assert two["samples_per_s"] == pytest.approx(
            two["global_batch"] / (two["step_ms"] / 1e3), rel=1e-9
        )
        assert two["speedup"] == pytest.approx(
            two["samples_per_s"] / base["samples_per_s"], rel=1e-9
        )
        assert two["efficiency"] == pytest.approx(two["speedup"] / 2, rel=1e-9)
        assert 0.0 <= two["comm_share"] <= 1.0
        assert two["comm_share"] == pytest.approx(
            1 - two["no_sync_step_ms"] / two["step_ms"], abs=1e-9
        )


def test_the_trainer_reaches_the_same_loss_on_one_and_two_workers(scaling):
    one, two = scaling["trainer"]["1"], scaling["trainer"]["2"]
    assert one["stop_reason"] == two["stop_reason"] == "max_steps"
    # Same global batch and seed: the two-rank mean of half-batch gradients equals the
    # one-rank full-batch gradient up to float32 summation order (~1e-7 relative).
    assert two["last_val_loss"] == pytest.approx(one["last_val_loss"], rel=1e-5)


def test_the_former_module_still_runs_the_driver(capsys):
    from reference_impls.scaling import ddp
    from reference_impls.training import scaling as former

    assert former.main is ddp.main  # python -m reference_impls.training.scaling calls it
    with pytest.raises(SystemExit) as exc:
        former.main(["--help"])
    assert exc.value.code == 0
    assert "usage: python -m reference_impls.scaling.ddp" in capsys.readouterr().out
