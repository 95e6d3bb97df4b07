"""The breakdown callback on the project's Trainer, one process (no loop changes needed)."""

from __future__ import annotations

from reference_impls.scaling import StepProfiler, TrainerBreakdown
from reference_impls.training import TrainConfig, Trainer


def test_the_trainer_callback_records_every_step_but_the_first(tmp_path):
    config = TrainConfig.from_dict(
        {
            "seed": 0,
            "max_epochs": 100,
            "max_steps": 12,
            "val_every_steps": 5,
            "progress": False,
            "model": {"in_features": 8, "hidden": [16], "out_features": 1},
            "data": {"num_train": 64, "num_val": 16, "batch_size": 8},
            "optimizer": {"name": "adam", "lr": 1e-3},
            "early_stopping": {"patience": None},
        },
        source="test",
    )
    seen = []
    callback = TrainerBreakdown(StepProfiler(), on_record=seen.append)
    Trainer(config, tmp_path / "run", callbacks=[callback]).run(resume="never")
    callback.close()
    records = callback.profiler.records
    # 12 steps; step 1 has no start mark (the callback's first call installs the hooks). The
    # validations after steps 5 and 10 restart the step that follows them, so they are in none.
    assert len(records) == 11 == len(seen)
    assert [r.step for r in records] == sorted({r.step for r in records})
    for r in records:
        assert r.forward > 0 and r.backward > 0 and r.optimizer > 0 and r.data > 0
        assert r.comm == 0  # one process: no collectives
        assert r.measured <= r.wall + 1e-9
