"""Bounded staleness holds over random worker speed profiles (stragglers, stalls, deaths).

Each property is a plain checker run under ``@given`` twice: on the real policy, where it
must hold, and on a deliberately broken one, where hypothesis must find a counterexample (a
property no broken policy can fail proves nothing).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from reference_impls.async_sgd import (
    Bound,
    Problem,
    ProblemConfig,
    SimConfig,
    StalenessPolicy,
    UpdateStatus,
    WorkerSpeed,
    make_policy,
    simulate,
)

# The smallest problem: the properties are about scheduling, the gradients only have to be real.
TINY = ProblemConfig(samples=32, dim=2, batch_size=2, seed=0)
_PROBLEM = Problem(TINY)
UPDATES = 40

speeds = st.builds(
    WorkerSpeed,
    mean_ms=st.floats(1.0, 20.0),
    jitter=st.floats(0.0, 1.0),
    slowdown=st.floats(1.0, 10.0),
    stalls=st.lists(st.tuples(st.floats(0.0, 200.0), st.floats(1.0, 100.0)), max_size=2).map(tuple),
    dies_at_ms=st.none() | st.floats(0.0, 300.0),
)
profiles = st.lists(speeds, min_size=1, max_size=6).filter(
    lambda p: any(s.dies_at_ms is None for s in p)  # someone must be left to finish the run
)
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(policy: StalenessPolicy, profile, seed: int):
    config = SimConfig(
        policy=policy,
        problem=TINY,
        speeds=tuple(profile),
        updates=UPDATES,
        seed=seed,
        dead_after_ms=20.0,
        eval_every=0,
    )
    return simulate(config, _PROBLEM)


def check_reject_bound(policy: StalenessPolicy, profile, seed: int) -> None:
    result = run(policy, profile, seed)
    s_max = 2 if policy.s_max is None else policy.s_max
    applied = [r for r in result.log if r.status is UpdateStatus.APPLIED]
    assert all(r.staleness <= s_max for r in applied), [r.staleness for r in applied]
    rejected = [r for r in result.log if r.status is UpdateStatus.REJECTED_STALE]
    assert all(r.staleness > s_max for r in rejected)


def check_ssp_bound(policy: StalenessPolicy, profile, seed: int) -> None:
    result = run(policy, profile, seed)
    s_max = 1 if policy.s_max is None else policy.s_max
    # no step starts more than s_max clocks ahead of the slowest live worker ...
    assert all(clock - slowest <= s_max for _, _, clock, slowest in result.pulls)
    # ... which bounds the staleness by (N - 1)(2 s_max + 1)
    bound = (len(profile) - 1) * (2 * s_max + 1)
    assert all(r.staleness <= bound for r in result.log), (bound, [r.staleness for r in result.log])


@SETTINGS
@given(profile=profiles, s_max=st.integers(0, 4), seed=st.integers(0, 2**16))
def test_reject_never_applies_an_update_staler_than_s_max(profile, s_max, seed):
    check_reject_bound(make_policy(bound="reject", s_max=s_max), profile, seed)


@SETTINGS
@given(profile=profiles, s_max=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_ssp_never_lets_a_worker_run_more_than_s_max_clocks_ahead(profile, s_max, seed):
    check_ssp_bound(make_policy(bound="ssp", s_max=s_max), profile, seed)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Unbounded(StalenessPolicy):
    """Claims a bound but enforces none: the checkers must catch it."""

    def admits(self, s: int) -> bool:
        return True

    def may_start(self, clock: int, slowest_clock: int) -> bool:
        return True


@pytest.mark.parametrize(
    ("checker", "bound", "s_max"),
    [(check_reject_bound, Bound.REJECT, 2), (check_ssp_bound, Bound.SSP, 1)],
    ids=["reject", "ssp"],
)
def test_the_checkers_catch_a_policy_that_does_not_enforce_its_bound(checker, bound, s_max):
    broken = _Unbounded(bound=bound, s_max=s_max)

    # No shrinking: the first counterexample is enough, and shrinking would rerun many sims.
    @settings(max_examples=50, deadline=None, database=None, phases=[Phase.generate])
    @given(profile=profiles, seed=st.integers(0, 2**16))
    def prop(profile, seed):
        checker(broken, profile, seed)

    with pytest.raises(AssertionError):
        prop()
