"""The transport-free parameter server and the simulator: exactness, bad pushes, checkpoints."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils import parameters_to_vector

from harness import assert_equal
from reference_impls.async_sgd import (
    ParameterServer,
    Problem,
    ProblemConfig,
    PushError,
    SimConfig,
    UpdateStatus,
    WorkerSpeed,
    make_policy,
    simulate,
    speed_profile,
)

SMALL = ProblemConfig(samples=256, dim=8, batch_size=8, seed=3)


def sgd_reference(problem: Problem, steps: int, lr: float, momentum: float) -> torch.Tensor:
    """torch.optim.SGD on the same module and the same minibatches (one worker's stream)."""
    module = problem.build_module()
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=momentum)
    for k in range(steps):
        opt.zero_grad()
        problem.loss_fn(module, problem.batch_indices(0, 1, k)).backward()
        opt.step()
    return parameters_to_vector(module.parameters()).detach()


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("lr_policy", ["inverse", "alpha-over-s", "constant"])
def test_one_worker_has_staleness_zero_and_equals_torch_sgd_bit_for_bit(lr_policy, momentum):
    problem = Problem(SMALL)
    config = SimConfig(
        policy=make_policy(lr_policy, momentum=momentum),
        problem=SMALL,
        speeds=(WorkerSpeed(),),
        updates=30,
        lr=0.2,
    )
    result = simulate(config, problem)
    assert {r.staleness for r in result.log} == {0}
    assert_equal(result.params, sgd_reference(problem, 30, 0.2, momentum), bitwise=True)


def test_the_reference_comparison_can_fail():
    # Same setup, one update fewer: must differ, or the equality above proves nothing.
    problem = Problem(SMALL)
    config = SimConfig(
        policy=make_policy(), problem=SMALL, speeds=(WorkerSpeed(),), updates=29, lr=0.2
    )
    with pytest.raises(AssertionError, match="Mismatched elements"):
        assert_equal(simulate(config, problem).params, sgd_reference(problem, 30, 0.2, 0))


def test_staleness_is_version_at_apply_minus_version_pulled():
    server = ParameterServer(torch.zeros(3), lr=1.0, policy=make_policy(), workers=[0, 1])
    _, v0 = server.snapshot()
    server.push(0, torch.ones(3), v0, seq=0, loss=0.0, time_s=0.0)
    server.push(0, torch.ones(3), 1, seq=1, loss=0.0, time_s=0.0)
    rec = server.push(1, torch.ones(3), v0, seq=0, loss=0.0, time_s=0.0)
    assert (rec.staleness, rec.lr_factor, rec.version) == (2, 1 / 3, 3)
    # params: -1 - 1 - 1/3 in each element (lr 1, factors 1, 1, 1/3)
    assert_equal(server.params, torch.full((3,), -1.0 - 1.0 - 1.0 / 3.0), bitwise=True)


@pytest.mark.parametrize(
    ("grad", "version", "worker", "match"),
    [
        (torch.ones(4), 0, 0, r"shape \(4,\); the parameters have shape \(3,\)"),
        (torch.ones(3, 1), 0, 0, r"shape \(3, 1\)"),
        (torch.ones(3, dtype=torch.float64), 0, 0, "torch.float64 gradient"),
        (torch.ones(3), 5, 0, "version 5; the server is at version 0"),
        (torch.ones(3), -1, 0, "version -1"),
        (torch.ones(3), 0, 7, "unknown worker 7"),
        (torch.tensor([1.0, float("nan"), 0.0]), 0, 0, "NaN or inf"),
    ],
    ids=["numel", "2d", "dtype", "future", "negative", "unknown", "nan"],
)
def test_a_bad_push_raises_and_changes_nothing(grad, version, worker, match):
    server = ParameterServer(torch.zeros(3), lr=1.0, policy=make_policy(), workers=[0])
    with pytest.raises(PushError, match=match):
        server.push(worker, grad, version, seq=0, loss=0.0, time_s=0.0)
    assert_equal(server.params, torch.zeros(3), bitwise=True)
    assert (server.version, server.clocks, server.log) == (0, {0: 0}, [])


def test_a_dead_workers_push_is_refused():
    server = ParameterServer(torch.zeros(3), lr=1.0, policy=make_policy(), workers=[0, 1])
    assert server.mark_dead(1, 2.5, "test") is not None
    assert server.mark_dead(1, 3.0, "again") is None  # declared once
    with pytest.raises(PushError, match="worker 1 was declared dead"):
        server.push(1, torch.ones(3), 0, seq=0, loss=0.0, time_s=0.0)
    assert server.may_start(0)  # the dead worker does not hold the gate


def test_reject_applies_nothing_above_s_max_and_logs_it():
    server = ParameterServer(
        torch.zeros(2), lr=1.0, policy=make_policy(bound="reject", s_max=1), workers=[0, 1]
    )
    server.push(0, torch.ones(2), 0, seq=0, loss=0.0, time_s=0.0)
    server.push(0, torch.ones(2), 1, seq=1, loss=0.0, time_s=0.0)
    rec = server.push(1, torch.ones(2), 0, seq=0, loss=0.0, time_s=0.0)
    assert rec.status is UpdateStatus.REJECTED_STALE and rec.staleness == 2
    assert server.version == 2 and server.clocks[1] == 1
    assert dict(server.counts) == {"applied": 2, "rejected_stale": 1}


def test_checkpoint_round_trip_keeps_params_momentum_versions_and_clocks(tmp_path):
    policy = make_policy(momentum=0.5)
    server = ParameterServer(torch.zeros(3), lr=0.1, policy=policy, workers=[1, 2])
    for seq in range(3):
        server.push(1, torch.full((3,), seq + 1.0), server.version, seq=seq, loss=0, time_s=0)
    server.push(2, torch.ones(3), 1, seq=0, loss=0, time_s=0)
    path = server.save(tmp_path / "ckpt.pt")
    fresh = ParameterServer(torch.zeros(3), lr=0.1, policy=policy, workers=[1, 2])
    fresh.load(path)
    assert_equal(fresh.params, server.params, bitwise=True)
    assert fresh.momentum_buf is not None and server.momentum_buf is not None
    assert_equal(fresh.momentum_buf, server.momentum_buf, bitwise=True)
    assert (fresh.version, fresh.clocks, fresh.last_seq) == (4, {1: 3, 2: 1}, {1: 2, 2: 0})
    # the next update is the same on both
    a = server.push(2, torch.ones(3), 4, seq=1, loss=0, time_s=0)
    b = fresh.push(2, torch.ones(3), 4, seq=1, loss=0, time_s=0)
    assert a == b
    assert_equal(fresh.params, server.params, bitwise=True)


def test_resuming_a_checkpoint_of_another_model_or_worker_set_fails_clearly(tmp_path):
    server = ParameterServer(torch.zeros(3), lr=0.1, policy=make_policy(), workers=[1, 2])
    path = server.save(tmp_path / "ckpt.pt")
    other = ParameterServer(torch.zeros(4), lr=0.1, policy=make_policy(), workers=[1, 2])
    with pytest.raises(ValueError, match=r"checkpoint parameters are \(3,\).*same problem"):
        other.load(path)
    other = ParameterServer(torch.zeros(3), lr=0.1, policy=make_policy(), workers=[1, 2, 3])
    with pytest.raises(ValueError, match="same number of workers"):
        other.load(path)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        other.load(tmp_path / "missing.pt")
    torch.save({"format": "something else"}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="not a parameter-server checkpoint"):
        other.load(tmp_path / "bad.pt")
    assert other.version == 0
    assert_equal(other.params, torch.zeros(3), bitwise=True)


def test_a_simulated_run_replays_from_its_seed_and_another_seed_differs():
    def run(seed):
        config = SimConfig(
            policy=make_policy(),
            problem=SMALL,
            speeds=speed_profile(3, stragglers=1),
            updates=40,
            seed=seed,
        )
        return simulate(config)

    a, b, c = run(5), run(5), run(6)
    assert a.log == b.log
    assert_equal(a.params, b.params, bitwise=True)
    assert [r.time_s for r in a.log] != [r.time_s for r in c.log]


def test_a_simulated_worker_that_dies_is_reported_and_the_others_finish():
    speeds = speed_profile(3, dies=1, dies_at_ms=50.0)
    config = SimConfig(
        policy=make_policy(bound="ssp", s_max=1),
        problem=SMALL,
        speeds=speeds,
        updates=60,
        dead_after_ms=30.0,
    )
    result = simulate(config)
    assert result.counts == {"applied": 60}
    [death] = result.deaths
    assert death.worker == 1
    # declared at death + heartbeat timeout (simulated seconds), not before
    assert death.time_s == pytest.approx(0.080, abs=1e-12)
    assert all(r.worker != 1 or r.time_s <= 0.050 for r in result.log)


def test_a_stalled_worker_pushes_a_very_stale_gradient_after_its_stall():
    speeds = (WorkerSpeed(jitter=0.0),) * 2 + (WorkerSpeed(jitter=0.0, stalls=((15.0, 100.0),)),)
    config = SimConfig(policy=make_policy(), problem=SMALL, speeds=speeds, updates=40)
    result = simulate(config)
    stale = [r.staleness for r in result.log if r.worker == 2]
    # 100 ms stalled while two 10 ms workers push ~20 updates
    assert max(stale) >= 15
