"""Benchmarks of reference_impls.scaling: what the step breakdown costs a training step.

The breakdown's bound is <= 1% of step time and <= 1 KB per step per rank. Measured here, in
one run, on the training loop's model (``build_model``: MLP 64 -> 256 -> 256 -> 1, Adam, batches
of 32, one thread; ~1-2 ms per step on a CPU core):

- ``ProfilerOverhead``: CPU seconds for 100 steps, ``none`` (the bare loop), ``phases`` (the
  same loop with a ``StepProfiler`` step and four phases around it), ``phases+sink`` (also
  writing each record as a JSON line to a file), ``disabled`` (the context managers present,
  the profiler off: what an instrumented loop costs when not measuring).
- ``ProfilerCost``: CPU seconds for 1,000 steps of empty phases: the profiler alone (per step:
  divide by 1,000), with and without the JSON sink.
- ``ProfilerOverheadPerStep``: ``track_info_``: microseconds per step and the percentage of the
  bare step, from 5 interleaved ABBA pairs (a difference of two times: informational only).
- ``TrainerBreakdownOverhead``: ``Trainer.run()`` for 100 steps with and without the
  ``TrainerBreakdown`` callback (hooks on the module and the optimizer).
- ``RecordSize``: ``track_``: bytes of the largest JSON record of a step (deterministic).
- ``Attribution``: time and peak memory to attribute 1,000 steps of 64 ranks (64k records):
  the analysis side, which for trace-based tools is the expensive one.

Results: docs/benchmarks/scaling.md.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from reference_impls.scaling import StepProfiler, StepRecord, TrainerBreakdown, attribute_steps
from reference_impls.training import TrainConfig, Trainer, build_model
from reference_impls.training.config import ModelConfig

STEPS = 100
BATCH = 32
SMALL = {
    "seed": 20261130,
    "max_steps": STEPS,
    "max_epochs": 1000,
    "val_every_steps": STEPS,  # one validation and checkpoint, after the last step
    "progress": False,
    "num_threads": 1,
    "model": {"in_features": 64, "hidden": [256, 256]},
    "data": {"num_train": 320, "num_val": 32, "batch_size": BATCH},
    "optimizer": {"name": "adam", "lr": 1e-3},
    "early_stopping": {"patience": None},
}


class _Loop:
    """The bare step and the same step under the profiler, over one model and fixed batches."""

    def __init__(self, sink_dir: str | None = None) -> None:
        torch.manual_seed(20261130)
        torch.set_num_threads(1)
        self.model = build_model(ModelConfig(in_features=64, hidden=(256, 256), out_features=1))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(20261130)
        self.batches = [
            (torch.randn(BATCH, 64, generator=g), torch.randn(BATCH, 1, generator=g))
            for _ in range(10)
        ]  # (B, 64), (B, 1)
        self.sink = None
        if sink_dir is not None:
            self.sink = open(os.path.join(sink_dir, "rank0.jsonl"), "w")  # noqa: SIM115
        self.prof = StepProfiler(sink=self.sink, keep=False)

    def bare(self, steps: int = STEPS) -> None:
        model, opt = self.model, self.opt
        for i in range(steps):
            x, y = self.batches[i % 10]
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()

    def timed(self, steps: int = STEPS) -> None:
        model, opt, prof = self.model, self.opt, self.prof
        for i in range(steps):
            with prof.step():
                with prof.phase("data"):
                    x, y = self.batches[i % 10]
                opt.zero_grad(set_to_none=True)
                with prof.phase("forward"):
                    loss = F.mse_loss(model(x), y)
                with prof.phase("backward"):
                    loss.backward()
                with prof.phase("optimizer"):
                    opt.step()

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()


class ProfilerOverhead:
    """CPU seconds for 100 steps, bare and under the profiler (``timer = process_time``: on a
    shared machine wall time would also count other jobs' time slices)."""

    params = ["none", "phases", "phases+sink", "disabled"]
    param_names = ["timers"]
    number = 1
    repeat = (7, 10, 60.0)
    warmup_time = 0.0
    timer = time.process_time

    def setup(self, timers):
        self.dir = tempfile.mkdtemp(prefix="bench_scaling_")
        self.loop = _Loop(self.dir if timers == "phases+sink" else None)
        self.loop.prof.enabled = timers != "disabled"
        self.run = self.loop.bare if timers == "none" else self.loop.timed
        self.run(10)  # first-call costs outside the samples

    def teardown(self, timers):
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def time_100_steps(self, timers):
        self.run()


class ProfilerCost:
    """The profiler's own cost: 1,000 steps of four empty phases each (CPU time). Its cost per
    step, divided by a real step's time, is the overhead; unlike the difference of two loop
    timings it does not drown in the noise of a shared machine."""

    params = ["no sink", "json sink"]
    param_names = ["output"]
    number = 1
    repeat = (7, 10, 60.0)
    timer = time.process_time

    def setup(self, output):
        self.dir = tempfile.mkdtemp(prefix="bench_scaling_")
        self.sink = open(os.path.join(self.dir, "r.jsonl"), "w") if output == "json sink" else None  # noqa: SIM115
        self.prof = StepProfiler(sink=self.sink, keep=False)

    def teardown(self, output):
        if self.sink is not None:
            self.sink.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def time_1000_steps(self, output):
        prof = self.prof
        for _ in range(1000):
            with prof.step():
                with prof.phase("data"):
                    pass
                with prof.phase("forward"):
                    pass
                with prof.phase("backward"):
                    pass
                with prof.phase("optimizer"):
                    pass


class ProfilerOverheadPerStep:
    """``track_info_``: what the profiler (with its JSON sink) adds per step, from 5 ABBA pairs
    of 100 steps each in CPU time."""

    pairs = 5

    def setup(self):
        self.dir = tempfile.mkdtemp(prefix="bench_scaling_")
        self.loop = _Loop(self.dir)
        self.loop.bare(10)
        self.loop.timed(10)
        on, off = [], []
        for i in range(self.pairs):
            for kind in ("timed", "bare") if i % 2 == 0 else ("bare", "timed"):
                start = time.process_time()
                getattr(self.loop, kind)()
                (on if kind == "timed" else off).append(time.process_time() - start)
        self.on, self.off = statistics.median(on), statistics.median(off)

    def teardown(self):
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def track_info_overhead_us_per_step(self):
        return (self.on - self.off) / STEPS * 1e6

    track_info_overhead_us_per_step.unit = "us per step"  # type: ignore[attr-defined]

    def track_info_overhead_percent_of_step(self):
        return 100 * (self.on / self.off - 1)

    track_info_overhead_percent_of_step.unit = "%"  # type: ignore[attr-defined]


class TrainerBreakdownOverhead:
    """CPU seconds for ``Trainer.run()`` of 100 steps, with and without the breakdown callback."""

    params = ["none", "breakdown"]
    param_names = ["callback"]
    number = 1
    repeat = (7, 10, 60.0)
    warmup_time = 0.0
    timer = time.process_time

    def setup(self, callback):
        self.config = TrainConfig.from_dict(SMALL)
        self.dirs: list[str] = []
        torch.set_num_threads(1)

    def teardown(self, callback):
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)

    def time_trainer_100_steps(self, callback):
        run_dir = tempfile.mkdtemp(prefix="bench_scaling_trainer_")
        self.dirs.append(run_dir)
        callbacks = [TrainerBreakdown(StepProfiler())] if callback == "breakdown" else []
        Trainer(self.config, run_dir, callbacks=callbacks).run(resume="never")


class RecordSize:
    """Bytes of one step's record on disk (JSON line with its newline), the largest of 100."""

    unit = "bytes per step per rank"

    def setup(self):
        self.loop = _Loop()
        self.loop.prof.keep = True
        self.loop.timed()

    def track_record_bytes(self):
        return max(len(r.to_json().encode()) + 1 for r in self.loop.prof.records)


class Attribution:
    """Attributing 1,000 steps x 64 ranks of records (transfer vs waiting, per step)."""

    number = 1
    repeat = (7, 10, 60.0)

    def setup(self):
        g = torch.Generator().manual_seed(20261130)
        u = torch.rand(1000, 64, 5, generator=g, dtype=torch.float64).tolist()
        self.records = [
            StepRecord(
                step=s,
                rank=r,
                wall=sum(u[s][r]) * 1e-3 + 1e-4,
                data=u[s][r][0] * 1e-3,
                forward=u[s][r][1] * 1e-3,
                backward=u[s][r][2] * 1e-3,
                optimizer=u[s][r][3] * 1e-3,
                comm=u[s][r][4] * 1e-3,
            )
            for s in range(1000)
            for r in range(64)
        ]

    def time_attribute_64k_records(self):
        attribute_steps(self.records)

    def peakmem_attribute_64k_records(self):
        attribute_steps(self.records)
