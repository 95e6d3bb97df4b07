"""Benchmarks of reference_impls.training: checkpoint throughput and the loop's per-step cost.

Checkpoints (target: atomic durability costs at most 10% at 100 MB): one real
checkpoint of ~100 MB (an 8.4M-parameter MLP with its Adam moments, written by the Trainer
in ``setup_cache``), saved and loaded by

- ``torch.save`` / ``torch.load(weights_only=True)``: plain, into the page cache, not durable
  (``torch.save`` over the previous file, as a loop saving ``ckpt.pt`` every epoch does; and
  ``torch.save(new file)``, a fresh name each time: ``CheckpointSaveNewFile``, shown, not
  gated);
- ``save_checkpoint``: ``CheckpointStore.save``, what ``latest.pt`` gets at every validation:
  the oldest generation's file reused, writeback started every 8 MiB, fdatasync, the
  generations moved down one name, rename, directory fsync;
- ``save_checkpoint(one file)``: the same durable write into a new file that replaces the
  previous one (no generations): against ``torch.save``, the cost of durability alone;
- ``load_checkpoint``: CRC-32 of every record, ``torch.load``, key checks (``verify=False``:
  without the CRC pass).

All variants of a class run in the same asv run on the same machine; ``track_info_*`` methods
report the ratio of interleaved pairs (ABBA), which the gate shows without gating on
(suites/benchmarks/README.md, item 6). Results: docs/benchmarks/training.md.

Loop overhead: 200 optimizer steps of a small MLP (the integration check's model, batches of
20, one thread) through ``Trainer.run()`` (scheduler, a metrics row every step, one
validation and checkpoint at the end) against a bare ``zero_grad/forward/backward/step`` loop
over the same batches, in CPU time.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import torch

from reference_impls.training import (
    BatchOrder,
    CheckpointStore,
    TrainConfig,
    Trainer,
    build_model,
    load_checkpoint,
    make_datasets,
    save_checkpoint,
)

# 1024 -> 2048 -> 2048 -> 1024: 8.4M float32 parameters (33.6 MB) plus Adam's two moments:
# 100.7 MB of tensors in the checkpoint.
BIG = {
    "seed": 20261130,
    "max_steps": 1,
    "progress": False,
    "num_threads": 1,
    "model": {"in_features": 1024, "hidden": [2048, 2048], "out_features": 1024},
    "data": {"num_train": 16, "num_val": 16, "batch_size": 16},
}
SMALL = {
    "seed": 20261130,
    "max_epochs": 40,
    "val_every_steps": 200,  # validate (and checkpoint) once, after the last step
    "progress": False,
    "num_threads": 1,
    "model": {"in_features": 8, "hidden": [32, 32]},
    "data": {"num_train": 100, "num_val": 50, "batch_size": 20},
    "optimizer": {"name": "adam", "lr": 0.01},
    "early_stopping": {"patience": None},
}
STEPS = 200

_STATES: dict[str, dict] = {}  # checkpoint path -> loaded state, once per process; never changed


def _state(path: str) -> dict:
    if path not in _STATES:
        _STATES[path] = load_checkpoint(path)
    return _STATES[path]


def _megabytes(state: dict) -> float:
    total = 0
    for part in (state["model"], *state["optimizer"]["state"].values()):
        tensors = [t for t in part.values() if isinstance(t, torch.Tensor)]
        total += sum(t.numel() * t.element_size() for t in tensors)
    return total / 1e6


class _BigCheckpoint:
    """Shared setup_cache (asv keys it by function): one ~100 MB checkpoint per run."""

    harness_counts = False  # writes and reads files: not an instruction count (README.md, 9)

    timeout = 600
    number = 1
    repeat = (7, 10, 120.0)
    rounds = 1
    warmup_time = 0.0

    def setup_cache(self):
        root = os.path.abspath("training_checkpoints")  # asv's temporary folder for this run
        Trainer(TrainConfig.from_dict(BIG), root).run(resume="never")
        return os.path.join(root, "latest.pt")

    def _scratch(self) -> str:
        self.scratch = tempfile.mkdtemp(prefix="bench_training_", dir=os.path.dirname(self.source))
        return self.scratch

    def teardown(self, *args):
        shutil.rmtree(getattr(self, "scratch", ""), ignore_errors=True)


def _settle() -> None:
    """Write back every dirty page before a timed call, outside the timing. A plain torch.save
    returns with its 100 MB still to be written; without this, that writeback would land on
    whichever call runs next (often a durable one, which waits for the disk). Checkpoints are
    written minutes apart in training, so each call starting from a clean page cache is the
    realistic case; it also leaves torch.save's own deferred writeback out of its time."""
    os.sync()


def _save(method: str, state: dict, directory: str) -> None:
    if method == "torch.save":
        torch.save(state, os.path.join(directory, "plain.pt"))
    elif method == "torch.save(new file)":
        torch.save(state, tempfile.mktemp(suffix=".pt", dir=directory))  # noqa: S306 - a fresh name
    elif method == "save_checkpoint(one file)":
        # Durable and atomic, no generations: a new file replaces the old one, which is freed,
        # as torch.save's truncation frees it. The difference to torch.save is durability alone.
        save_checkpoint(state, os.path.join(directory, "one.pt"))
    else:
        CheckpointStore(directory).save(state, best=False)  # what the Trainer does at a validation


def _load(method: str, path: str) -> None:
    if method == "torch.load":
        torch.load(path, map_location="cpu", weights_only=True)
    else:
        load_checkpoint(path, verify=method == "load_checkpoint")


class CheckpointSave(_BigCheckpoint):
    """Seconds to write the ~100 MB checkpoint (one write per sample, over the previous one)."""

    params = ["torch.save", "save_checkpoint(one file)", "save_checkpoint"]
    param_names = ["method"]

    def setup(self, source, method):
        self.source = source
        self.state = _state(source)
        scratch = self._scratch()
        for _ in range(3):  # the steady state: torch.save replaces a file, save_checkpoint
            _save(method, self.state, scratch)  # reuses the oldest of three generations
        _settle()

    def time_save(self, source, method):
        _save(method, self.state, self.scratch)


class CheckpointSaveNewFile(_BigCheckpoint):
    """Seconds to write the ~100 MB checkpoint to a fresh name every time (nothing freed,
    nothing durable): the reference that docs/benchmarks/training.md compares the others with.

    ``time_info_``: shown, never gated (suites/benchmarks/README.md, item 6). Its CPU time per
    write jumped between ~0.09 and ~0.35 s from sample to sample of one process (a new file's
    block allocation, and the kernel's writeback of earlier files charged to whichever write
    runs then): the gate's A/B read unchanged code as 1.02 [0.30, 3.55] after 53 pairs
    (2026-12-03, docs/perf.md), and what it times is torch's and the kernel's code, not ours.
    """

    def setup(self, source):
        self.source = source
        self.state = _state(source)
        scratch = self._scratch()
        for _ in range(3):
            _save("torch.save(new file)", self.state, scratch)
        _settle()

    def time_info_save(self, source):
        _save("torch.save(new file)", self.state, self.scratch)


class CheckpointLoad(_BigCheckpoint):
    """Seconds to read the ~100 MB checkpoint back (from the page cache)."""

    params = ["torch.load", "load_checkpoint", "load_checkpoint(verify=False)"]
    param_names = ["method"]

    def setup(self, source, method):
        self.source = source
        _load(method, source)  # page cache warm for every variant alike

    def time_load(self, source, method):
        _load(method, self.source)


class CheckpointThroughput(_BigCheckpoint):
    """MB/s of each path: the checkpoint's tensor bytes over the median of 5 calls.

    ``track_info_``: a throughput is a wall time in disguise; the ``time_`` benchmarks above
    are the gated ones.
    """

    params = ["torch.save", "save_checkpoint", "torch.load", "load_checkpoint"]
    param_names = ["method"]
    unit = "MB/s"
    calls = 5

    def setup(self, source, method):
        self.source = source
        self.state = _state(source)
        self.megabytes = _megabytes(self.state)
        self._scratch()
        saving = method in ("torch.save", "save_checkpoint")
        if saving:
            self.call = lambda: _save(method, self.state, self.scratch)
        else:
            self.call = lambda: _load(method, source)
        for _ in range(3 if saving else 1):  # the steady state (files to replace), a warm cache
            self.call()

    def track_info_mb_per_s(self, source, method):
        times = []
        for _ in range(self.calls):
            _settle()
            start = time.perf_counter()
            self.call()
            times.append(time.perf_counter() - start)
        return self.megabytes / statistics.median(times)


class CheckpointOverhead(_BigCheckpoint):
    """What durability costs on save and verification on load, in % of plain torch.save /
    torch.load, from 5 interleaved pairs (ABBA) in one process."""

    unit = "%"
    pairs = 5

    def setup(self, source):
        self.source = source
        self.state = _state(source)
        self._scratch()
        for _ in range(3):  # the steady state for all: files to replace, generations to reuse
            for method in ("torch.save", "save_checkpoint(one file)", "save_checkpoint"):
                _save(method, self.state, self.scratch)

    def _pairs(self, a, b) -> tuple[list[float], list[float]]:
        times_a, times_b = [], []
        for i in range(self.pairs):
            order = ((a, times_a), (b, times_b)) if i % 2 == 0 else ((b, times_b), (a, times_a))
            for fn, times in order:
                _settle()
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
        return times_a, times_b

    def _save_overhead(self, method: str) -> float:
        durable, plain = self._pairs(
            lambda: _save(method, self.state, self.scratch),
            lambda: _save("torch.save", self.state, self.scratch),
        )
        return 100.0 * (statistics.median(durable) / statistics.median(plain) - 1.0)

    def track_info_save_durability_overhead_percent(self, source):
        """save_checkpoint(one file) vs torch.save: what fsync, rename and directory sync cost."""
        return self._save_overhead("save_checkpoint(one file)")

    def track_info_store_save_overhead_percent(self, source):
        """CheckpointStore.save (generations, the oldest reused) vs torch.save."""
        return self._save_overhead("save_checkpoint")

    def track_info_load_verification_overhead_percent(self, source):
        verified, plain = self._pairs(
            lambda: _load("load_checkpoint", source), lambda: _load("torch.load", source)
        )
        return 100.0 * (statistics.median(verified) / statistics.median(plain) - 1.0)


def _bare_loop(config: TrainConfig) -> None:
    """The same steps as Trainer.run() without anything around them."""
    torch.manual_seed(config.seed)
    train, _ = make_datasets(config.data, config.model, config.seed)
    model = build_model(config.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.optimizer.lr)
    order = BatchOrder(config.data.num_train, config.data.batch_size, seed=config.seed)
    for step in range(STEPS):
        epoch, batch = divmod(step, order.steps_per_epoch)
        index = order.local_batch(epoch, batch)
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(train.x[index]), train.y[index])
        loss.backward()
        optimizer.step()


class LoopOverhead:
    """CPU seconds for 200 steps of the small MLP: ``Trainer.run()`` vs the bare loop.

    ``timer = time.process_time``: both loops are single-threaded and CPU-bound; on a machine
    shared with other jobs, wall time would also count their time slices.
    """

    params = ["bare", "trainer"]
    param_names = ["loop"]
    number = 1
    repeat = (7, 10, 60.0)
    warmup_time = 0.0
    timer = time.process_time

    def setup(self, loop):
        self.config = TrainConfig.from_dict(SMALL)
        self.run_dir = tempfile.mkdtemp(prefix="bench_training_loop_")
        torch.set_num_threads(1)
        _bare_loop(self.config)  # imports and first-call costs outside the samples

    def teardown(self, loop):
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def time_200_steps(self, loop):
        if loop == "bare":
            _bare_loop(self.config)
        else:
            Trainer(self.config, self.run_dir).run(resume="never")


class LoopOverheadPerStep:
    """CPU microseconds per step that Trainer.run() adds to the bare loop (5 ABBA pairs;
    its fixed costs, ~2 ms for building and one final checkpoint, spread over the 200 steps)."""

    unit = "us per step"
    pairs = 5

    def setup(self):
        self.config = TrainConfig.from_dict(SMALL)
        torch.set_num_threads(1)
        _bare_loop(self.config)

    def track_info_loop_overhead_us_per_step(self):
        trainer, bare = [], []
        for i in range(self.pairs):
            order = ("trainer", "bare") if i % 2 == 0 else ("bare", "trainer")
            for loop in order:
                run_dir = tempfile.mkdtemp(prefix="bench_training_loop_")
                start = time.process_time()
                if loop == "bare":
                    _bare_loop(self.config)
                else:
                    Trainer(self.config, run_dir).run(resume="never")
                (trainer if loop == "trainer" else bare).append(time.process_time() - start)
                shutil.rmtree(run_dir, ignore_errors=True)
        return (statistics.median(trainer) - statistics.median(bare)) / STEPS * 1e6
