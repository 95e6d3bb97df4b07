"""``python -m reference_impls.training`` when a run cannot finish well, as real processes:
Ctrl-C (a real SIGINT) prints where it stopped and a resume command that works, and exits
130; a diverging run exits 3 keeping its last good checkpoint; a run directory that is a file
exits 2 at once. No traceback in any of them.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from reference_impls.training import load_checkpoint

# Long enough never to end by itself (~1 ms per step, 100,000 epochs of 2 steps): the test
# decides when it stops. Validation, and so latest.pt, at the end of every epoch.
LONG_CONFIG = """
max_epochs = 100000
progress = false
num_threads = 1

[model]
in_features = 4
hidden = [8]

[data]
num_train = 20
num_val = 10
batch_size = 10

[early_stopping]
patience = 0
"""


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "reference_impls.training", *args]


def _default_sigint() -> None:
    # A shell without job control starts background jobs with SIGINT ignored, and a child
    # inherits that; Python then keeps ignoring it and the Ctrl-C below would never arrive.
    # A terminal's foreground job has the default disposition: give the child that.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(path: Path, process: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.05)


def test_ctrl_c_prints_where_it_stopped_and_a_resume_command_that_works(tmp_path):
    config = tmp_path / "long.toml"
    config.write_text(LONG_CONFIG)
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        cli("--config", str(config), "--run-dir", str(run_dir)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    try:
        wait_for(run_dir / "latest.pt", process)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert process.returncode == 130, err
    assert "Traceback" not in err and out == "", err
    result = json.loads((run_dir / "result.json").read_text())
    assert result["stop_reason"] == "interrupted"
    saved = load_checkpoint(run_dir / "latest.pt")
    step, epoch = result["step"], result["stop_epoch"]
    assert f"interrupted after step {step} (epoch {epoch})" in err
    assert f"the last checkpoint is {run_dir / 'latest.pt'} (step {saved['step']}, " in err
    lines = err.splitlines()
    command = lines[lines.index("resume with:") + 1].strip()

    # The printed command, as printed, continues from that checkpoint (stopped 3 steps later).
    stop_at = saved["step"] + 3
    resumed = subprocess.run(
        [*shlex.split(command), "--set", f"max_steps={stop_at}"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert resumed.returncode == 0, resumed.stderr
    final = json.loads(resumed.stdout)
    assert final["resumed_from"] == str(run_dir / "latest.pt")
    assert (final["stop_reason"], final["step"], final["steps_run"]) == ("max_steps", stop_at, 3)


def test_a_diverging_run_exits_3_naming_the_step_and_keeps_no_non_finite_checkpoint(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(LONG_CONFIG.replace("max_epochs = 100000", "max_epochs = 3"))
    run_dir = tmp_path / "run"

    done = subprocess.run(
        cli("--config", str(config), "--run-dir", str(run_dir), "--set", "optimizer.lr=1e30"),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert "error: training diverged: the train loss is nan at step" in done.stderr
    assert "Lower optimizer.lr (now 1e+30)" in done.stderr
    assert json.loads((run_dir / "result.json").read_text())["stop_reason"] == "diverged"
    for name in ("latest.pt", "best.pt"):  # the loss is NaN before the first validation
        assert not (run_dir / name).exists()


def test_a_run_directory_that_is_a_file_exits_2_before_any_set_up(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(LONG_CONFIG)
    target = tmp_path / "run"
    target.write_text("keep me")

    done = subprocess.run(
        cli("--config", str(config), "--run-dir", str(target)),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )

    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"[rank 0] error: run directory {target} is a file, not a directory: give a directory "
        "(a missing one is created)"
    )
    assert target.read_text() == "keep me"
