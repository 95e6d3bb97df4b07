"""Every policy converges with a straggler; the analysis finds staleness hurting where it does.

Simulated runs (deterministic, seeded) of the convex logistic regression, 4 workers of which
one is 3x slower.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from reference_impls.async_sgd import (
    Problem,
    ProblemConfig,
    SimConfig,
    WorkerSpeed,
    make_policy,
    simulate,
    speed_profile,
)
from reference_impls.async_sgd.__main__ import main
from reference_impls.async_sgd.analysis import analyze_windows, window_stats

PROBLEM = ProblemConfig(samples=1024, dim=16, batch_size=16, seed=0)
UPDATES = 400
LR = 0.2


@pytest.fixture(scope="module")
def problem() -> Problem:
    return Problem(PROBLEM)


@pytest.fixture(scope="module")
def tolerance(problem) -> float:
    """Constant-step SGD with minibatches of 16 does not reach the optimum: it stays in a noise
    ball whose size grows with the step. The tolerance is 10% of the initial gap; one
    synchronous worker (no staleness at all) with the same step must be inside it, and the
    initial parameters must be outside it, or the bound would say nothing."""
    _, best = problem.optimum()
    tol = 0.1 * (problem.full_loss(problem.init_params) - best)
    sync = simulate(
        SimConfig(
            policy=make_policy("constant"),
            problem=PROBLEM,
            speeds=(WorkerSpeed(),),
            updates=UPDATES,
            lr=LR,
            eval_every=0,
        ),
        problem,
    )
    assert problem.full_loss(sync.params) - best < tol / 2
    return tol


POLICIES = {
    "inverse": {"lr": "inverse"},
    "alpha-over-s": {"lr": "alpha-over-s", "alpha": 2.0},
    "constant": {"lr": "constant"},
    "inverse+ssp": {"lr": "inverse", "bound": "ssp", "s_max": 2},
    "inverse+reject": {"lr": "inverse", "bound": "reject", "s_max": 4},
    "constant+ssp": {"lr": "constant", "bound": "ssp", "s_max": 1},
    "constant+reject": {"lr": "constant", "bound": "reject", "s_max": 3},
    "momentum-corrected": {"lr": "inverse", "momentum": 0.9, "momentum_correction": True},
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_converges_with_a_straggler(name, problem, tolerance):
    config = SimConfig(
        policy=make_policy(**POLICIES[name]),
        problem=PROBLEM,
        speeds=speed_profile(4, stragglers=1, slowdown=3.0),
        updates=UPDATES,
        lr=LR,
        eval_every=0,
        seed=1,
    )
    result = simulate(config, problem)
    _, best = problem.optimum()
    gap = problem.full_loss(result.params) - best
    assert gap < tolerance, f"{name}: loss {gap:.4f} above the optimum, tolerance {tolerance:.4f}"
    slow = [r.staleness for r in result.log if r.worker == 3]
    assert slow and max(slow) >= 3  # the straggler really was stale


# The run built to show the effect: 8 workers, 6 of which stall for 100 ms every 200 ms, so
# the staleness swings between "2 workers busy" and "8 busy plus returning stale gradients";
# constant learning rate (no damping), a large step. The control: the same without stalls.
BUILT = [
    "--workers",
    "8",
    "--stragglers",
    "6",
    "--slowdown",
    "1",
    "--stall-every-ms",
    "200",
    "--stall-ms",
    "100",
    "--policy",
    "constant",
    "--lr",
    "1.0",
    "--updates",
    "600",
    "--seed",
    "0",
]


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "run"
    assert main(["simulate", *BUILT, "--out", str(out), "--control"]) == 0
    assert main(["analyze", str(out), "--control", str(out / "control")]) == 0
    return out


def test_the_analysis_finds_the_correlation_in_the_run_built_to_have_it(analyzed):
    result = json.loads((analyzed / "analysis.json").read_text())
    assert result["loss_source"] == "server full-data loss"
    assert result["staleness_contrast"] >= 1.5
    assert result["staleness_vs_slowdown"]["found"]
    assert result["staleness_vs_slowdown"]["low"] > 0


def test_the_analysis_finds_nothing_in_the_control(analyzed):
    result = json.loads((analyzed / "control" / "analysis.json").read_text())
    assert not result["found"]
    assert result["staleness_contrast"] < 1.5  # every window about equally stale
    # "not found" above is guaranteed by the contrast gate alone; the correlation itself must
    # be absent too, or the gate would be hiding an analysis that finds staleness in noise.
    for key in ("staleness_vs_slowdown", "staleness_vs_spread"):
        assert result[key]["low"] <= 0, (key, result[key])


def test_shuffling_staleness_across_windows_destroys_the_finding(analyzed):
    # The same losses with the staleness of other windows: the correlation must go, or the
    # "found" above could come from the losses alone.
    from reference_impls.async_sgd.runlog import read_log

    ws = window_stats(read_log(analyzed), 20)
    assert analyze_windows(ws)["staleness_vs_slowdown"]["found"]
    # One lucky permutation proves little; over 40 seeded permutations (staleness paired with
    # random windows' losses, contrast unchanged) a finding is a false positive. Each of the two
    # statistics is declared when its 95% interval lies above 0, about 2.5% each by chance:
    # ~2 of 40 expected (3 measured). 6 allows for the bootstrap's indicative intervals over
    # dependent windows; an analysis that finds staleness in noise finds it far more often.
    found = 0
    for seed in range(40):
        shuffled = dataclasses.replace(
            ws, mean_staleness=np.random.default_rng(seed).permutation(ws.mean_staleness)
        )
        found += analyze_windows(shuffled, resamples=1000)["found"]
    assert found <= 6, f"{found} of 40 shuffled runs 'found' a correlation"


def test_the_plots_are_written_as_png(analyzed):
    for name in ("staleness_hist.png", "loss_vs_time.png"):
        data = (analyzed / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_analyze_without_a_run_directory_says_what_to_pass(tmp_path, capsys):
    assert main(["analyze", str(tmp_path)]) == 2
    assert "has no staleness.jsonl: pass a directory written by 'train' or 'simulate'" in (
        capsys.readouterr().err
    )


def test_a_negative_s_max_on_the_command_line_is_an_error(tmp_path, capsys):
    rc = main(["simulate", "--bound", "ssp", "--s-max", "-1", "--out", str(tmp_path / "x")])
    assert rc == 2
    assert "s_max must be an int >= 0" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
