"""The real run's configuration: every bad value is refused before a process starts."""

from __future__ import annotations

import pytest

from reference_impls.async_sgd import make_policy
from reference_impls.async_sgd.distributed import TrainConfig, run_rank

POLICY = make_policy()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"updates": 0}, "updates must be an int >= 1, got 0"),
        ({"lr": -0.1}, "lr must be > 0, got -0.1"),
        ({"slowdown": 0.5}, "slowdown must be >= 1, got 0.5"),
        ({"heartbeat_s": 2.0, "dead_after_s": 1.0}, "need 0 < heartbeat_s < dead_after_s"),
        ({"checkpoint_every": 5}, "checkpoints need out_dir"),
        ({"resume": "x.pt"}, "checkpoints need out_dir"),
        ({"target_loss": 0.1, "eval_every": 0}, "target_loss needs eval_every >= 1"),
    ],
    ids=["updates", "lr", "slowdown", "heartbeat", "ckpt", "resume", "target"],
)
def test_bad_train_config_names_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(policy=POLICY, **kwargs)


def test_a_server_without_workers_is_refused():
    with pytest.raises(ValueError, match="world size >= 2"):
        run_rank(0, 1, TrainConfig(policy=POLICY))
