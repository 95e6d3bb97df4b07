"""The real parameter server: gloo processes (1 server + 3 workers, or 1 + 1), killed workers,
wrong-shaped pushes, checkpoint and resume.

The processes are started by the collectives launcher (TCPStore rendezvous on a free port),
not torchrun: torchrun's agent ends every local process when one fails, and here a worker
is SIGKILLed on purpose. The models are tiny (17 parameters) and the runs short, because
the CI machine has 2 cores for 4 processes.
"""

from __future__ import annotations

import collections
import json

import pytest
import torch
from torch.nn.utils import parameters_to_vector

from harness import assert_equal
from reference_impls.async_sgd import Problem, ProblemConfig, UpdateStatus, make_policy
from reference_impls.async_sgd.distributed import ServerReport, TrainConfig, run_rank
from reference_impls.async_sgd.runlog import read_log, read_summary
from reference_impls.collectives import LaunchConfig, LaunchError, launch

PROBLEM = ProblemConfig(samples=256, dim=16, batch_size=8, seed=1)
KILLED, KILL_AT = 3, 2  # worker rank 3 SIGKILLs itself instead of sending its push 2
BAD, BAD_AT = 1, 1  # worker rank 1's push 1 carries 3 extra elements
UPDATES = 40


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ps") / "run"
    config = TrainConfig(
        policy=make_policy("inverse"),
        problem=PROBLEM,
        lr=0.2,
        updates=UPDATES,
        out_dir=str(out),
        checkpoint_every=10,
        kill=(KILLED, KILL_AT),
        bad_push=(BAD, BAD_AT),
        # Generous: a live worker's heartbeat thread must never look dead on a loaded machine.
        dead_after_s=3.0,
    )
    with pytest.raises(LaunchError) as info:
        launch(run_rank, config, config=LaunchConfig(world_size=4, timeout_s=180, grace_s=120))
    err = info.value
    assert set(err.failures) == {KILLED}, str(err)
    assert err.failures[KILLED].exitcode == -9  # SIGKILL, as injected
    return out, err.results


def test_a_killed_worker_does_not_stop_the_server_and_is_named_in_the_report(faulty_run):
    out, results = faulty_run
    server: ServerReport = results[0]
    assert server.version == UPDATES and server.stop_reason == "reached the number of updates"
    [death] = server.deaths
    assert death["worker"] == KILLED
    assert death["last_seq"] == KILL_AT - 1  # its last handled push
    assert "no heartbeat" in death["reason"] and death["time_s"] > 0
    assert read_summary(out)["deaths"] == server.deaths


def test_no_update_is_lost_or_applied_twice(faulty_run):
    out, results = faulty_run
    log = read_log(out)
    keys = [(r.worker, r.seq) for r in log]
    assert len(keys) == len(set(keys)), "a push was handled twice"
    applied = [r for r in log if r.status is UpdateStatus.APPLIED]
    assert [r.version for r in applied] == list(range(1, UPDATES + 1))
    by_worker = collections.defaultdict(collections.Counter)
    for r in log:
        by_worker[r.worker][r.status.value] += 1
    for rank in (1, 2):  # the survivors: every push they sent was answered exactly once
        worker = results[rank]
        assert sorted(r.seq for r in log if r.worker == rank) == list(range(worker.pushes))
        assert dict(by_worker[rank]) == worker.statuses == results[0].per_worker[rank]
    assert sorted(r.seq for r in log if r.worker == KILLED) == list(range(KILL_AT))
    assert sum(c["applied"] for c in by_worker.values()) == UPDATES


def test_a_wrong_shaped_gradient_is_rejected_with_a_clear_error_and_not_applied(faulty_run):
    out, results = faulty_run
    log = read_log(out)
    [bad] = [r for r in log if r.status is UpdateStatus.REJECTED_BAD]
    assert (bad.worker, bad.seq) == (BAD, BAD_AT)
    assert bad.detail == f"worker {BAD} pushed a gradient of 20 elements; the model has 17"
    before = log[log.index(bad) - 1]
    assert bad.version == before.version  # the version did not move
    assert results[BAD].errors == [
        f"server rejected push {BAD_AT}: expected a flat gradient of 17 elements "
        "(nothing was applied)"
    ]
    assert results[BAD].pushes > BAD_AT + 1  # and the worker went on


def sgd_reference(steps: int, lr: float, momentum: float) -> torch.Tensor:
    problem = Problem(PROBLEM)
    module = problem.build_module()
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=momentum)
    for k in range(steps):
        opt.zero_grad()
        problem.loss_fn(module, problem.batch_indices(0, 1, k)).backward()
        opt.step()
    return parameters_to_vector(module.parameters()).detach()


def test_one_worker_equals_sgd_and_resume_continues_parameters_and_versions(tmp_path):
    policy = make_policy("inverse", momentum=0.9)
    first = TrainConfig(
        policy=policy, problem=PROBLEM, lr=0.1, updates=20, out_dir=str(tmp_path / "a")
    )
    a = launch(run_rank, first, config=LaunchConfig(world_size=2, timeout_s=120))[0]
    # s = 0 throughout, so the server's update is torch.optim.SGD's, bit for bit
    assert {r.staleness for r in read_log(tmp_path / "a")} == {0}
    assert_equal(torch.from_numpy(a.params), sgd_reference(20, 0.1, 0.9), bitwise=True)

    second = TrainConfig(
        policy=policy,
        problem=PROBLEM,
        lr=0.1,
        updates=40,
        out_dir=str(tmp_path / "b"),
        resume=a.checkpoint,
    )
    b = launch(run_rank, second, config=LaunchConfig(world_size=2, timeout_s=120))[0]
    assert (b.start_version, b.version) == (20, 40)
    log = read_log(tmp_path / "b")
    assert [r.version for r in log if r.status is UpdateStatus.APPLIED] == list(range(21, 41))
    # parameters, momentum buffer and the worker's data position all survived the restart:
    # 20 + 20 equals 40 uninterrupted steps exactly
    assert_equal(torch.from_numpy(b.params), sgd_reference(40, 0.1, 0.9), bitwise=True)
    saved = torch.load(b.checkpoint, weights_only=True)
    assert (saved["version"], saved["clocks"]) == (40, {1: 40})
    assert json.loads((tmp_path / "b" / "run.json").read_text())["start_version"] == 20


def test_ssp_keeps_fast_workers_within_s_max_of_a_straggler(tmp_path):
    # Worker 3 is 3x slower; without the gate the fast ones would push ~3x as often.
    config = TrainConfig(
        policy=make_policy("inverse", bound="ssp", s_max=1),
        problem=PROBLEM,
        lr=0.2,
        updates=30,
        out_dir=str(tmp_path),
        stragglers=(3,),
        slowdown=3.0,
    )
    results = launch(run_rank, config, config=LaunchConfig(world_size=4, timeout_s=120))
    server = results[0]
    assert server.version == 30 and not server.deaths
    pushes = {rank: results[rank].pushes for rank in (1, 2, 3)}
    # a worker may start a step while at most s_max = 1 clocks ahead, so it ends at most
    # s_max + 1 pushes ahead of the slowest
    assert max(pushes.values()) - min(pushes.values()) <= 2, pushes
    bound = make_policy(bound="ssp", s_max=1).max_staleness(workers=3)
    assert max(r.staleness for r in read_log(tmp_path)) <= bound
