"""Exact resume: a training process killed with SIGKILL again and again, each time resumed from
its run directory, ends bit-identical to a run that was never interrupted (CPU).

The run has everything that makes resume hard: dropout (torch's RNG), Adam moments, a cosine
schedule, validation every 4 steps with 6 steps per epoch (so most checkpoints are taken in
the middle of an epoch) and early stopping. Kills land after a chosen number of steps and at
each phase of a checkpoint write: the temporary file half written, complete but not renamed,
the old ``latest.pt`` rotated away before the new one is renamed in, renamed but the
directory not synced, and ``best.pt`` published before ``latest.pt`` moved on.

Each killed process delivers SIGKILL to itself at the chosen point (hooks installed by the
small runner below), so every kill is known to land where intended and the schedule, drawn
from the test's seed, replays exactly with ``--harness-seed``. SIGKILL cannot be caught: the
training code gets no chance to clean up, as with the OOM killer or a preempted node.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import torch

from harness import assert_equal
from reference_impls.training import load_checkpoint

# A fixed config seed: the schedule of kills below needs to know how long the run is (early
# stopping at step 88 of 240 planned, best at step 68, measured on this config; the test
# asserts the length it relies on).
CONFIG = """
seed = 20261130
max_epochs = 40
val_every_steps = 4
progress = false
num_threads = 1

[model]
in_features = 8
hidden = [32, 32]
dropout = 0.1

[data]
num_train = 96
num_val = 48
batch_size = 16

[optimizer]
name = "adam"
lr = 0.003

[scheduler]
name = "cosine"

[early_stopping]
patience = 5
"""

RUNNER = r'''
"""Train CONFIG in RUN_DIR, SIGKILLing this process at the point FAULT names."""
import json, os, signal, sys

from reference_impls.training import Callback, Trainer, load_config
from reference_impls.training import checkpoint_io

config_path, run_dir, fault = sys.argv[1:]
kind, _, arg = fault.partition("=")
# FAULT's kinds and the checkpoint writer's fault points (checkpoint_io.FAULT_POINTS):
# partial: the temporary file only partly written; synced: complete and synced, not yet
# renamed; rotated: latest.pt renamed to latest.prev.pt, the new one not renamed in;
# renamed: renamed in, the directory not yet synced; best: best.pt published, latest.pt not
# yet moved on. ARG counts latest.pt writes of this process (1: the first).
POINT = {"partial": "chunk", "synced": "synced", "rotated": "rotated", "renamed": "renamed"}
saves = 0


def die():
    os.kill(os.getpid(), signal.SIGKILL)


class KillAfterSteps(Callback):
    def on_step_end(self, trainer):
        if trainer.steps_run == int(arg):
            die()


def hook(point, path):
    global saves
    if point == "start":
        saves += 1
    elif kind == "best" and point == "published":
        die()
    elif point == POINT.get(kind) and saves == int(arg):
        die()


callbacks = []
if kind == "steps":  # after this many optimizer steps of this process
    callbacks.append(KillAfterSteps())
elif kind in (*POINT, "best"):
    # Many small writes for "partial", so that there is a middle of the file to stop in.
    checkpoint_io.set_fault_hook(hook, gather_bytes=512 if kind == "partial" else None)
elif kind != "none":
    sys.exit(f"unknown fault {fault!r}")

result = Trainer(load_config(config_path), run_dir, callbacks=callbacks).run()
print(json.dumps(result.to_dict()))
'''

WRITE_PHASES = ("partial", "synced", "rotated", "renamed")


def run_training(tmp_path: Path, run_dir: Path, fault: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, tmp_path / "runner.py", tmp_path / "config.toml", run_dir, fault],
        capture_output=True,
        text=True,
        timeout=120,
    )


def kill_schedule(seed: int) -> list[str]:
    """Six kills: best.pt's publication first (improvements are frequent early on, so the
    first process is sure to reach one), then each write phase and a kill between steps, in
    an order and at points drawn from the seed. Each process dies within 12 steps (the arg
    of a write phase counts latest.pt writes, one every 4 steps), so six of them stay well
    inside the 88 steps of the run."""
    rng = random.Random(seed)
    rest = [f"{phase}={rng.randint(1, 3)}" for phase in WRITE_PHASES]
    rest.append(f"steps={rng.randint(1, 12)}")
    rng.shuffle(rest)
    return ["best", *rest]


def rows_without_time(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time"} for r in rows if r["kind"] != "event"]


def assert_bit_identical(actual: dict, expected: dict, what: str) -> None:
    assert actual.keys() == expected.keys(), what
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert_equal(actual[key], value, bitwise=True, msg=f"{what}: {key} differs")
        elif isinstance(value, dict):
            assert_bit_identical(actual[key], value, f"{what}.{key}")
        else:
            assert actual[key] == value, f"{what}: {key}: {actual[key]!r} != {value!r}"


def test_a_run_killed_six_times_and_resumed_ends_bit_identical_to_an_uninterrupted_one(
    tmp_path, seed
):
    (tmp_path / "config.toml").write_text(CONFIG)
    (tmp_path / "runner.py").write_text(RUNNER)
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"

    done = run_training(tmp_path, reference_dir, "none")
    assert done.returncode == 0, done.stderr
    reference = json.loads(done.stdout.splitlines()[-1])
    assert reference["stop_reason"] == "early_stopping" and reference["step"] >= 80, reference

    schedule = kill_schedule(seed)
    for fault in schedule:
        proc = run_training(tmp_path, killed_dir, fault)
        assert proc.returncode == -signal.SIGKILL, (
            f"fault {fault!r} did not fire (exit {proc.returncode}); schedule {schedule}\n"
            f"{proc.stderr[-3000:]}"
        )
    done = run_training(tmp_path, killed_dir, "none")
    assert done.returncode == 0, done.stderr
    resumed = json.loads(done.stdout.splitlines()[-1])

    same = ("stop_reason", "stop_epoch", "step", "best_val_loss", "best_step", "best_epoch",
            "checks_without_improvement", "last_val_loss")  # fmt: skip
    assert {k: resumed[k] for k in same} == {k: reference[k] for k in same}
    assert resumed["resumed_from"] is not None
    for name in ("latest.pt", "best.pt"):
        expected, actual = load_checkpoint(reference_dir / name), load_checkpoint(killed_dir / name)
        for key in ("model", "optimizer", "scheduler", "early_stopping", "position", "rng"):
            assert_bit_identical(actual[key], expected[key], f"{name}:{key}")
        assert (actual["step"], actual["epoch"]) == (expected["step"], expected["epoch"])
    # The log the killed processes wrote past their last checkpoint was cut back on resume.
    assert rows_without_time(killed_dir) == rows_without_time(reference_dir)
    assert not [p.name for p in killed_dir.iterdir() if ".tmp" in p.name]
