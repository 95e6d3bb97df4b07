"""Staleness policies: the worked numbers exactly, the momentum formula, and every bad input."""

from __future__ import annotations

import math

import pytest
import torch

from harness import assert_equal
from reference_impls.async_sgd import (
    AlphaOverS,
    Bound,
    ParameterServer,
    PolicyError,
    StalenessPolicy,
    corrected_momentum,
    inverse,
    make_policy,
)


def test_inverse_factor_halves_the_step_at_s1_and_takes_one_eleventh_at_s10():
    # Exact: 1/(1+s) for these s is a single correctly rounded float division.
    assert inverse(0) == 1.0
    assert inverse(1) == 0.5
    assert inverse(10) == 1.0 / 11.0
    assert make_policy("inverse").factor(10) == 1.0 / 11.0
    assert round(inverse(10), 4) == 0.0909  # the "about 9%" of the nominal step


def test_alpha_over_s_divides_by_staleness_and_takes_the_full_step_when_fresh():
    policy = make_policy("alpha-over-s", alpha=2.0)
    assert policy.factor(0) == 1.0
    assert policy.factor(1) == 2.0
    assert policy.factor(8) == 0.25
    assert AlphaOverS()(4) == 0.25


def test_any_callable_is_a_policy():
    policy = make_policy(lambda s: 0.9**s)
    assert policy.factor(2) == 0.9**2
    assert policy.lr_name == "<lambda>"


def test_momentum_correction_subtracts_the_implicit_momentum_of_n_workers():
    # Mitliagkas et al.: implicit momentum 1 - 1/N; mu = 0.9 with 4 workers -> 0.9 - 0.75.
    assert corrected_momentum(0.9, 4) == pytest.approx(0.15, abs=1e-15)
    assert corrected_momentum(0.9, 1) == 0.9  # one worker: no asynchrony, nothing removed
    assert corrected_momentum(0.5, 10) == 0.0  # clamped at the floor
    assert corrected_momentum(0.5, 10, floor=-0.5) == pytest.approx(-0.4, abs=1e-15)
    policy = make_policy("constant", momentum=0.9, momentum_correction=True)
    assert policy.explicit_momentum(mean_staleness=3.0) == pytest.approx(0.15, abs=1e-15)
    assert make_policy("constant", momentum=0.9).explicit_momentum(3.0) == 0.9


def test_ssp_gate_blocks_a_worker_more_than_s_max_clocks_ahead():
    policy = make_policy(bound="ssp", s_max=2)
    assert policy.may_start(clock=5, slowest_clock=3)
    assert not policy.may_start(clock=6, slowest_clock=3)
    assert make_policy().may_start(clock=100, slowest_clock=0)


def test_reject_admits_up_to_s_max_only():
    policy = make_policy(bound="reject", s_max=3)
    assert policy.admits(3) and not policy.admits(4)
    assert policy.max_staleness(workers=8) == 3
    assert make_policy(bound="ssp", s_max=1).max_staleness(workers=4) == 9  # (N-1)(2s+1)


@pytest.mark.parametrize("s_max", [-1, -10])
def test_negative_s_max_is_rejected_with_the_value_named(s_max):
    for bound in ("ssp", "reject"):
        with pytest.raises(PolicyError, match=rf"s_max must be an int >= 0.*got {s_max}"):
            make_policy(bound=bound, s_max=s_max)


def test_bound_without_s_max_and_s_max_without_bound_are_errors():
    with pytest.raises(PolicyError, match="needs s_max"):
        make_policy(bound="ssp")
    with pytest.raises(PolicyError, match="without a bound"):
        make_policy(s_max=3)
    with pytest.raises(PolicyError, match="unknown bound 'sometimes'"):
        make_policy(bound="sometimes")
    with pytest.raises(PolicyError, match="unknown lr policy 'fast'"):
        make_policy("fast")
    with pytest.raises(PolicyError, match="momentum must be in"):
        make_policy(momentum=1.0)
    with pytest.raises(PolicyError, match="alpha must be a finite number > 0"):
        AlphaOverS(alpha=0.0)


@pytest.mark.parametrize(
    "bad", [-0.5, math.nan, math.inf, -math.inf, "0.5"], ids=["neg", "nan", "inf", "-inf", "str"]
)
def test_a_bad_factor_raises_and_the_server_applies_nothing(bad):
    policy = StalenessPolicy(lr_factor=lambda s: bad, lr_name="broken")
    params = torch.arange(5, dtype=torch.float32)
    server = ParameterServer(params, lr=0.1, policy=policy, workers=[0])
    before = server.state_dict()
    with pytest.raises(PolicyError, match=r"lr policy 'broken' returned .* at s=0"):
        server.push(0, torch.ones(5), 0, seq=0, loss=1.0, time_s=0.0)
    after = server.state_dict()
    assert_equal(after["params"], before["params"], bitwise=True)
    assert (after["version"], after["clocks"], server.log) == (0, {0: 0}, [])


def test_bound_values_are_the_strings_written_to_json():
    assert [b.value for b in Bound] == ["none", "ssp", "reject"]
    assert make_policy(bound="reject", s_max=2).describe()["bound"] == "reject"
